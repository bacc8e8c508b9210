#!/usr/bin/env bash
# Builds Loom against LibTorch 2.x and runs its whole test suite there (the executor must also build
# against LibTorch 2.x). Debian 12 ships LibTorch 1.13; Debian 13 (trixie) ships 2.6
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
#        tools/check-torch2.sh --cuda                build, then compile every LibTorch translation
#                                                   unit again with LOOM_TORCH_CUDA and USE_C10D_NCCL
#                                                   against the suite's CUDA LibTorch (contrib's
#                                                   libtorch-cuda-dev, non-free's nvidia-cuda-dev,
#                                                   libnccl-dev, libcu++-dev: unpacked, not
#                                                   installed) and link loom-torch against it: the
#                                                   CUDA-only code checked on a machine without a GPU
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
if [ "${1:-}" = --cuda ]; then
  cuda=/opt/loom-cuda
  if [ ! -d "$root$cuda/usr/include/nv" ]; then
    echo "check-torch2: fetching $suite's CUDA LibTorch, CUDA, NCCL and libcu++ packages" >&2
    list="$root/etc/apt/sources.list.d/loom-cuda.list"
    echo "deb $mirror $suite contrib non-free" >"$list"
    in_root apt-get update -qq >&2
    rm -rf "$root/var/cache/loom-cuda" && mkdir -p "$root/var/cache/loom-cuda"
    in_root chown _apt /var/cache/loom-cuda 2>/dev/null || true
    in_root sh -c 'cd /var/cache/loom-cuda && apt-get download libtorch-cuda-dev \
      "$(apt-cache depends libtorch-cuda-dev | sed -n "s/.*Depends: \(libtorch-cuda-[0-9.]*\)$/\1/p")" \
      nvidia-cuda-dev libnccl-dev libcu++-dev' >&2
    rm -f "$list"
    in_root apt-get update -qq >&2
    rm -rf "$root$cuda.tmp" && mkdir -p "$root$cuda.tmp"
    for deb in "$root"/var/cache/loom-cuda/*.deb; do dpkg -x "$deb" "$root$cuda.tmp"; done
    rm -rf "$root/var/cache/loom-cuda" "$root$cuda" && mv "$root$cuda.tmp" "$root$cuda"
  fi
  include=$cuda/usr/include
  echo "check-torch2: CUDA LibTorch $(grep -h 'define TORCH_VERSION_[A-Z]* ' \
    "$root$include"/torch/csrc/api/include/torch/version.h | awk '{print $3}' | paste -sd.)" >&2
  # Each LibTorch unit's own command from the build, with the CUDA headers first, NCCL and the
  # CUDA code on, -O0 (only errors matter), its object in /tmp/loom-cuda.
  in_root python3 - "/loom/$build/compile_commands.json" "$include" <<'PY' >"$root/tmp/loom-cuda.txt"
import json, os, shlex, sys
units, include = json.load(open(sys.argv[1])), sys.argv[2]
for unit in units:
    args = shlex.split(unit["command"])
    if "/usr/include/torch/csrc/api/include" not in args:
        continue
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a == "/usr/include/torch/csrc/api/include":
            out += [include, "-isystem", include + "/torch/csrc/api/include"]
        elif a not in ("-DUSE_C10D_MPI", "-O3", "-O2"):
            out.append(a)
    # Named by the path under the build folder for a generated unit (a unity file such as
    # executor/CMakeFiles/loom_executor.dir/Unity/unity_training_cxx.cxx), else under the checkout,
    # so that each object's name starts with its library's folder (executor_, tools_, tests_).
    build = os.path.dirname(sys.argv[1])
    base = build if unit["file"].startswith(build + "/") else "/loom"
    name = os.path.relpath(unit["file"], base).replace("/", "_")
    out[1:1] = ["-DUSE_C10D_NCCL", "-DLOOM_TORCH_CUDA=1", "-O0", "-o", "/tmp/loom-cuda/" + name + ".o"]
    print(unit["directory"] + "\t" + shlex.join(out))
PY
  rm -rf "$root/tmp/loom-cuda" && mkdir -p "$root/tmp/loom-cuda"
  failed=0
  while IFS=$'\t' read -r dir command; do
    echo "${command##* }" >&2
    in_root sh -c "cd $dir && $command" >&2 || failed=$((failed + 1))
  done <"$root/tmp/loom-cuda.txt"
  echo "check-torch2: compiled $(wc -l <"$root/tmp/loom-cuda.txt") units with LOOM_TORCH_CUDA," \
    "$failed failed" >&2
  [ "$failed" -eq 0 ] || exit 1
  # loom-torch (the LibTorch half of the command line, tools/CMakeLists.txt), linked against the
  # CUDA LibTorch: every symbol Loom's objects use must be there (what those libraries need in
  # turn, cuDNN and the rest, is not installed and not asked). Loom's objects call CUDA's runtime
  # themselves (cudaMemGetInfo, c10's inline CUDA guard), so its static library is linked.
  lib=$cuda/usr/lib/x86_64-linux-gnu
  in_root sh -c "cd /tmp/loom-cuda && c++ -o loom-torch executor_*.o tools_*.o \
    /loom/$build/tools/libloom_commands.a \
    /loom/$build/lab/libloom_lab.a /loom/$build/planner/libloom_planner.a /loom/$build/costmodel/libloom_costmodel.a \
    /loom/$build/executor/libloom_executor_io.a /loom/$build/profiles/libloom_profiles.a \
    \$(sed -n 's/^UTF8PROC_LIBRARY:FILEPATH=//p' /loom/$build/CMakeCache.txt) \
    -Wl,--no-as-needed $lib/libtorch.so $lib/libtorch_cpu.so $lib/libtorch_cuda.so \
    $lib/libc10.so $lib/libc10_cuda.so -Wl,--as-needed $lib/libcudart_static.a -ldl -lrt -lpthread \
    -Wl,--unresolved-symbols=ignore-in-shared-libs -Wl,-rpath-link,$lib" >&2 ||
    { echo "check-torch2: linking loom-torch against the CUDA LibTorch failed" >&2; exit 1; }
  echo "check-torch2: loom-torch linked against the CUDA LibTorch (not run: no GPU)" >&2
  exit 0
elif [ "${1:-}" = --run ]; then
  shift
  in_root /bin/sh -c 'cd /loom && exec env BUILD="$0" "$@"' "$build" "$@"
else
  in_root /bin/sh -c 'cd "/loom/$0" && j=$1 && shift && exec ctest --output-on-failure -j "$j" "$@"' \
    "$build" "$jobs" "$@"
fi
