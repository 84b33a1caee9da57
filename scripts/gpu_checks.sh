#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/gpu_checks.sh: every check that needs a GPU, as one prepared run.
#   1. configure and build the cuda preset (build/cuda, or $SPILLWAY_GPU_BUILD_DIR);
#   2. run the GPU tests (ctest -L gpu: device tier conformance, staged round trips, device
#      Adam against the CPU step, the stash with device tensors, the gpu_offload example's
#      GPU-vs-CPU loss check, the CUDA benchmark's smoke pass);
#   3. run the CUDA benchmark (bench_cuda, 3 repetitions, medians) to JSON.
# Results go under $OUT when it is set (else build/gpu-checks; relative paths, here and in
# SPILLWAY_GPU_BUILD_DIR, are from the repository root): gpu.txt (nvidia-smi),
# ctest.log, junit.xml, bench_cuda.json, bench_cuda.txt. Exit status: ctest's, or the
# benchmark's when the tests passed. SPILLWAY_JOBS sets the build parallelism; SKIP_BENCH=1
# skips step 3.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
# Absolute from here on: ctest and the benchmark run in other folders, and "$PWD/$out" broke
# an absolute $OUT (junit.xml went to $PWD$OUT/).
out=$(realpath -m "${OUT:-build/gpu-checks}")
build=$(realpath -m "${SPILLWAY_GPU_BUILD_DIR:-build/cuda}")
jobs=${SPILLWAY_JOBS:-$(nproc)}
mkdir -p "$out"
log() { printf '[gpu_checks] %s\n' "$*" | tee -a "$out/summary.txt"; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current \
    --format=csv 2>&1 || echo "nvidia-smi not available"; } > "$out/gpu.txt"
log "GPU: $(sed -n 2p "$out/gpu.txt")"

# build.ninja, not CMakeCache.txt: a failed or interrupted configure leaves the cache only.
if [ ! -f "$build/build.ninja" ]; then
  cmake --preset cuda -B "$build" > "$out/configure.log" 2>&1 || { log "configure failed"; tail -50 "$out/configure.log"; exit 2; }
fi
# Only what the GPU checks run (the whole preset would spend device time on the CPU parts).
targets=(test_cuda_device_tier test_cuda_cuda_path gpu_offload bench_cuda)
log "building ${targets[*]} in $build ($jobs jobs)"
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" > "$out/build.log" 2>&1; then
  log "build failed"; tail -80 "$out/build.log"; exit 2
fi

log "ctest -L gpu"
ctest --test-dir "$build" -L gpu --output-on-failure --output-junit "$out/junit.xml" > "$out/ctest.log" 2>&1
test_rc=$?
tail -30 "$out/ctest.log"
log "ctest exit status $test_rc"

bench_rc=0
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  log "bench_cuda"
  mkdir -p "$build/bench/scratch"
  SPILLWAY_BENCH_DIR="$build/bench/scratch" "$build/bench/bench_cuda" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_out="$out/bench_cuda.json" --benchmark_out_format=json \
    > "$out/bench_cuda.txt" 2>&1
  bench_rc=$?
  cat "$out/bench_cuda.txt"
  log "bench_cuda exit status $bench_rc"
fi
[ "$test_rc" -ne 0 ] && exit "$test_rc"
exit "$bench_rc"
