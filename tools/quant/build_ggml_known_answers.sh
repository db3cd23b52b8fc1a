#!/bin/sh
# Builds ggml (an outside tool, not part of flashserve) from its public source and writes
# tests/fixtures/quant/ggml_known_answers.safetensors. See README.md.
#   tools/quant/build_ggml_known_answers.sh GGML_SOURCE_DIR [BUILD_DIR]
set -eu
src=${1:?usage: $0 GGML_SOURCE_DIR [BUILD_DIR]}
build=${2:-/tmp/ggml-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
commit=$(cat "$src/COMMIT" 2>/dev/null || git -C "$src" rev-parse HEAD)
# Baseline x86-64, no CPU backend: only ggml-base (the quantisers, to_float) is needed, and
# without -march=native no FMA contracts the reference's products.
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CPU=OFF \
  -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF
cmake --build "$build" --target ggml-base
cc -O2 -std=c11 -Wall -Wextra -I"$src/include" "$here/ggml_known_answers.c" \
  "$build/src/libggml-base.a" -lstdc++ -lm -lpthread -o "$build/ggml_known_answers"
mkdir -p "$root/tests/fixtures/quant"
"$build/ggml_known_answers" "$root/tests/fixtures/quant/ggml_known_answers.safetensors" "$commit"
