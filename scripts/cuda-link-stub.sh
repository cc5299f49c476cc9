#!/usr/bin/env bash
# Writes a link-time stub of the CUDA driver library (libcuda.so, soname libcuda.so.1) for
# building `--features cuda` on a machine without an NVIDIA driver. The stub only satisfies the
# linker: at run time the real libcuda.so.1 of the GPU machine is loaded in its place.
#
#   scripts/cuda-link-stub.sh DIR      # then build with LIBRARY_PATH=DIR (see README.md, GPU)
set -euo pipefail
dir=${1:?usage: scripts/cuda-link-stub.sh DIR}
cudarc=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-* 2>/dev/null | sort -V | tail -1)
[ -n "$cudarc" ] || { echo "cudarc is not in the cargo registry yet: run 'cargo fetch' first" >&2; exit 1; }
mkdir -p "$dir"
src=$(mktemp --suffix .c)
trap 'rm -f "$src"' EXIT
grep -o 'pub unsafe fn cu[A-Za-z0-9_]*' "$cudarc/src/driver/sys/mod.rs" | awk '{print $4}' | sort -u |
    sed 's/.*/int &(void) { return 999; }/' > "$src"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/libcuda.so" "$src"
echo "wrote $dir/libcuda.so ($(wc -l < "$src") driver functions) from $cudarc"
