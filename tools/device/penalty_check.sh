#!/usr/bin/env bash
# The host work of the penalties at a long context (bench/NOTES.md "Session 27"): FP8 48 layers
# sampled with a release's repetition penalty at a 64k context (the bench samples autoregressively),
# the current build (bin/flashserve) against one built at ee61757 (bin-old/flashserve: the
# counts walked a step), alternating. Logs under $OUT.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
a=(bench --dtype fp8 --layers 48 --prefill 64 --contexts 65536 --max-depth 0 --decode-tokens 48
   --no-profile --temperature 0.8 --top-k 40 --repetition-penalty 1.05)
for r in 1 2; do
  for d in bin-old bin; do
    timeout 280 "$d/flashserve" "${a[@]}" >/dev/null 2>"$out/penalty-$d-$r.log"
    echo "$d round $r rc $?: $(grep -E 'tok/s' "$out/penalty-$d-$r.log" | head -4 | tr '\n' ' ')"
  done
done
