#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/gpu_checks.sh: every check that needs a GPU, as one prepared run.
#
#   scripts/gpu_checks.sh [STAGE...]   run the checks (on the machine with the GPU): the
#                                      stages named, in this order, or all of them:
#                                      tests bench bench3 scale
#   scripts/gpu_checks.sh --fetch-deps download the Debian packages the build needs into
#                                      build/gpu-deps/ (on a machine that reaches Debian's
#                                      archive), for a GPU machine that reaches nothing
#
# A device session of about 15 minutes fits two calls on one warm machine (the build stays
# between calls): `gpu_checks.sh tests bench`, then `gpu_checks.sh bench3 scale`.
#
# The run, step by step:
#   1. Name the GPU, its driver and the CUDA toolkit (gpu.txt). No GPU: exit 3, nothing passes.
#   2. Make the build's dependencies findable (doctest, Google Benchmark, nlohmann-json,
#      liburing): those installed are used; the missing ones are unpacked from the .deb files
#      in build/gpu-deps/ (from --fetch-deps, carried to the machine) into
#      build/gpu-deps/root, not into /, or where none were carried, installed with apt-get
#      as scripts/dev does (as root). Ninja is used when present, else Make.
#   3. Configure the cuda preset (build/cuda, or $SPILLWAY_GPU_BUILD_DIR) unless configured,
#      and build only what the checks run.
#   4. tests: the GPU tests (ctest -L gpu: device tier conformance, staged round trips,
#      device Adam against the CPU step, the stash with device tensors, the gpu_offload
#      example's GPU-vs-CPU loss checks, resident and within a budget, the CUDA benchmark's
#      smoke pass). A skipped test fails the run: on a machine with a GPU a skip means the
#      checks did not run (a driver too old for the toolkit, say).
#   5. bench: the CUDA benchmark once (one repetition) to bench_cuda.json, so a short session
#      still gets every row; bench3: again with 3 repetitions (medians) to bench_cuda_r3.json.
#   6. scale: gpu_offload with its weights off the device: an 8 x 8192 MLP resident and in a
#      640 MiB budget (what streaming costs), then 32 x 8192 (2.1 G params) in a 2 GiB budget
#      (gpu_offload_*.json, .txt).
# Results go to <build>/gpu-checks (relative paths in SPILLWAY_GPU_BUILD_DIR are from the
# repository root): summary.txt (what each stage did), gpu.txt, configure.log, build.log,
# ctest.log, junit.xml, bench_cuda*.json and .txt, gpu_offload_*.json and .txt. Where $OUT
# is set, summary.txt, ctest.log and the benchmark JSON are copied there, with everything as
# gpu-checks.tar.gz (a device machine sends back at most 8 files).
# Exit status: 0 when every stage asked for passed (no test skipped); 2 set-up or build
# failed; 3 no GPU; 4 a test was skipped; else the first failing stage's status.
# Environment: SPILLWAY_JOBS (build parallelism, default: the number of cores).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
root=$PWD
deps_dir=$root/build/gpu-deps
# Debian's names (Ubuntu's are the same); the runtime libraries come with their -dev.
dep_packages=(doctest-dev libbenchmark-dev libbenchmark1debian nlohmann-json3-dev liburing-dev liburing2)

if [ "${1:-}" = --fetch-deps ]; then
  mkdir -p "$deps_dir"
  # apt-get download writes into the current folder; as root it warns that _apt cannot.
  (cd "$deps_dir" && apt-get download "${dep_packages[@]}") || { echo "apt-get download failed" >&2; exit 2; }
  ls -l "$deps_dir"/*.deb
  echo "carry build/gpu-deps to the GPU machine; gpu_checks.sh unpacks what it lacks"
  exit 0
fi
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(tests bench bench3 scale)
for st in "${stages[@]}"; do
  case "$st" in
    tests|bench|bench3|scale) ;;
    *) echo "usage: scripts/gpu_checks.sh [--fetch-deps | tests bench bench3 scale]: no stage $st" >&2; exit 2 ;;
  esac
done
wants() { [[ " ${stages[*]} " == *" $1 "* ]]; }

# Absolute from here on: ctest and the benchmark run in other folders.
build=$(realpath -m "${SPILLWAY_GPU_BUILD_DIR:-build/cuda}")
out=$build/gpu-checks  # kept between calls on one machine, like the build
jobs=${SPILLWAY_JOBS:-$(nproc)}
mkdir -p "$out"
# A device machine sends back at most 8 files from $OUT: the summary, the test log, the
# benchmark JSON and everything else as one archive.
# shellcheck disable=SC2317  # run by the EXIT trap
deliver() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  local f
  for f in summary.txt ctest.log bench_cuda.json bench_cuda_r3.json; do
    [ -f "$out/$f" ] && cp "$out/$f" "$OUT/"
  done
  tar -czf "$OUT/gpu-checks.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
}
trap deliver EXIT
log() { printf '[gpu_checks %4ds] %s\n' "$SECONDS" "$*" | tee -a "$out/summary.txt"; }

# 1. The GPU, its driver, the toolkit.
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max \
    --format=csv 2>&1 || echo "nvidia-smi not available"
  nvidia-smi 2>/dev/null | sed -n 3p  # "NVIDIA-SMI ... Driver Version: ... CUDA Version: ..."
  nvcc --version 2>&1 | tail -n 2
} > "$out/gpu.txt"
gpu_line=$(sed -n 2p "$out/gpu.txt")
log "GPU: $gpu_line"
log "driver: $(sed -n 3p "$out/gpu.txt" | tr -s ' ')"
log "toolkit: $(grep -m1 release "$out/gpu.txt" || echo 'nvcc not found')"
if ! nvidia-smi -L > /dev/null 2>&1 || [ -z "$(nvidia-smi -L 2>/dev/null)" ]; then
  log "no GPU found (nvidia-smi -L lists none): nothing can be checked here"
  exit 3
fi

# 2. Dependencies.
missing=()
for p in "${dep_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
prefix_args=()
debs=()
for p in "${missing[@]}"; do
  for f in "$deps_dir/${p}"_*.deb; do [ -f "$f" ] && debs+=("$f"); done
done
if [ ${#missing[@]} -gt 0 ] && [ ${#debs[@]} -eq 0 ]; then
  # Nothing carried: install as scripts/dev does (a GPU machine that reaches nothing fails here).
  if [ "$(id -u)" -eq 0 ] && command -v apt-get > /dev/null; then
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    { timeout 120 apt-get update -qq && apt-get install -y --no-install-recommends "${missing[@]}"; } > "$out/apt.log" 2>&1 &&
      missing=()
  fi
  [ ${#missing[@]} -eq 0 ] || log "missing packages: ${missing[*]} (run scripts/gpu_checks.sh --fetch-deps" \
    "where Debian's archive is reachable and carry build/gpu-deps; configure will name what it lacks)"
elif [ ${#debs[@]} -gt 0 ]; then
  log "unpacking into build/gpu-deps/root: ${debs[*]##*/}"
  rm -rf "$deps_dir/root"
  mkdir -p "$deps_dir/root"
  for f in "${debs[@]}"; do
    if command -v dpkg-deb > /dev/null; then
      dpkg-deb -x "$f" "$deps_dir/root"
    else  # a .deb is an ar archive holding data.tar.*; tar finds the compression in a file
      member=$(ar t "$f" | grep '^data\.tar') && (cd "$deps_dir" && ar x "$f" "$member") &&
        tar -xf "$deps_dir/$member" -C "$deps_dir/root" && rm -f "$deps_dir/$member"
    fi || { log "cannot unpack $f"; exit 2; }
  done
  prefix_args=(-DCMAKE_PREFIX_PATH="$deps_dir/root/usr")
  export CPATH="$deps_dir/root/usr/include${CPATH:+:$CPATH}"
  export LD_LIBRARY_PATH="$deps_dir/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
generator_args=()
command -v ninja > /dev/null || generator_args=(-G "Unix Makefiles")

# 3. Configure (only where no complete configure exists) and build.
if [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
  log "configuring the cuda preset in $build"
  if ! cmake --preset cuda -B "$build" "${generator_args[@]}" "${prefix_args[@]}" > "$out/configure.log" 2>&1; then
    log "configure failed"; tail -50 "$out/configure.log"; exit 2
  fi
fi
targets=(test_cuda_device_tier test_cuda_cuda_path gpu_offload bench_cuda)
log "building ${targets[*]} ($jobs jobs)"
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" > "$out/build.log" 2>&1; then
  log "build failed"; tail -80 "$out/build.log"; exit 2
fi

status=0
fail() { [ "$status" -ne 0 ] || status=$1; }  # keeps the first failing stage's status

# 4. The GPU tests.
if wants tests; then
  log "ctest -L gpu"
  ctest --test-dir "$build" -L gpu --timeout 240 --output-on-failure --output-junit "$out/junit.xml" > "$out/ctest.log" 2>&1
  rc=$?
  tail -40 "$out/ctest.log"
  log "ctest exit status $rc"
  skipped=$(grep -E '\*\*\*Skipped|Not Run' "$out/ctest.log" | sed 's/^ *//')
  if [ -n "$skipped" ]; then
    log "skipped on a machine with a GPU (a failure here):"
    printf '%s\n' "$skipped" | tee -a "$out/summary.txt"
    [ "$rc" -eq 0 ] && rc=4
  fi
  [ "$rc" -eq 0 ] || fail "$rc"
fi

# 5. The benchmark: one repetition first, so a short device session still gets every row.
run_bench() {  # run_bench NAME REPETITIONS
  log "bench_cuda, $2 repetition(s) -> $1.json"
  mkdir -p "$build/bench/scratch"
  SPILLWAY_BENCH_DIR="$build/bench/scratch" "$build/bench/bench_cuda" --benchmark_repetitions="$2" \
    --benchmark_report_aggregates_only="$([ "$2" -gt 1 ] && echo true || echo false)" \
    --benchmark_out="$out/$1.json" --benchmark_out_format=json > "$out/$1.txt" 2>&1
  local rc=$?
  cat "$out/$1.txt"
  log "bench_cuda exit status $rc"
  [ "$rc" -eq 0 ] || fail "$rc"
}
wants bench && run_bench bench_cuda 1
wants bench3 && run_bench bench_cuda_r3 3

# 6. How large a model trains within a device budget.
run_offload() {  # run_offload NAME TIMEOUT_S ARGS...
  local name=$1 limit=$2
  shift 2
  log "gpu_offload $* -> $name.json"
  timeout "$limit" "$build/examples/gpu_offload/gpu_offload" --mode gpu "$@" --report "$out/$name.json" \
    > "$out/$name.txt" 2>&1
  local rc=$?
  tail -25 "$out/$name.txt"
  # Exit 1 after the report is written means the loss did not drop in a short run: a
  # training check, not a failed measurement; the report says which.
  log "gpu_offload exit status $rc$([ "$rc" -eq 124 ] && echo " (stopped at ${limit} s)")"
  if [ "$rc" -gt 1 ] || [ ! -s "$out/$name.json" ]; then
    fail "$([ "$rc" -eq 0 ] && echo 1 || echo "$rc")"
  fi
}
if wants scale; then
  run_offload gpu_offload_resident 240 --steps 4 --layers 8 --hidden 8192
  run_offload gpu_offload_640M 240 --steps 4 --layers 8 --hidden 8192 --device-budget 640M
  run_offload gpu_offload_2G 480 --steps 3 --layers 32 --hidden 8192 --device-budget 2G
fi
log "done: ${stages[*]}: exit status $status"
exit "$status"
