#!/usr/bin/env bash
# Packs node and the API tests' npm packages for the H200 machine (no registry there):
# .node/node.xz and .node/node_modules.tar.xz, which tools/device/gpu_check.sh unpacks.
set -euo pipefail
cd "$(dirname "$0")/../.."
(cd tests/api && npm ci --no-audit --no-fund --loglevel=error)
mkdir -p .node
xz -T0 -6 -c "$(readlink -f "$(command -v node)")" >.node/node.xz
tar -cf - tests/api/node_modules | xz -T0 -6 >.node/node_modules.tar.xz
ls -la .node
