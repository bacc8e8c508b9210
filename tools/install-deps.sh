#!/usr/bin/env bash
# Installs Loom's build dependencies from Debian's packages, only those that are missing.
# Does nothing (and needs no network) when everything is already installed.
set -euo pipefail
pkgs=(cmake ninja-build g++ libtorch-dev libgloo-dev libboost-graph-dev nlohmann-json3-dev catch2 libcli11-dev libutf8proc-dev chromium libopenblas0-openmp clang libclang-rt-14-dev clang-tidy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
