#!/usr/bin/env bash
# The checks of docs/GPU.md "Other GPUs" on the H200, with binaries built on the workstation and
# carried (strip them, `tar -cf - ... | xz` into .device/): bin/ from the default build (sm_90a)
# and bin80/ from a build with -DFLASHSERVE_CUDA_ARCHS=80-virtual (PTX the driver compiles here:
# the paths a GPU before sm_89/sm_90 takes). Each holds flashserve, test_cuda_smoke,
# test_backend_ops, test_qwen_gpu, test_qwen_mtp, test_qwen_fp8, test_glm5, test_deepseek_v4.
# Logs under $OUT; a line a run with its gtest summary.
#   1. sm_90a as shipped: the new smoke tests (the e4m3 pair against its fields and the CPU; the
#      shared memory limit), the op suite.
#   2. sm_90a with FLASHSERVE_CUDA_SHARED_LIMIT at an RTX's 99 KB and an A100's 163 KB: the op
#      suite and the models whose prefill takes the fallbacks (GLM's chunked KDA, DeepSeek V4's
#      packed experts, Qwen's GDN chunks and QSA tiles).
#   3. the 80-virtual build: no overlapped launches, the e4m3 pair from its fields; the same
#      suites, and the FP8 decode figure beside sm_90a's.
set -uo pipefail
# The PTX build is compiled by the driver at first use, per module; keep every module's result
# for the runs after the first.
export CUDA_CACHE_MAXSIZE=4294967296
out=${OUT:-/tmp/out}; mkdir -p "$out"
summ() { echo "$1 rc $2 $(grep -E '^\[  (PASSED|FAILED)  \]' "$3" | tr '\n' ' ')"; grep -E '^\[  FAILED  \]' "$3" | head -8; }
run() {  # label, env assignments..., -- binary args...
  local label=$1; shift
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  # END (seconds since the epoch) skips what would not finish inside one device call.
  local left=$((${END:-9999999999} + 90 - $(date +%s)))
  if ((left < 90)); then echo "$label skipped"; return; fi
  env "${envs[@]}" timeout $((left < 300 ? left : 300)) "$@" >"$out/$label.log" 2>&1
  summ "$label" $? "$out/$label.log"
}
# SUITES picks what `suites` runs (default all): ops and the test binaries' names, so that a call
# carries only the fixtures its suites read.
SUITES=${SUITES:-ops test_qwen_mtp test_qwen_fp8 test_glm5 test_deepseek_v4 test_qwen_gpu}
suites() {  # label prefix, bin dir, env assignments...
  local p=$1 d=$2; shift 2
  # The CLI tests run the flashserve beside the carried test binaries, not the one of the build
  # folder they were configured in (FLASHSERVE_TEST_BINARY, tests/support/test_support.cpp).
  local bin=FLASHSERVE_TEST_BINARY=$PWD/$d/flashserve
  for t in $SUITES; do
    case $t in
      ops) run "$p-ops" "$bin" "$@" -- "$d/test_backend_ops" --gtest_filter='Cuda/*:Cuda*.*' ;;
      test_qwen_gpu) run "$p-qwen_gpu" "$bin" "$@" -- "$d/test_qwen_gpu" ;;
      *) run "$p-$t" FLASHSERVE_TEST_BACKEND=cuda "$bin" "$@" -- "$d/$t" ;;
    esac
  done
}
# One stage a call keeps each under the device's 10 minutes: `arch_check.sh native|limits|ptx|bench`.
stage=${1:-all}
case $stage in all | native | limits | ptx | bench) ;; *)
  echo "arch_check.sh: unknown stage '$stage' (all, native, limits, ptx or bench)" >&2
  exit 2 ;;
esac
nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader
if [[ $stage == all || $stage == native ]]; then
  run smoke90 X=1 -- bin/test_cuda_smoke
  suites s90 bin X=1
fi
if [[ $stage == all || $stage == limits ]]; then
  suites s90-99k bin FLASHSERVE_CUDA_SHARED_LIMIT=101376
  suites s90-163k bin FLASHSERVE_CUDA_SHARED_LIMIT=166912
fi
if [[ $stage == all || $stage == ptx ]]; then
  run smoke80 X=1 -- bin80/test_cuda_smoke
  suites s80 bin80 X=1
fi
if [[ $stage == all || $stage == bench ]]; then
  # The FP8 model's 48 layers need an H200's memory; an 80 GB card takes 24.
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  layers=$((${mib:-0} > 100000 ? 48 : 24))
  a=(bench --dtype fp8 --layers "$layers" --prefill 64 --contexts 1024 --max-depth 0 --decode-tokens 64 --no-profile)
  for d in bin bin80; do
    timeout 150 "$d/flashserve" "${a[@]}" >/dev/null 2>"$out/bench-$d.log"
    echo "$d fp8 $layers: $(grep -E 'tok/s' "$out/bench-$d.log" | head -3 | tr '\n' ' ')"
  done
fi
