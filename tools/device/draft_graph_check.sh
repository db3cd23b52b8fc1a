#!/usr/bin/env bash
# The draft-graph helper's device check (issue 14, docs/GPU.md "Step 10": the MTP head's drafts and
# history steps as step graphs). Run on the H200 after building in build-gpu
# (tools/device/gpu_check.sh build). Logs to $OUT.
#   tools/device/draft_graph_check.sh tests   builds the test targets, runs the step-graph tests,
#                                             the upload_rows op cases, and test_qwen_mtp /
#                                             test_qwen_gpu on CUDA with graphs off and on (~3 min)
#   tools/device/draft_graph_check.sh bench   the FP8 48-layer bench at depths 0-3 three ways:
#                                             graphs off, graphs on (trunk and head), the head's
#                                             graphs alone (FLASHSERVE_TRUNK_GRAPHS=0) (~5 min)
# BENCH_ARGS replaces the bench's shape (default: FP8, 48 layers, context 1k, 48 tokens); MODES picks
# among "eager graphs head-graphs" (all three by default; one call may not fit all three at 48 layers).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-/tmp/flashserve-out}
mkdir -p "$out"
deps=$PWD/.device/deps
lib=$deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OPENBLAS_NUM_THREADS=8
SECONDS=0
what=${1:-tests}
exec > >(tee -a "$out/draft-graph-summary.txt") 2>&1

t=build-gpu/tests/unit
summary() { grep -E '^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]' "$1" | tr '\n' ' '; }

if [[ $what == tests || $what == all ]]; then
  cmake --build build-gpu --parallel "$(nproc)" --target flashserve test_step_graphs \
    test_backend_ops test_qwen_mtp test_qwen_gpu >"$out/draft-build.log" 2>&1 ||
    { grep -E "error|FAILED" "$out/draft-build.log" | head -40; exit 1; }
  echo "build: ${SECONDS}s, $(grep -c 'warning' "$out/draft-build.log") warning lines"

  # Every step-graph test (the trunk's and the head's); the head's print their graph counters.
  timeout 300 $t/test_step_graphs >"$out/draft-step-graphs.log" 2>&1
  echo "test_step_graphs rc=$? $(summary "$out/draft-step-graphs.log")"
  grep -E "MTP head|generate|decode:" "$out/draft-step-graphs.log"

  timeout 120 $t/test_backend_ops --gtest_filter='*upload_rows*:*UploadRows*' \
    >"$out/draft-ops.log" 2>&1
  echo "test_backend_ops upload_rows rc=$? $(summary "$out/draft-ops.log")"

  # Greedy MTP equals plain decoding, every exit path, the sampled distribution: on CUDA with
  # the graphs off (the default) and on (the head's forwards then run as graphs).
  for g in 0 1; do
    FLASHSERVE_TEST_BACKEND=cuda FLASHSERVE_CUDA_GRAPHS=$g timeout 300 $t/test_qwen_mtp \
      >"$out/draft-qwen-mtp-g$g.log" 2>&1
    echo "test_qwen_mtp cuda graphs=$g rc=$? $(summary "$out/draft-qwen-mtp-g$g.log")"
    FLASHSERVE_CUDA_GRAPHS=$g timeout 300 $t/test_qwen_gpu >"$out/draft-qwen-gpu-g$g.log" 2>&1
    echo "test_qwen_gpu graphs=$g rc=$? $(summary "$out/draft-qwen-gpu-g$g.log")"
  done
  echo "tests: ${SECONDS}s"
fi

if [[ $what == bench || $what == all ]]; then
  cmake --build build-gpu --parallel "$(nproc)" --target flashserve >"$out/draft-build.log" 2>&1 ||
    { grep -E "error|FAILED" "$out/draft-build.log" | head -40; exit 1; }
  fs=build-gpu/src/flashserve
  read -r -a args <<<"${BENCH_ARGS:---dtype fp8 --layers 48 --prefill 64 --contexts 1024 --max-depth 3 --decode-tokens 48}"
  for mode in ${MODES:-eager graphs head-graphs}; do
    case $mode in
      eager) env=(FLASHSERVE_CUDA_GRAPHS=0) ;;
      graphs) env=(FLASHSERVE_CUDA_GRAPHS=1) ;;
      head-graphs) env=(FLASHSERVE_CUDA_GRAPHS=1 FLASHSERVE_TRUNK_GRAPHS=0) ;;
    esac
    f="$out/draft-bench-$mode.json"
    env "${env[@]}" timeout 280 $fs bench "${args[@]}" --no-profile --json "$f" \
      >"$out/draft-bench-$mode.txt" 2>&1
    echo "bench $mode (${env[*]}) rc=$? (${SECONDS}s):"
    python3 - "$f" <<'EOF' || tail -5 "$out/draft-bench-$mode.txt"
import json, sys
j = json.load(open(sys.argv[1]))
for row in j["decode"]:
    g = row.get("step_graphs", {})
    print(f"  context {row['context']}: AR step graphs {g.get('captures', 0)} captures, "
          f"{g.get('replays', 0)} replays, walk {g.get('walk_us_per_replay', 0):.0f} us")
    for m in row["modes"]:
        line = f"  depth {m['depth']}: {m['tokens_per_s']:.1f} tok/s"
        if m["depth"] > 0:
            line += (f" ({m['speedup_vs_autoregressive']:.2f}x, exact {m['equals_autoregressive']})"
                     f", a round: draft {m['draft_ms_per_round']:.2f} ms, verify "
                     f"{m['verify_ms_per_round']:.2f} ms, AR step "
                     f"{m['autoregressive_ms_per_token']:.2f} ms")
        print(line)
EOF
  done
  echo "bench: ${SECONDS}s"
fi
