#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest cuda.gpu_checks_dry_run: scripts/gpu_checks.sh end to end without a GPU, so that a
# device session starts from a bundle known to build and load, and a killed call is known to
# return a summary. The bundle holds the strict-emulation test (the nvcc bundle's build takes
# too long for CI on 2 cores; its libraries are checked by the same code). With a fake
# nvidia-smi:
#  1. --bundle builds and checks it: exit 0, one test listed, the manifest names its size;
#  2. --run tests runs it: exit 0, "cuda.cuda_strict_emulated: passed" in $OUT/summary.txt;
#  3. no GPU (nvidia-smi lists none): exit 3;
#  4. a step's own exit 2 (an example's usage error) is a failed test, exit 12, not set-up;
#     its exit 77 is a skip, exit 4;
#  5. the script's time limit stops a hanging step: exit 15, the summary holds the earlier
#     step and the stop;
#  6. TERM sent to the script: exit 16, the same summary;
#  7. the call killed outright (KILL): the summary written before the kill is there.
# Usage: gpu_checks_dry_run.sh SOURCE_DIR BUILD_DIR
set -u
src=$1
build=$2
work=$build/tests/gpu-checks-dry-run
rm -rf "$work"
mkdir -p "$work/gpu" "$work/nogpu"
failures=0
expect() {  # expect WHAT WANTED_STATUS GOT_STATUS
  if [ "$3" -eq "$2" ]; then echo "ok: $1 (exit status $3)"; else echo "FAILED: $1: exit status $3, wanted $2"; failures=$((failures + 1)); fi
}
has() {  # has WHAT FILE TEXT
  if grep -qF -- "$3" "$2" 2> /dev/null; then echo "ok: $1"; else echo "FAILED: $1: no '$3' in $2"; failures=$((failures + 1)); fi
}
cat > "$work/gpu/nvidia-smi" << 'SMI'
#!/bin/sh
if [ "${1:-}" = -L ]; then echo "GPU 0: Emulated GPU (UUID: GPU-dry-run)"; else echo "Emulated GPU, 81559 MiB, 580.00, 5, 16"; fi
SMI
printf '#!/bin/sh\nexit 9\n' > "$work/nogpu/nvidia-smi"
printf '#!/bin/sh\nexit 2\n' > "$work/exit2.sh"
printf '#!/bin/sh\nexit 77\n' > "$work/exit77.sh"
chmod +x "$work"/gpu/nvidia-smi "$work"/nogpu/nvidia-smi "$work"/exit2.sh "$work"/exit77.sh
checks=$src/scripts/gpu_checks.sh
run() {  # run BUNDLE OUT_NAME [ENV...] -- the rest is the command's prefix
  local bundle=$1 out=$2
  shift 2
  env OUT="$work/$out" PATH="$work/gpu:$PATH" "$@" "$checks" --run "$bundle" tests > "$work/$out.txt" 2>&1
}

# 1.
SPILLWAY_GPU_BUILD_DIR=$build SPILLWAY_GPU_BUNDLE_TARGETS=test_cuda_cuda_strict_emulated \
  "$checks" --bundle "$work/bundle" > "$work/bundle.txt" 2>&1
expect "the bundle is built and checked" 0 $?
has "the bundle lists the emulated test" "$work/bundle/tests.txt" "cuda.cuda_strict_emulated"
has "the manifest gives the size" "$work/bundle/manifest.txt" "size: "
# 2.
run "$work/bundle" out-pass
expect "the bundle runs" 0 $?
has "the test passed" "$work/out-pass/summary.txt" "cuda.cuda_strict_emulated: passed"
has "the GPU is named" "$work/out-pass/summary.txt" "GPU: Emulated GPU"
has "the test's output is in tests.log" "$work/out-pass/tests.log" "Status: SUCCESS"
# 3.
env OUT="$work/out-nogpu" PATH="$work/nogpu:$PATH" "$checks" --run "$work/bundle" tests > "$work/out-nogpu.txt" 2>&1
expect "no GPU" 3 $?
has "no GPU is said" "$work/out-nogpu/summary.txt" "no GPU found"
# 4.
cp -r "$work/bundle" "$work/b2"
printf '%s|example_exit_2||\n' "$work/exit2.sh" > "$work/b2/tests.txt"
run "$work/b2" out-exit2
expect "an example's exit 2 is a failed test" 12 $?
has "its status is in the summary" "$work/out-exit2/summary.txt" "example_exit_2: FAILED (exit status 2)"
printf '%s|example_exit_77||\n' "$work/exit77.sh" > "$work/b2/tests.txt"
run "$work/b2" out-exit77
expect "an exit 77 is a skip" 4 $?
# 5.-7. A quick step, then one that hangs.
printf '/bin/true|quick||\n/bin/sleep|hangs|30|\n' > "$work/b2/tests.txt"
run "$work/b2" out-limit SPILLWAY_GPU_LIMIT_S=8
expect "the time limit stops a hanging step" 15 $?
has "the earlier step is reported" "$work/out-limit/summary.txt" "quick: passed"
has "the stop is reported" "$work/out-limit/summary.txt" "time limit (8 s) reached: hangs stopped"
run "$work/b2" out-term timeout -s TERM --preserve-status 4
expect "TERM stops the run" 16 $?
has "TERM: the earlier step is reported" "$work/out-term/summary.txt" "quick: passed"
has "TERM: the stop is reported" "$work/out-term/summary.txt" "stopped by TERM or INT during hangs"
run "$work/b2" out-kill timeout -s KILL 4
expect "KILL ends the call" 137 $?
has "KILL: what ran is in the summary" "$work/out-kill/summary.txt" "quick: passed"
if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed; outputs in $work"
  exit 1
fi
echo "every check passed"
