#!/usr/bin/env bash
# Builds flashserve with CUDA on the H200 machine (which has no package registry) and runs the
# GPU-labelled tests, then the rest of the suite. Carry `.device`, which holds a copy of
# ../shared/fixtures (.device/fixtures) and the build's Debian packages unpacked and packed again
# without docs and static libraries (.device/deps.tar.xz; tools/device/pack_deps.sh makes it).
#
#   [TARGETS="t1 t2"] tools/device/gpu_check.sh [build|gpu|all|CTEST-ARGS...]
# Logs go to $OUT (or /tmp/flashserve-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/flashserve-out}
mkdir -p "$out"
deps=$PWD/.device/deps
if [[ ! -d $deps/usr ]]; then
  mkdir -p "$deps"
  tar -xJf .device/deps.tar.xz -C "$deps"
fi
# node for the API tests (optional): .node/node.xz (the node binary) and
# .node/node_modules.tar.xz (tests/api/node_modules), packed by tools/device/pack_node.sh.
if [[ -f .node/node.xz && ! -x .device/node/bin/node ]]; then
  mkdir -p .device/node/bin && xz -dc .node/node.xz >.device/node/bin/node &&
    chmod +x .device/node/bin/node
fi
if [[ -f .node/node_modules.tar.xz && ! -d tests/api/node_modules ]]; then
  tar -xJf .node/node_modules.tar.xz
fi
[[ -x .device/node/bin/node ]] && export PATH=$PWD/.device/node/bin:$PATH
lib=$deps/usr/lib/x86_64-linux-gnu
export CMAKE_PREFIX_PATH=$deps/usr
export CPATH=$deps/usr/include:$deps/usr/include/x86_64-linux-gnu/openblas-pthread
export LIBRARY_PATH=$lib:$lib/openblas-pthread
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$lib/pkgconfig:$deps/usr/share/pkgconfig
export OPENBLAS_NUM_THREADS=8
# Debian's .pc files say prefix=/usr: point pkg-config at the unpacked tree instead.
export PKG_CONFIG_SYSROOT_DIR=$deps
# libopenblas.so.0 is an alternatives link on Debian, which dpkg -x does not create.
ln -sf "$lib/openblas-pthread/libopenblas.so.0" "$lib/libopenblas.so.0" 2>/dev/null
ln -sf "$lib/openblas-pthread/libblas.so.3" "$lib/libblas.so.3" 2>/dev/null

configure_and_build() {
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA=ON \
    -DFLASHSERVE_FIXTURES="${FLASHSERVE_DEVICE_FIXTURES:-$PWD/.device/fixtures}" >"$out/configure.log" 2>&1 ||
    { tail -30 "$out/configure.log"; return 1; }
  grep -E "flashserve:" "$out/configure.log"
  # TARGETS (space-separated) builds only those, e.g. the GPU tests and flashserve.
  cmake --build build-gpu --parallel "$(nproc)" ${TARGETS:+--target $TARGETS} >"$out/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$out/build.log" | head -40; return 1; }
  echo "build: $(grep -c 'warning:' "$out/build.log") warnings"
}

mode=${1:-all}
configure_and_build || exit 1
case "$mode" in
  build) ;;
  gpu) ctest --test-dir build-gpu -L gpu -j4 --output-on-failure >"$out/ctest-gpu.log" 2>&1
       tail -40 "$out/ctest-gpu.log" ;;
  all) ctest --test-dir build-gpu -L gpu -j4 --output-on-failure >"$out/ctest-gpu.log" 2>&1
       tail -25 "$out/ctest-gpu.log"
       # The tokenizer reference tests need their npm packages (145 MB, not carried): CPU-only
       # code that this machine does not change.
       ctest --test-dir build-gpu -LE gpu -j8 -E "tokenizer\.|TokenizerReference" \
         --output-on-failure >"$out/ctest-rest.log" 2>&1
       tail -15 "$out/ctest-rest.log" ;;
  figures)
    # The embedded model answering on the GPU, and decode figures on both backends.
    fs=build-gpu/src/flashserve
    $fs run --backend cuda --max-tokens 48 --temperature 0 "def fibonacci(n):" 2>&1 |
      tee "$out/run-cuda.txt" | tail -12
    prompt=$(printf 'import os\nimport sys\n\ndef main():\n')
    for b in cpu cuda; do
      for d in 0 1 2 3; do
        $fs generate --backend $b --model models/qwen4-tiny-code --prompt "$prompt" \
          --max-tokens 256 --temperature 0 --mtp-depth $d --json >"$out/gen-$b-$d.json"
        python3 -c "import json,sys; j=json.load(open(sys.argv[1])); s=j['stats']; n=len(j['tokens']); print(f\"{s['backend']} depth {sys.argv[2]}: {n} tokens in {s['decode_ms']:.1f} ms = {1000*n/s['decode_ms']:.0f} tok/s, prefill {s['prompt_tokens']} tokens {s['prefill_ms']:.1f} ms\")" "$out/gen-$b-$d.json" $d
      done
    done ;;
  *) ctest --test-dir build-gpu "$@" >"$out/ctest.log" 2>&1; tail -40 "$out/ctest.log" ;;
esac
