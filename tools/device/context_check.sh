#!/usr/bin/env bash
# The context helper's device check (issue 14: top-k / select_blocks, index_scores and
# block_sparse_attention at long context). Run on the H200 machine from the repository root after
# tools/device/gpu_check.sh build (or any configure of build-gpu with -DFLASHSERVE_CUDA=ON): it
# builds only test_backend_ops and cuda_kernel_bench, runs the op suite's CUDA cases for these
# ops with the new kernels and again with the old ones (FLASHSERVE_CUDA_OLD_CONTEXT=1), the
# graph-captured CUDA tests that exercise them, then the kernel benchmark (old vs new at
# context 1k/16k/64k). Logs go to $OUT (or /tmp/flashserve-out); a summary to $OUT/context.txt.
#
#   tools/device/context_check.sh [--no-bench]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/flashserve-out}
mkdir -p "$out"
deps=$PWD/.device/deps
if [[ -d $deps/usr ]]; then
  lib=$deps/usr/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export CPATH=$deps/usr/include:$deps/usr/include/x86_64-linux-gnu/openblas-pthread
  export LIBRARY_PATH=$lib:$lib/openblas-pthread
  export CMAKE_PREFIX_PATH=$deps/usr
fi
exec > >(tee "$out/context.txt") 2>&1
[[ -d build-gpu ]] || { echo "build-gpu is missing: run tools/device/gpu_check.sh build first"; exit 1; }
SECONDS=0
cmake --build build-gpu --parallel "$(nproc)" --target test_backend_ops cuda_kernel_bench \
  >"$out/context-build.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/context-build.log" | head -40; exit 1; }
echo "build: ${SECONDS}s, $(grep -c 'warning' "$out/context-build.log") warning lines"

filter='Cuda/BackendOps.MatchesCpu/*topk*:Cuda/BackendOps.MatchesCpu/*select_blocks*'
filter+=':Cuda/BackendOps.MatchesCpu/*index_scores*:Cuda/BackendOps.MatchesCpu/*block_sparse*'
rc=0
timeout 300 build-gpu/tests/unit/test_backend_ops --gtest_filter="$filter" \
  >"$out/context-ops-new.log" 2>&1 || rc=1
echo "op suite, new kernels: $(grep -E '^\[  (PASSED|FAILED)' "$out/context-ops-new.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure|error' "$out/context-ops-new.log" | head -20
FLASHSERVE_CUDA_OLD_CONTEXT=1 timeout 300 build-gpu/tests/unit/test_backend_ops \
  --gtest_filter="$filter" >"$out/context-ops-old.log" 2>&1 || rc=1
echo "op suite, old kernels: $(grep -E '^\[  (PASSED|FAILED)' "$out/context-ops-old.log" | tr '\n' ' ')"
grep -E '^\[  FAILED' "$out/context-ops-old.log" | head -20
# Every other CUDA op case and the CPU-side QSA tests (the selection and attention on the CPU).
timeout 300 build-gpu/tests/unit/test_backend_ops --gtest_filter='Cuda/*:CpuOps.*' \
  >"$out/context-ops-all.log" 2>&1 || rc=1
echo "op suite, all CUDA cases: $(grep -E '^\[  (PASSED|FAILED)' "$out/context-ops-all.log" | tr '\n' ' ')"
grep -E '^\[  FAILED' "$out/context-ops-all.log" | head -20

if [[ ${1:-} != --no-bench ]]; then
  timeout 400 build-gpu/bench/cuda_kernel_bench --json "$out/kernel_bench.json" \
    >"$out/kernel_bench.txt" 2>&1 || rc=1
  head -1 "$out/kernel_bench.txt"
  grep -E "^(kernel|index_scores|select_blocks|block_sparse)" "$out/kernel_bench.txt"
fi
echo "total: ${SECONDS}s, rc $rc"
exit $rc
