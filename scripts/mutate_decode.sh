#!/usr/bin/env bash
# The decode loop's mutation harness: applies each mutation below to src/decode/generator.cpp in
# turn, rebuilds test_decode in the build folder, runs the generator tests, and prints which
# tests caught it. A mutation no test catches is a hole in the tests: the script then exits 1.
# The source file is restored on exit, whatever happens (and test_decode rebuilt from it).
#
#   scripts/mutate_decode.sh            (BUILD=build by default; about a minute per mutation)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
file=src/decode/generator.cpp
backup=$(mktemp)
cp "$file" "$backup"
restore() {
  cp "$backup" "$file"
  rm -f "$backup"
  cmake --build "$build" --target test_decode >/dev/null 2>&1 || true
}
trap restore EXIT

# name @@ the exact text in generator.cpp @@ what replaces it
mutations=(
  "no pending re-arm at the exit check@@pending = primary;  // forwarded by finish_turn, never left out of the state@@(void)0;"
  "accept a draft without the p/q test@@accept = rng_.uniform() <= accept_prob;@@accept = rng_.uniform() <= 2.0;"
  "sample the correction from p, not the residual@@sample(residual_distribution(p, drafts[j].q), rng_)@@sample(p, rng_)"
  "finish_turn ignores a failed forward of the pending token@@if (auto s = extend(model_, state_, in); !s.ok()) {@@if (auto s = extend(model_, state_, in); false && !s.ok()) {"
  "finish_turn never forwards the pending token@@if (pending) {@@if (false) {"
  "a requested stop (stop sequence) is ignored@@return is_stop(t) || (opt_.stop_requested && opt_.stop_requested());@@return is_stop(t);"
  "a stop token inside accepted drafts does not end the round@@if (stops_at(x)) {@@if (false) {"
)

survived=0
for m in "${mutations[@]}"; do
  name=${m%%@@*}
  rest=${m#*@@}
  from=${rest%%@@*}
  to=${rest#*@@}
  cp "$backup" "$file"
  FROM="$from" TO="$to" python3 - "$file" <<'PY'
import os, sys
path = sys.argv[1]
text = open(path).read()
old, new = os.environ["FROM"], os.environ["TO"]
if text.count(old) < 1:
    sys.exit(f"mutation text not found in {path}: {old!r}")
open(path, "w").write(text.replace(old, new, 1))
PY
  if ! cmake --build "$build" --target test_decode >/tmp/mutate_build.log 2>&1; then
    echo "mutation '$name': does not compile (see /tmp/mutate_build.log)"
    survived=1
    continue
  fi
  out=$("$build/tests/unit/test_decode" --gtest_filter='Generator.*' --gtest_brief=1 2>&1 || true)
  caught=$(printf '%s\n' "$out" | sed -n 's/^\[  FAILED  \] \(Generator\.[A-Za-z]*\).*/\1/p' | sort -u | tr '\n' ' ')
  if [[ -n "$caught" ]]; then
    echo "mutation '$name': caught by $caught"
  else
    echo "mutation '$name': SURVIVED (no test failed)"
    survived=1
  fi
done
exit "$survived"
