#!/usr/bin/env bash
# Builds flashserve with CUDA on the H200 machine (which has no package registry) and runs the
# GPU-labelled tests, then the rest of the suite. Carry `.deps` (the Debian packages, see
# README "GPU tests") and `.device` (a copy of ../shared/fixtures as .device/fixtures).
#
#   tools/device/gpu_check.sh [build|gpu|all|CTEST-ARGS...]
# Logs go to $OUT (or /tmp/flashserve-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/flashserve-out}
mkdir -p "$out"
deps=$PWD/.device/deps
if [[ ! -d $deps/usr ]]; then
  mkdir -p "$deps"
  for f in .deps/*.deb; do dpkg -x "$f" "$deps"; done
fi
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
    -DFLASHSERVE_FIXTURES="$PWD/.device/fixtures" >"$out/configure.log" 2>&1 ||
    { tail -30 "$out/configure.log"; return 1; }
  grep -E "flashserve:" "$out/configure.log"
  cmake --build build-gpu --parallel "$(nproc)" >"$out/build.log" 2>&1 ||
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
       ctest --test-dir build-gpu -LE gpu -j8 -E "tokenizer\.|api\." --output-on-failure \
         >"$out/ctest-rest.log" 2>&1
       tail -15 "$out/ctest-rest.log" ;;
  *) ctest --test-dir build-gpu "$@" >"$out/ctest.log" 2>&1; tail -40 "$out/ctest.log" ;;
esac
