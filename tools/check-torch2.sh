#!/usr/bin/env bash
# Builds Loom against LibTorch 2.x and runs its whole test suite there (issue 5: the executor "must
# also build against LibTorch 2.x"). Debian 12 ships LibTorch 1.13; Debian 13 (trixie) ships 2.6
# and Debian unstable (sid) a current 2.x with transformers. This script makes a root of
# TORCH2_SUITE (trixie, the default, or sid) with debootstrap (once, in TORCH2_ROOT, by default
# /var/tmp/loom-SUITE), installs Loom's dependencies there from that suite's packages, binds this
# checkout into it and runs cmake, ninja and ctest in build-torch2-SUITE/ of the checkout. Needs
# root and Debian's package mirror; CI does not run it (make test stays on Debian 12's 1.13).
#
# Usage: tools/check-torch2.sh [CTEST_ARGS...]      build, then ctest (e.g. -R launch)
#        tools/check-torch2.sh --run COMMAND [ARGS...]
#                                                   build, then COMMAND in the checkout inside the
#                                                   root, with BUILD=build-torch2-SUITE (e.g.
#                                                   bench/train_vs_python.sh: the C++ against the
#                                                   same LibTorch's python3-torch; or, on sid,
#                                                   env DEVICE=cpu bench/gpu.sh logits losses:
#                                                   the root starts from an empty environment)
#
# The newer suites' catch2 is 3.x, which has no single header; the tests use Catch2 2 (Debian
# 12's package), so that .deb is unpacked into the root at /opt/catch2.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
suite=${TORCH2_SUITE:-trixie}
root=${TORCH2_ROOT:-/var/tmp/loom-$suite}
build=build-torch2-$suite
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
jobs=${JOBS:-$(nproc)}
[ "$(id -u)" -eq 0 ] || { echo "check-torch2: needs root (debootstrap, chroot, mount)" >&2; exit 2; }

if [ ! -x "$root/usr/bin/apt-get" ]; then
  command -v debootstrap >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >&2
  echo "check-torch2: making a Debian $suite root in $root (a few minutes, once)" >&2
  debootstrap --variant=minbase "$suite" "$root" "$mirror" >&2
fi

# Mounts for the chroot, undone on any exit.
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
bind() {
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2"
  mounted+=("$root$2")
}
mount -t proc proc "$root/proc" && mounted+=("$root/proc")
bind /dev /dev
bind /dev/pts /dev/pts
bind /sys /sys
mount -t tmpfs tmpfs "$root/dev/shm" && mounted+=("$root/dev/shm")
bind "$repo" /loom
cp /etc/resolv.conf "$root/etc/resolv.conf"

in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }

# Loom's dependencies (tools/install-deps.sh's list less the fuzzing compilers, plus python3-torch
# for bench/, and transformers where the suite has it), only if missing.
pkgs=(cmake ninja-build g++ libtorch-dev libgloo-dev libboost-graph-dev nlohmann-json3-dev
      libcli11-dev libutf8proc-dev chromium libopenblas0-openmp python3-torch)
missing=()
for p in "${pkgs[@]}"; do
  in_root dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Debian unstable's Release files can be past their Valid-Until on a mirror that lags the clock.
echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99loom-check-torch2"
if [ ${#missing[@]} -gt 0 ]; then
  echo "check-torch2: installing ${missing[*]} in $root" >&2
  in_root apt-get update -qq >&2
  in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >&2
fi
if ! in_root dpkg-query -W -f='${Status}' python3-transformers 2>/dev/null | grep -q "install ok" &&
  in_root apt-cache policy python3-transformers 2>/dev/null | grep -q "Candidate: [0-9]"; then
  in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    python3-transformers >&2
fi
if [ ! -f "$root/opt/catch2/usr/include/catch2/catch.hpp" ]; then
  deb=$(ls /var/cache/apt/archives/catch2_2.*.deb 2>/dev/null | head -1 || true)
  if [ -z "$deb" ]; then
    (cd "$root/tmp" && apt-get download catch2 >&2)
    deb=$(ls "$root"/tmp/catch2_2.*.deb | head -1)
  fi
  mkdir -p "$root/opt/catch2"
  dpkg -x "$deb" "$root/opt/catch2"
fi

echo "check-torch2: LibTorch $(in_root dpkg-query -W -f='${Version}' libtorch-dev)," \
  "$(in_root g++ --version | head -1)" >&2
in_root cmake -S /loom -B "/loom/$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH=/opt/catch2/usr >&2
in_root cmake --build "/loom/$build" -j "$jobs" >&2
if [ "${1:-}" = --run ]; then
  shift
  in_root /bin/sh -c 'cd /loom && exec env BUILD="$0" "$@"' "$build" "$@"
else
  in_root /bin/sh -c 'cd "/loom/$0" && j=$1 && shift && exec ctest --output-on-failure -j "$j" "$@"' \
    "$build" "$jobs" "$@"
fi
