#!/usr/bin/env bash
# The chunked helper's device check (issues 14 and 17: gated_delta_rule_chunked's chunk kernels,
# cuda_delta_chunks.cu). Run on the H200 machine from the repository root after
# tools/device/gpu_check.sh build (or any configure of build-gpu with -DFLASHSERVE_CUDA=ON): it
# builds the op suite, the model tests whose prefills take the chunk kernels and the kernel
# benchmark; runs the op suite's CUDA delta-rule cases with the chunk kernels and again token by
# token (FLASHSERVE_CUDA_OLD_DELTA=1), every other CUDA op case, the Qwen, GLM and MTP model tests
# on CUDA, then `cuda_kernel_bench --delta` (chunks vs token by token at 512 and 4,096 tokens).
# Logs go to $OUT (or /tmp/flashserve-out); a summary to $OUT/delta.txt.
#
#   tools/device/delta_check.sh [--no-bench]
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
exec > >(tee "$out/delta.txt") 2>&1
[[ -d build-gpu ]] || { echo "build-gpu is missing: run tools/device/gpu_check.sh build first"; exit 1; }
SECONDS=0
cmake --build build-gpu --parallel "$(nproc)" \
  --target test_backend_ops test_qwen test_glm5 test_qwen_mtp cuda_kernel_bench \
  >"$out/delta-build.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/delta-build.log" | head -40; exit 1; }
echo "build: ${SECONDS}s, $(grep -c 'warning' "$out/delta-build.log") warning lines"

rc=0
summary() { echo "$1: $(grep -E '^\[  (PASSED|FAILED)' "$2" | tr '\n' ' ')"; grep -E '^\[  FAILED' "$2" | head -20; }
filter='Cuda/BackendOps.MatchesCpu/*delta_rule*'
timeout 300 build-gpu/tests/unit/test_backend_ops --gtest_filter="$filter" \
  >"$out/delta-ops-chunks.log" 2>&1 || rc=1
summary "op suite, delta rule, chunk kernels" "$out/delta-ops-chunks.log"
FLASHSERVE_CUDA_OLD_DELTA=1 timeout 300 build-gpu/tests/unit/test_backend_ops \
  --gtest_filter="$filter" >"$out/delta-ops-tokens.log" 2>&1 || rc=1
summary "op suite, delta rule, token by token" "$out/delta-ops-tokens.log"
timeout 300 build-gpu/tests/unit/test_backend_ops --gtest_filter='Cuda/*:CpuOps.*' \
  >"$out/delta-ops-all.log" 2>&1 || rc=1
summary "op suite, all CUDA cases" "$out/delta-ops-all.log"
for t in test_qwen test_glm5 test_qwen_mtp; do
  FLASHSERVE_TEST_BACKEND=cuda timeout 600 "build-gpu/tests/unit/$t" >"$out/delta-$t.log" 2>&1 ||
    rc=1
  summary "$t on CUDA" "$out/delta-$t.log"
done

if [[ ${1:-} != --no-bench ]]; then
  timeout 300 build-gpu/bench/cuda_kernel_bench --delta >"$out/delta-bench.txt" 2>&1 || rc=1
  cat "$out/delta-bench.txt"
fi
echo "total: ${SECONDS}s, rc $rc"
exit $rc
