#!/usr/bin/env bash
# MTP acceptance per depth on code prompts: greedy and sampled, depth 1-3, and the AR baseline.
# Usage: bench/mtp_acceptance.sh [MODEL_DIR] [MAX_TOKENS]   (prints one JSON line per run and a summary)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/qwen4-tiny-code}
max=${2:-96}
bin=build/src/flashserve
prompts=(
  $'import os\nimport sys\n\n\ndef main():\n'
  $'class Stack:\n    """A last-in, first-out stack."""\n\n    def __init__(self):\n'
  $'def read_lines(path):\n    with open(path, encoding="utf-8") as f:\n'
  $'import json\n\n\ndef load_config(path):\n    """Load a JSON config file."""\n'
  $'def fibonacci(n):\n    if n < 2:\n        return n\n'
  $'for i, item in enumerate(items):\n    if item is None:\n'
  $'import re\n\n_WORD = re.compile(r"\\w+")\n\n\ndef words(text):\n'
  $'class Config:\n    def __init__(self, **kwargs):\n        for key, value in kwargs.items():\n'
)
for mode in greedy sampled; do
  temp=0; [[ $mode == sampled ]] && temp=0.6
  for depth in 1 2 3; do
    acc=(0 0 0); dra=(0 0 0); rounds=0; tokens=0
    for p in "${prompts[@]}"; do
      ids=$("$bin" tokenize --tokenizer "$model" --text "$p" | tr -d '[] ')
      out=$("$bin" generate --model "$model" --tokens "$ids" --max-tokens "$max" --mtp-depth "$depth" \
            --temperature "$temp" --top-p 0.95 --top-k 20 --seed 1 --json)
      for d in 0 1 2; do
        a=$(echo "$out" | python3 -c "import json,sys; s=json.load(sys.stdin)['stats']; print((s['accepted']+[0,0,0])[$d], (s['drafted']+[0,0,0])[$d])")
        acc[$d]=$(( acc[d] + ${a% *} )); dra[$d]=$(( dra[d] + ${a#* } ))
      done
      rounds=$(( rounds + $(echo "$out" | python3 -c "import json,sys; print(json.load(sys.stdin)['stats']['rounds'])") ))
      tokens=$(( tokens + $(echo "$out" | python3 -c "import json,sys; print(len(json.load(sys.stdin)['tokens']))") ))
    done
    line="$mode depth $depth: tokens/round $(python3 -c "print(round($tokens/$rounds,2))")"
    for d in $(seq 0 $((depth-1))); do
      line+="; depth $((d+1)) accepted ${acc[$d]}/${dra[$d]} = $(python3 -c "print(round(${acc[$d]}/max(${dra[$d]},1),3))")"
    done
    echo "$line"
  done
done
