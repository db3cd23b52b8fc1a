#!/usr/bin/env bash
# Packs the Debian packages the build needs for the H200 machine (no package registry there)
# into .device/deps.tar.xz, small enough to carry: fetched with ../shared/tools/offline-deps.sh,
# unpacked, docs, static libraries (but gtest/gmock/benchmark) and the reference LAPACK dropped, xz-compressed.
set -euo pipefail
cd "$(dirname "$0")/../.."
pkgs=(nlohmann-json3-dev libcli11-dev libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libxxhash-dev
  libxxhash0 libpcre2-dev libpcre2-8-0 libgtest-dev libgmock-dev libicu-dev libicu72
  libopenblas-dev libopenblas0 libopenblas0-pthread libopenblas-pthread-dev libgfortran5
  libbenchmark-dev libbenchmark1debian libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3
  libbrotli-dev libbrotli1 zlib1g-dev)
../shared/tools/offline-deps.sh fetch .deps "${pkgs[@]}"
stage=$(mktemp -d)
for f in .deps/*.deb; do dpkg -x "$f" "$stage"; done
rm -rf "$stage/usr/share/doc" "$stage/usr/share/man" "$stage/usr/share/lintian"
find "$stage" -name '*.a' | grep -v -E 'gtest|gmock|benchmark' | xargs rm -f
# OpenBLAS carries its own LAPACK; the reference liblapack (7 MB) is never linked.
find "$stage" -name 'liblapack.so*' -delete
mkdir -p .device
tar -C "$stage" -cf - usr | xz -T0 -6 >.device/deps.tar.xz
rm -rf "$stage"
ls -la .device/deps.tar.xz
