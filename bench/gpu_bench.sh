#!/usr/bin/env bash
# Issue 14 on the H200 machine: `flashserve bench` (released shapes, layers reduced to fit) and the
# HF transformers qwen4_exp baseline in one go, printed side by side with the speedup.
#
#   bench/gpu_bench.sh [FLASHSERVE]     (default build-gpu/src/flashserve; build it first with
#                                        tools/device/gpu_check.sh build)
# Logs and JSON go to $OUT (or /tmp/flashserve-out). Time limits per part (seconds):
# BENCH_S (our full bench, 240), OURS8_S (ours at the baseline's layer count, 45), HF_S (HF eager,
# 120), HF_COMPILE_S (HF with torch.compile, 90; 0 skips it). HF_LAYERS (8) is the baseline's depth.
set -uo pipefail
cd "$(dirname "$0")/.."
fs=${1:-build-gpu/src/flashserve}
out=${OUT:-/tmp/flashserve-out}
mkdir -p "$out"
layers=${HF_LAYERS:-8}
# The Debian libraries of the build (tools/device/gpu_check.sh unpacks .device/deps.tar.xz).
deps=$PWD/.device/deps
if [[ -f .device/deps.tar.xz && ! -d $deps/usr ]]; then
  mkdir -p "$deps" && tar -xJf .device/deps.tar.xz -C "$deps"
fi
if [[ -d $deps/usr ]]; then
  lib=$deps/usr/lib/x86_64-linux-gnu
  ln -sf "$lib/openblas-pthread/libopenblas.so.0" "$lib/libopenblas.so.0" 2>/dev/null
  export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# A prebuilt binary may bring its libraries in a folder (FLASHSERVE_LIB_DIR); CUDA's own come from
# the toolkit.
[[ -n ${FLASHSERVE_LIB_DIR:-} ]] && export LD_LIBRARY_PATH=$FLASHSERVE_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d $d ]] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
done
ldd "$fs" | grep "not found" && echo "gpu_bench: $fs is missing libraries"
nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv,noheader >"$out/gpu.txt" 2>&1

timeout "${BENCH_S:-240}" "$fs" bench --json "$out/bench.json" --decode-tokens 64 \
  >/dev/null 2>"$out/bench.log"
echo "ours (full): rc $?"; tail -40 "$out/bench.log"
timeout "${OURS8_S:-45}" "$fs" bench --layers "$layers" --prefill 4096 --contexts 1024 \
  --decode-tokens 24 --max-depth 0 --no-profile --json "$out/bench-$layers.json" \
  >/dev/null 2>"$out/bench-$layers.log"
echo "ours ($layers layers): rc $?"; tail -12 "$out/bench-$layers.log"
timeout "${HF_S:-120}" env PYTHONUNBUFFERED=1 python3 tools/bench/hf_baseline.py --layers "$layers" \
  --json "$out/hf.json" >/dev/null 2>"$out/hf.log"
echo "hf eager: rc $?"; tail -5 "$out/hf.log"
if [[ ${HF_COMPILE_S:-90} -gt 0 ]]; then
  timeout "${HF_COMPILE_S:-90}" env PYTHONUNBUFFERED=1 python3 tools/bench/hf_baseline.py --layers "$layers" --compile \
    --json "$out/hf-compile.json" >/dev/null 2>"$out/hf-compile.log"
  echo "hf compile: rc $? (124: did not finish within ${HF_COMPILE_S:-90} s)"
  tail -5 "$out/hf-compile.log"
fi

python3 - "$out" "$layers" <<'PY'
import json, os, sys
out, layers = sys.argv[1], sys.argv[2]
def load(name):
    p = os.path.join(out, name)
    return json.load(open(p)) if os.path.exists(p) else None
ours, ours8, hf, hfc = (load(n) for n in ("bench.json", f"bench-{layers}.json", "hf.json", "hf-compile.json"))
rows = []
def ar(b, ctx):
    for d in b["decode"]:
        if d["context"] == ctx:
            return d["modes"][0]["tokens_per_s"]
def pre(b, n):
    for p in b["prefill"]:
        if p["tokens"] == n:
            return p["tokens_per_s"]
print(f"\nside by side at {layers} layers, bf16, batch 1 (HF: eager{', compiled' if hfc else ''})")
print(f"{'figure':34s} {'flashserve':>11s} {'HF eager':>10s} {'speedup':>8s} {'HF compile':>11s}")
for name, f_ours, key in (("decode tok/s (context 1024)", lambda b: ar(b, 1024), "decode"),
                          ("prefill tok/s (4096 tokens)", lambda b: pre(b, 4096), "prefill")):
    o = f_ours(ours8) if ours8 else None
    h = hf[key]["tokens_per_s"] if hf else None
    c = hfc[key]["tokens_per_s"] if hfc else None
    fmt = lambda v: f"{v:11.2f}" if v else f"{'-':>11s}"
    sp = f"{o / h:7.1f}x" if o and h else f"{'-':>8s}"
    print(f"{name:34s} {fmt(o)} {fmt(h)[1:]} {sp} {fmt(c)}")
for name, b in ((f"flashserve ({layers} layers)", ours8), ("flashserve (full)", ours)):
    if b and b["decode"]:
        d = b["decode"][0]
        frac = d.get("fraction_of_copy")
        print(f"{name}: {b['layers']} layers, {d['bytes_per_token']['total'] / 1e9:.2f} GB/token at "
              f"context {d['context']}, {d['achieved_Bps'] / 1e9:.0f} GB/s"
              + (f" = {100 * frac:.1f}% of the {b['copy_bandwidth_Bps'] / 1e12:.2f} TB/s copy" if frac else ""))
if ours:
    print(f"\nflashserve at {ours['layers']} layers: see bench.log for the full table")
PY
