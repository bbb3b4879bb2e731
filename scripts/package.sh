#!/usr/bin/env bash
# Writes crun's three packages into dist/ (or --out DIR) from a built tree (scripts/build.sh,
# which links crun statically: CRUN_STATIC_DEPS). docs/install.md says which to use where.
#   crun-VERSION-linux-x86_64.tar.gz    relocatable: bin/crun, the worker SDK (headers, static
#                                       libraries, CMake package, pkg-config), docs, the
#                                       systemd unit for `crun rendezvous`
#   crun_VERSION_amd64.deb              the same under /usr (CPack)
#   crun-VERSION-py3-none-manylinux_2_N_x86_64.whl
#                                       bin/crun for `pip install`: it lands on the venv's PATH;
#                                       N is the newest glibc symbol version crun uses; and the
#                                       crun_worker module
# Usage: scripts/package.sh [--build-dir DIR] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
out=dist
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build=${2:?--build-dir needs a directory}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    *) echo "package.sh: unknown argument '$1' (expected --build-dir DIR, --out DIR)" >&2; exit 2 ;;
  esac
done
crun="$build/launcher/crun"
if [ ! -x "$crun" ]; then
  echo "package.sh: $crun not found: build first (bash scripts/build.sh)" >&2
  exit 2
fi
# A package must run where Debian's gRPC is not installed: only the C runtime may be shared.
runtime='^(linux-vdso\.so\.1|libc\.so\.6|libm\.so\.6|libgcc_s\.so\.1'
runtime+='|/lib64/ld-linux-x86-64\.so\.2)$'
extra=$(ldd "$crun" | awk '{print $1}' | grep -v -E "$runtime" || true)
if [ -n "$extra" ]; then
  echo "package.sh: $crun needs shared libraries beyond the C runtime:" $extra >&2
  echo "package.sh: configure with -DCRUN_STATIC_DEPS=ON (scripts/build.sh does)" >&2
  exit 2
fi
build=$(cd "$build" && pwd)
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# The tarball: installed for /usr/local (the systemd unit's ExecStart says so), then moved
# under one top directory; everything in it finds the rest by relative paths.
name="crun-$version-linux-x86_64"
DESTDIR="$stage/root" cmake --install "$build" --prefix /usr/local --strip >/dev/null
mv "$stage/root/usr/local" "$stage/$name"
find "$stage/$name" -name '*.a' -exec strip --strip-debug {} +  # symbols stay, DWARF goes
tar -C "$stage" -czf "$out/$name.tar.gz" --owner=0 --group=0 "$name"
echo "package.sh: $out/$name.tar.gz"

# The Debian package: the same install under /usr, by CPack (dpkg-shlibdeps works out Depends).
(cd "$stage" && cpack -G DEB --config "$build/CPackConfig.cmake" -B "$stage/deb" >/dev/null)
deb=$(ls "$stage"/deb/*.deb)
mv "$deb" "$out/"
echo "package.sh: $out/$(basename "$deb")"

# The wheel: bin/crun as a script of the wheel's data, so pip puts the binary itself on the
# venv's PATH (no Python in the way of its start). The platform tag names the newest glibc
# symbol version the binary needs: pip on an older glibc refuses it instead of failing later.
glibc=$(objdump -T "$crun" | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2 -n -u | tail -1)
tag="py3-none-manylinux_2_${glibc#GLIBC_2.}_x86_64"
wheel_dir="$stage/wheel/crun-$version"
mkdir -p "$wheel_dir/crun-$version.data/scripts" "$wheel_dir/crun-$version.dist-info"
strip -o "$wheel_dir/crun-$version.data/scripts/crun" "$crun"
# The worker module (docs/checkpoints.md), importable in the environment as crun_worker.
cp worker_sdk/python/crun_worker.py "$wheel_dir/crun_worker.py"
cat > "$wheel_dir/crun-$version.dist-info/METADATA" <<META
Metadata-Version: 2.1
Name: crun
Version: $version
Summary: Elastic launcher for distributed training, torchrun-compatible (one static binary)
License: see the project
Platform: Linux x86_64

\`pip install\` puts the \`crun\` executable on this environment's PATH, and the worker
module \`crun_worker\` (snapshots in crun's node memory, docs/checkpoints.md) in it. It needs
glibc ${glibc#GLIBC_} or newer and nothing else; see docs/install.md.
META
cat > "$wheel_dir/crun-$version.dist-info/WHEEL" <<META
Wheel-Version: 1.0
Generator: crun scripts/package.sh
Root-Is-Purelib: false
Tag: $tag
META
# Debian's python3-wheel writes RECORD (hashes) and names the file from the tag.
/usr/bin/python3 -m wheel pack --dest-dir "$out" "$wheel_dir" >/dev/null
echo "package.sh: $out/crun-$version-$tag.whl"
