#!/usr/bin/env bash
# The graphs helper's one device run (issue 14, host overhead): builds only flashserve and the GPU
# tests that exercise device-side greedy picks, times greedy decode with the picks on the host
# (FLASHSERVE_DEVICE_SAMPLING=0) and on the device, then runs the tests. Run from a copy of the
# tree inside the device checkout (e.g. .h-graphs/), with ../models and ../.device present.
# Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/flashserve-out}
mkdir -p "$out"
[[ -e models ]] || ln -s ../models models
[[ -e .device ]] || ln -s ../.device .device
deps=$PWD/.device/deps
if [[ ! -d $deps/usr ]]; then
  mkdir -p "$deps"
  tar -xJf .device/deps.tar.xz -C "$deps"
fi
lib=$deps/usr/lib/x86_64-linux-gnu
export CMAKE_PREFIX_PATH=$deps/usr
export CPATH=$deps/usr/include:$deps/usr/include/x86_64-linux-gnu/openblas-pthread
export LIBRARY_PATH=$lib:$lib/openblas-pthread
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_PATH=$lib/pkgconfig:$deps/usr/share/pkgconfig
export OPENBLAS_NUM_THREADS=8
export PKG_CONFIG_SYSROOT_DIR=$deps
ln -sf "$lib/openblas-pthread/libopenblas.so.0" "$lib/libopenblas.so.0" 2>/dev/null
ln -sf "$lib/openblas-pthread/libblas.so.3" "$lib/libblas.so.3" 2>/dev/null

SECONDS=0
exec > >(tee "$out/summary.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHSERVE_CUDA=ON \
  -DFLASHSERVE_FIXTURES="$PWD/.device/fixtures" >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu --parallel "$(nproc)" --target flashserve test_qwen_gpu test_qwen_mtp_cuda \
  test_backend_ops >"$out/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
echo "build: ${SECONDS}s, $(grep -c 'warning:' "$out/build.log") warnings"

fs=build-gpu/src/flashserve
prompt=$(printf 'import os\nimport sys\n\ndef main():\n')
for rep in 1; do
  for pick in 0 1; do
    for d in 0 1 2 3; do
      f="$out/gen-pick$pick-d$d-r$rep.json"
      FLASHSERVE_DEVICE_SAMPLING=$pick timeout 30 $fs generate --backend cuda \
        --model models/qwen4-tiny-code --prompt "$prompt" --max-tokens 256 --temperature 0 \
        --mtp-depth $d --json >"$f" 2>"$f.err"
      python3 -c "import json,sys; j=json.load(open(sys.argv[1])); s=j['stats']; n=len(j['tokens']); print(f\"picks on {'device' if sys.argv[3]=='1' else 'host'} depth {sys.argv[2]}: {n} tokens {s['decode_ms']:.1f} ms = {1000*n/s['decode_ms']:.0f} tok/s accepted {s['accepted']} tokens-hash {hash(tuple(j['tokens']))}\")" "$f" $d $pick
    done
  done
done
echo "timings done: ${SECONDS}s"
t=build-gpu/tests/unit
[[ -x $t/test_backend_ops ]] || t=build-gpu/tests
timeout 60 $t/test_backend_ops --gtest_filter='Cuda/*argmax*:Cuda/*topk*:*ArgmaxRows*' >"$out/ops.log" 2>&1
echo "ops rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$out/ops.log" | tr '\n' ' ')"
timeout 100 $t/test_qwen_mtp_cuda >"$out/mtp.log" 2>&1 &
timeout 100 $t/test_qwen_gpu --gtest_filter='-*SampledMtp*' >"$out/gpu.log" 2>&1
echo "gpu rc=$? $(grep -E '^\[  (PASSED|FAILED)|FAILED  \]' "$out/gpu.log" | tr '\n' ' ')"
wait $!
echo "mtp rc=$? $(grep -E '^\[  (PASSED|FAILED)|FAILED  \]' "$out/mtp.log" | tr '\n' ' ')"
echo "all: ${SECONDS}s"
