#!/usr/bin/env bash
# Every GPU test (the op suite, the model suites with FLASHSERVE_TEST_BACKEND=cuda, step graphs,
# quant) and the decode benches (bf16 24 layers, a 32k draft vocabulary, FP8 48 layers) on the
# H200 machine, as session 9's last device call ran them. Carry .device/deps.tar.xz and
# .device/fixtures.tar.xz (`tar -cJf .device/fixtures.tar.xz -C .device fixtures`); logs and
# the bench JSON under $OUT. EXTRA_TARGETS / EXTRA_TESTS add test programs.
set -uo pipefail
top=${OUT:-/tmp/o}; out=$top/logs; mkdir -p $out
T0=$(date +%s)
mkdir -p .device && tar -xJf .device/fixtures.tar.xz -C .device
TARGETS="flashserve test_backend_ops test_qwen test_qwen_mtp test_glm5 test_deepseek_v4 test_qwen_fp8 test_step_graphs test_quant ${EXTRA_TARGETS:-}" \
  bash tools/device/gpu_check.sh build 2>&1 | tail -2
echo "built at +$(( $(date +%s) - T0 )) s"
lib=$PWD/.device/deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread:/usr/local/cuda/lib64
b=build-gpu/tests/unit; B=build-gpu/src/flashserve
summ() { grep -E "^\[  (PASSED|FAILED)|^\[  FAILED  \]" "$1" | head -10; }
{
timeout 150 $b/test_backend_ops --gtest_filter='Cuda/*' > $out/ops.log 2>&1; echo "ops rc $?"; summ $out/ops.log
for t in test_qwen test_glm5 test_deepseek_v4 test_qwen_mtp test_qwen_fp8 ${EXTRA_TESTS:-}; do
  FLASHSERVE_TEST_BACKEND=cuda timeout 100 $b/$t > $out/$t.log 2>&1; echo "cuda $t rc $?"; summ $out/$t.log
done
timeout 60 $b/test_step_graphs > $out/graphs.log 2>&1; echo "graphs rc $?"; summ $out/graphs.log
timeout 30 $b/test_quant > $out/quant.log 2>&1; echo "test_quant rc $?"; summ $out/quant.log
echo "tests done at +$(( $(date +%s) - T0 )) s"
timeout 120 $B bench --layers 24 --prefill 512,4096 --contexts 1024,16384 --max-depth 3 --decode-tokens 64 \
  --json $top/bench-bf16.json > $out/bench-bf16.txt 2>&1; echo "bench bf16 rc $?"; grep -E "^bench:" $out/bench-bf16.txt | head -14
timeout 60 $B bench --layers 24 --prefill 64 --contexts 1024 --max-depth 3 --decode-tokens 64 --draft-vocab 32768 --no-profile \
  > $out/bench-dv.txt 2>&1; echo "bench dv rc $?"; grep -E "^bench:" $out/bench-dv.txt | head -6
timeout 100 $B bench --dtype fp8 --layers 48 --prefill 64 --contexts 1024 --max-depth 3 --decode-tokens 32 --no-profile \
  --json $top/bench-fp8.json > $out/bench-fp8.txt 2>&1; echo "bench fp8 rc $?"; grep -E "^bench:" $out/bench-fp8.txt | head -8
echo "all done at +$(( $(date +%s) - T0 )) s"
} > $top/summary.txt 2>&1
cat $top/summary.txt
tar czf $top/logs.tar.gz -C $out . && rm -rf $out
