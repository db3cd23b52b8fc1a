#!/usr/bin/env bash
# The graph2 helper's device check (issue 14, DESIGN rule 5: the decode step as a CUDA graph).
# Run on the H200 after building in build-gpu (tools/device/gpu_check.sh build): builds the few
# targets this needs (a no-op when built), runs the step-graph GPU tests and the existing GPU
# decode tests, then times greedy `generate` on the embedded model and `flashserve bench` at
# context 1k with graphs on and off (FLASHSERVE_CUDA_GRAPHS=1 / 0). Under 150 s; logs to $OUT.
#   tools/device/graph_check.sh            (BENCH_LAYERS=24 by default; 8 is quicker)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/flashserve-out}
mkdir -p "$out"
deps=$PWD/.device/deps
lib=$deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPENBLAS_NUM_THREADS=8
SECONDS=0
exec > >(tee "$out/graph-summary.txt") 2>&1

cmake --build build-gpu --parallel "$(nproc)" --target flashserve test_step_graphs test_qwen_gpu \
  >"$out/graph-build.log" 2>&1 || { grep -E "error|FAILED" "$out/graph-build.log" | head -40; exit 1; }
echo "build: ${SECONDS}s, $(grep -c 'warning' "$out/graph-build.log") warning lines"

t=build-gpu/tests/unit
timeout 45 $t/test_step_graphs >"$out/graph-tests.log" 2>&1
echo "test_step_graphs rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]' "$out/graph-tests.log" | tr '\n' ' ')"
grep -E "launched as graphs|steps as graphs" "$out/graph-tests.log"
timeout 30 $t/test_qwen_gpu --gtest_filter='*Greedy*:*SteadyState*' >"$out/graph-qwen-gpu.log" 2>&1
echo "test_qwen_gpu (greedy, steady state) rc=$? $(grep -E '^\[  (PASSED|FAILED)|FAILED  \]' "$out/graph-qwen-gpu.log" | tr '\n' ' ')"
echo "tests: ${SECONDS}s"

fs=build-gpu/src/flashserve
prompt=$(printf 'import os\nimport sys\n\ndef main():\n')
for d in 0 3; do
  for g in 1 0; do
    f="$out/graph-gen-g$g-d$d.json"
    FLASHSERVE_CUDA_GRAPHS=$g timeout 20 $fs generate --backend cuda --model models/qwen4-tiny-code \
      --prompt "$prompt" --max-tokens 256 --temperature 0 --mtp-depth $d --json >"$f" 2>"$f.err"
    python3 -c "import json,sys,hashlib; j=json.load(open(sys.argv[1])); s=j['stats']; n=len(j['tokens']); h=hashlib.sha1(str(j['tokens']).encode()).hexdigest()[:10]; print(f\"generate graphs={sys.argv[3]} depth {sys.argv[2]}: {n} tokens {s['decode_ms']:.1f} ms = {1000*n/s['decode_ms']:.0f} tok/s, accepted {s['accepted']}, tokens {h}\")" "$f" $d $g ||
      tail -3 "$f.err"
  done
done
echo "generate: ${SECONDS}s"

layers=${BENCH_LAYERS:-24}
for g in 1 0; do
  FLASHSERVE_CUDA_GRAPHS=$g timeout 45 $fs bench --layers "$layers" --prefill 512 --contexts 1024 \
    --max-depth 0 --decode-tokens 64 --no-profile --json "$out/graph-bench-g$g.json" \
    >"$out/graph-bench-g$g.txt" 2>&1
  echo "bench graphs=$g rc=$? (${SECONDS}s):"
  grep -iE "decode|tok/s|GB/s" "$out/graph-bench-g$g.txt" | head -8
done
echo "all: ${SECONDS}s"
