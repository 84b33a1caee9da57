#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/gpu_checks.sh: every check that needs a GPU, built here and run there.
#
#   scripts/gpu_checks.sh --bundle [DIR]       on any machine with nvcc (no GPU needed): build
#                                              the GPU tests, the CUDA benchmark and the
#                                              gpu_offload example into DIR (default
#                                              build/gpu-bundle), check that it loads
#   scripts/gpu_checks.sh --run DIR [STAGE...] on the machine with the GPU: run the bundle's
#                                              stages named, in this order, or all of them:
#                                              tests bench bench3 scale
#
# A device call only runs: nothing is configured or compiled there. Carry the bundle with the
# call (carry: ["build/gpu-bundle"]) and run `scripts/gpu_checks.sh --run build/gpu-bundle`.
#
# --bundle, step by step:
#   1. Configure the cuda preset with the CUDA runtime linked statically
#      (SPILLWAY_CUDA_STATIC_RUNTIME=ON) in $SPILLWAY_GPU_BUILD_DIR (default
#      build/cuda-bundle) unless it is configured, and build the bundle's targets
#      ($SPILLWAY_GPU_BUNDLE_TARGETS, default: every target of the table below).
#   2. Copy them, without debug sections, into DIR/bin; write DIR/tests.txt (the GPU tests,
#      as ctest -L gpu runs them) and DIR/manifest.txt (commit, sizes, libraries).
#   3. ldd every binary. Allowed, found on the device machine: glibc, libstdc++ and libgcc_s,
#      the driver (libcuda), the toolkit's cuBLAS (libcublas, libcublasLt; found there
#      through the toolkit's library folder). Any other library is copied into DIR/lib
#      (liburing, Google Benchmark) and the binaries run with it first on the search path.
#      A library that is not found here fails the bundle.
#   4. The bundle must stay under 64 MiB (what a device call may carry).
# --run, step by step:
#   1. Name the GPU, its driver and the toolkit (summary.txt). No GPU (nvidia-smi -L lists
#      none): exit 3, nothing passes.
#   2. Check that every binary loads (ldd on the device: DIR/lib, then the toolkit's
#      library folder for cuBLAS, with a message naming what is missing).
#   3. tests: each line of DIR/tests.txt; a skip (exit 77) fails the run, since on a machine
#      with a GPU a skip means the checks did not run, and so does a benchmark row that
#      reports "ERROR OCCURRED" (the benchmark's exit status may still be 0). bench: the CUDA benchmark once (one
#      repetition, bench_cuda.json); bench3: three repetitions (bench_cuda_r3.json). scale:
#      gpu_offload with its weights off the device (8 x 8192 resident and in 640 MiB, then
#      32 x 8192, 2.1 G params, in 2 GiB), reports in scale.log.
#   Results are written as each step ends, straight into $OUT when it is set (else
#   DIR/results): summary.txt (what each step did, its exit status, the GPU), tests.log,
#   bench.log, bench_cuda.json, bench_cuda_r3.json, scale.log. A call killed outright still
#   returns what the finished steps wrote.
#   The script keeps its own time limit, $SPILLWAY_GPU_LIMIT_S seconds (default 540, below a
#   device call's 600): the step in progress is stopped (TERM, then KILL after 5 s) when it
#   runs out, the rest are not started, and the summary says so. TERM or INT sent to the
#   script does the same at once.
# Exit status (the script's own values; a step's own exit status, such as an example's 2 or
# 77, is written to summary.txt and never returned as such):
#   0  every step asked for passed        12 a test failed
#   3  no GPU                             13 the benchmark failed
#   4  a test was skipped                 14 gpu_offload failed
#   10 set-up: no bundle, a bad argument, 15 the script's time limit stopped a step
#      a build that failed, a binary that 16 stopped by TERM or INT
#      does not load                      
#   11 the bundle is over 64 MiB or needs a library that cannot be carried
# Several failures: the first one's status.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 10
root=$PWD
usage="usage: scripts/gpu_checks.sh --bundle [DIR] | --run DIR [tests bench bench3 scale]"

# The bundle's contents: target | ctest name | arguments | environment (KEY=VALUE,...).
# A target without a ctest name is bundled for the bench and scale steps only.
# test_cuda_cuda_strict_emulated is no GPU test: the CI dry run bundles it alone.
bundle_table=$(
  cat << 'EOF'
test_cuda_device_tier|cuda.device_tier||
test_cuda_cuda_path|cuda.cuda_path||
gpu_offload|examples.gpu_offload|--steps 20 --mode both|
gpu_offload|examples.gpu_offload_budget|--steps 10 --mode both --layers 6 --hidden 256 --in 64 --out 16 --batch 16 --device-budget 800K|
bench_cuda|bench_smoke.bench_cuda|--benchmark_min_time=0.01 --benchmark_repetitions=1|SPILLWAY_BENCH_SMOKE=1
test_cuda_cuda_strict_emulated|cuda.cuda_strict_emulated||
EOF
)
default_targets="test_cuda_device_tier test_cuda_cuda_path gpu_offload bench_cuda"
allowed_libs='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so|libcublas\.so|libcublasLt\.so)'
max_bundle_bytes=$((64 << 20))

# The toolkit's library folder (for cuBLAS), here and on the device machine.
toolkit_libdir() {
  local nvcc_path
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [ -n "$d" ] && [ -d "$d/lib64" ] && { echo "$d/lib64"; return; }
  done
  nvcc_path=$(command -v nvcc) && [ -d "$(dirname "$nvcc_path")/../lib64" ] &&
    { realpath "$(dirname "$nvcc_path")/../lib64"; return; }
  echo ""
}

# ---- --bundle ---------------------------------------------------------------------------
make_bundle() {
  local dir build targets t bin lib name path bytes status=0
  dir=$(realpath -m "${1:-build/gpu-bundle}")
  build=$(realpath -m "${SPILLWAY_GPU_BUILD_DIR:-build/cuda-bundle}")
  read -r -a targets <<< "${SPILLWAY_GPU_BUNDLE_TARGETS:-$default_targets}"
  echo "[bundle] targets: ${targets[*]} from $build"
  if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
    echo "[bundle] configuring the cuda preset in $build (CUDA runtime linked statically)"
    cmake --preset cuda -B "$build" -DSPILLWAY_CUDA_STATIC_RUNTIME=ON -DCMAKE_CUDA_RUNTIME_LIBRARY=Static \
      > "$build.configure.log" 2>&1 || { tail -40 "$build.configure.log"; echo "[bundle] configure failed"; return 10; }
  fi
  if ! cmake --build "$build" -j "${SPILLWAY_JOBS:-$(nproc)}" --target "${targets[@]}" > "$build.bundle-build.log" 2>&1; then
    tail -60 "$build.bundle-build.log"
    echo "[bundle] build failed (log: $build.bundle-build.log)"
    return 10
  fi
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib"
  : > "$dir/tests.txt"
  for t in "${targets[@]}"; do
    bin=$(find "$build" -type f -name "$t" -perm -u+x -not -path '*/CMakeFiles/*' | head -n 1)
    [ -n "$bin" ] || { echo "[bundle] no binary for target $t under $build"; return 10; }
    cp "$bin" "$dir/bin/$t"
    strip --strip-debug "$dir/bin/$t" 2> /dev/null || true
    printf '%s\n' "$bundle_table" | awk -F'|' -v t="$t" '$1 == t && $2 != ""' >> "$dir/tests.txt"
  done
  {
    echo "spillway GPU bundle: commit $(git -C "$root" rev-parse --short HEAD 2> /dev/null || echo unknown)," \
      "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(nvcc --version 2> /dev/null | grep -m1 release)"
    echo "binaries:"
  } > "$dir/manifest.txt"
  # 3. Libraries: allowed ones stay, the others are carried, a missing one fails.
  for t in "${targets[@]}"; do
    while read -r name _ path _; do
      [ -n "$name" ] || continue
      name=$(basename "$name")
      if [[ "$name" =~ $allowed_libs ]]; then continue; fi
      if [ "$path" = "not" ] || [ ! -f "$path" ]; then
        echo "[bundle] $t needs $name, which is not found here"
        status=11
        continue
      fi
      [ -f "$dir/lib/$name" ] || cp -L "$path" "$dir/lib/$name"
    done < <(ldd "$dir/bin/$t" | awk '/=>/ {print $1, $2, $3} !/=>/ {print $1, "=>", $1}')
    echo "  $t $(stat -c %s "$dir/bin/$t") bytes" >> "$dir/manifest.txt"
  done
  {
    echo "carried libraries (DIR/lib):"
    for lib in "$dir"/lib/*; do [ -f "$lib" ] && echo "  $(basename "$lib") $(stat -c %s "$lib") bytes"; done
    echo "allowed from the device machine: glibc, libstdc++, libgcc_s, the driver, the toolkit's cuBLAS"
    echo "symbol versions needed there: $(objdump -T "$dir"/bin/* "$dir"/lib/* 2> /dev/null |
      grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1), $(objdump -T "$dir"/bin/* "$dir"/lib/* 2> /dev/null |
      grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -n 1)"
  } >> "$dir/manifest.txt"
  bytes=$(du -sb "$dir" | cut -f1)
  echo "size: $bytes bytes (limit $max_bundle_bytes)" >> "$dir/manifest.txt"
  if [ "$bytes" -ge "$max_bundle_bytes" ]; then
    echo "[bundle] $dir has $bytes bytes: over the 64 MiB a device call carries"
    status=11
  fi
  cat "$dir/manifest.txt"
  [ "$status" -eq 0 ] && echo "[bundle] ready: $dir (tests: $(wc -l < "$dir/tests.txt"))"
  return "$status"
}

# ---- --run ------------------------------------------------------------------------------
run_bundle() {
  dir=$(realpath -m "$1")
  shift
  stages=("$@")
  [ ${#stages[@]} -gt 0 ] || stages=(tests bench bench3 scale)
  for st in "${stages[@]}"; do
    case "$st" in
      tests | bench | bench3 | scale) ;;
      *) echo "$usage: no stage $st" >&2; exit 10 ;;
    esac
  done
  [ -f "$dir/tests.txt" ] && [ -d "$dir/bin" ] || { echo "no bundle in $dir (build it with --bundle)" >&2; exit 10; }
  results=${OUT:-$dir/results}
  mkdir -p "$results"
  : > "$results/summary.txt"
  limit=${SPILLWAY_GPU_LIMIT_S:-540}
  deadline=$((SECONDS + limit))
  status=0
  child=""
  current="set-up"
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/spillway-gpu.XXXXXX")
  log "bundle $dir: $(head -n 1 "$dir/manifest.txt" 2> /dev/null); time limit ${limit} s; stages: ${stages[*]}"
  trap on_term TERM INT

  # 1. The GPU, its driver, the toolkit.
  log "GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max \
    --format=csv,noheader 2>&1 | head -n 1)"
  log "toolkit: $(nvcc --version 2> /dev/null | grep -m1 release || echo 'nvcc not found (not needed: the bundle is built)')"
  if [ -z "$(nvidia-smi -L 2> /dev/null)" ]; then
    log "no GPU found (nvidia-smi -L lists none): nothing can be checked here"
    finish 3
  fi

  # 2. Every binary loads.
  local tk missing
  tk=$(toolkit_libdir)
  export LD_LIBRARY_PATH="$dir/lib${tk:+:$tk}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for b in "$dir"/bin/*; do
    missing=$(ldd "$b" 2>&1 | grep 'not found' | sed 's/^[[:space:]]*//' | tr '\n' ' ')
    if [ -n "$missing" ]; then
      if [[ "$missing" == *libcublas* ]]; then
        log "$(basename "$b") needs cuBLAS ($missing), not found in the toolkit's library folder" \
          "(${tk:-none found: set CUDA_HOME to the toolkit}) nor on the loader's path"
      else
        log "$(basename "$b") cannot load: $missing(the manifest names the glibc and libstdc++ versions it needs)"
      fi
      finish 10
    fi
  done
  log "every binary loads (libraries: $dir/lib${tk:+, $tk})"

  # 3. The stages.
  if wants tests; then
    local name target args env
    while IFS='|' read -r target name args env; do
      [ -n "$target" ] || continue
      local before
      before=$(stat -c %s "$results/tests.log" 2> /dev/null || echo 0)
      step "$name" tests.log 240 "$env" "$(bin_of "$target")" $args
      # A benchmark marks a row it could not run "ERROR OCCURRED" and may still exit 0.
      if [ "$step_rc" -eq 0 ] && tail -c +"$((before + 1))" "$results/tests.log" | grep -q 'ERROR OCCURRED'; then
        log "$name: a row reports ERROR OCCURRED (tests.log)"
        step_rc=1
      fi
      case "$step_rc" in
        0) log "$name: passed" ;;
        77) log "$name: SKIPPED on a machine with a GPU (a failure here)"; fail 4 ;;
        *) log "$name: FAILED (exit status $step_rc)"; fail 12 ;;
      esac
    done < "$dir/tests.txt"
  fi
  if wants bench; then run_bench bench_cuda 1; fi
  if wants bench3; then run_bench bench_cuda_r3 3; fi
  if wants scale; then
    run_offload gpu_offload_resident 240 --steps 4 --layers 8 --hidden 8192
    run_offload gpu_offload_640M 240 --steps 4 --layers 8 --hidden 8192 --device-budget 640M
    run_offload gpu_offload_2G 480 --steps 3 --layers 32 --hidden 8192 --device-budget 2G
  fi
  finish "$status"
}

log() { printf '[gpu_checks %4ds] %s\n' "$SECONDS" "$*" | tee -a "$results/summary.txt"; }
wants() { [[ " ${stages[*]} " == *" $1 "* ]]; }
fail() { [ "$status" -ne 0 ] || status=$1; }  # keeps the first failure's status
bin_of() { [[ "$1" == /* ]] && echo "$1" || echo "$dir/bin/$1"; }
finish() {
  rm -rf "$scratch"
  log "done: ${stages[*]}: exit status $1"
  exit "$1"
}
# The script was told to stop: the step in progress is stopped, the summary written.
on_term() {
  [ -n "$child" ] && kill -TERM "$child" 2> /dev/null
  log "stopped by TERM or INT during $current"
  finish 16
}
# step NAME LOG MAX_S ENV CMD ARGS...: runs one step under what is left of the time limit,
# its output appended to LOG in the results; sets step_rc. A step the limit stopped, or one
# there is no time for, ends the run (exit 15) with the summary written.
step() {
  local name=$1 logf=$2 max=$3 env=$4 left
  shift 4
  current=$name
  left=$((deadline - SECONDS))
  if [ "$left" -lt 5 ]; then
    log "time limit (${limit} s) reached: $name and the steps after it not run"
    finish 15
  fi
  [ "$max" -lt "$left" ] || max=$left
  echo "=== $name: $* (at most ${max} s)" >> "$results/$logf"
  (
    cd "$scratch" || exit 10
    mkdir -p tmp bench
    [ -z "$env" ] || export ${env//,/ }
    exec env SPILLWAY_TEST_TMPDIR="$scratch/tmp" SPILLWAY_BENCH_DIR="$scratch/bench" \
      timeout -s TERM -k 5 "$max" "$@"
  ) >> "$results/$logf" 2>&1 &
  child=$!
  wait "$child"
  step_rc=$?
  child=""
  if [ "$step_rc" -eq 124 ] || [ "$step_rc" -eq 137 ]; then
    if [ $((deadline - SECONDS)) -lt 5 ]; then
      log "time limit (${limit} s) reached: $name stopped, the steps after it not run"
      finish 15
    fi
    log "$name: stopped at its own limit of ${max} s"
  fi
}
run_bench() {  # run_bench NAME REPETITIONS
  local before
  before=$(stat -c %s "$results/bench.log" 2> /dev/null || echo 0)
  step "$1" bench.log 300 "" "$dir/bin/bench_cuda" --benchmark_repetitions="$2" \
    --benchmark_report_aggregates_only="$([ "$2" -gt 1 ] && echo true || echo false)" \
    --benchmark_out="$results/$1.json" --benchmark_out_format=json
  log "bench_cuda, $2 repetition(s): exit status $step_rc -> $1.json"
  if tail -c +"$((before + 1))" "$results/bench.log" | grep -q 'ERROR OCCURRED'; then
    log "bench_cuda: a row reports ERROR OCCURRED (bench.log)"
    step_rc=1
  fi
  [ "$step_rc" -eq 0 ] || fail 13
}
run_offload() {  # run_offload NAME MAX_S ARGS...
  local name=$1 max=$2
  shift 2
  step "$name" scale.log "$max" "" "$dir/bin/gpu_offload" --mode gpu "$@" --report "$scratch/$name.json"
  [ -s "$scratch/$name.json" ] && { echo "--- $name.json"; cat "$scratch/$name.json"; } >> "$results/scale.log"
  # Exit 1 with a report written means the loss did not drop in a short run: a training
  # check, not a failed measurement; the report says which.
  log "gpu_offload $*: exit status $step_rc"
  if [ "$step_rc" -gt 1 ] || [ ! -s "$scratch/$name.json" ]; then fail 14; fi
}

case "${1:-}" in
  --bundle) make_bundle "${2:-}"; exit $? ;;
  --run)
    [ -n "${2:-}" ] || { echo "$usage" >&2; exit 10; }
    run_bundle "${@:2}"
    ;;
  *) echo "$usage" >&2; exit 10 ;;
esac
