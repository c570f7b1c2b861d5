#!/usr/bin/env bash
# Builds Jefferson Lab's ET (C library and its example producer and consumer) for
# `daqflow bench et --jlab-et PREFIX/bin`: the side-by-side comparison of docs/performance.md.
#
#   git clone https://github.com/JeffersonLab/et jlab-et-src
#   scripts/build-jlab-et.sh jlab-et-src /tmp/jlab-et
#   cargo run --release -- bench et --jlab-et /tmp/jlab-et/bin --out bench-out
#
# Needs a C compiler and cmake. The source is Jefferson Lab's, under its own licence; nothing
# of it is part of daqflow.
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 SOURCE_DIR PREFIX  (SOURCE_DIR: a clone of https://github.com/JeffersonLab/et)" >&2
    exit 2
fi
src=$(cd "$1" && pwd)
prefix=$2
[ -f "$src/CMakeLists.txt" ] || { echo "$src: no CMakeLists.txt (not Jefferson Lab's ET source?)" >&2; exit 1; }
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
log="$build/build.log"
if ! { cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_EXAMPLES=1 -DCMAKE_INSTALL_PREFIX="$prefix" &&
    cmake --build "$build" --parallel "$(nproc)"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "building Jefferson Lab's ET failed (above)" >&2
    exit 1
fi
mkdir -p "$prefix/bin" "$prefix/lib"
# The programs the bench runs, wherever this release's build put them.
for p in et_start et_producer et_consumer; do
    found=$(find "$build" -type f -name "$p" -perm -u+x | head -n 1)
    [ -n "$found" ] || { echo "the build made no $p" >&2; exit 1; }
    cp "$found" "$prefix/bin/"
done
find "$build" -name 'libet*.so*' -exec cp -P {} "$prefix/lib/" \;
echo "Jefferson Lab's ET in $prefix: daqflow bench et --jlab-et $prefix/bin"
