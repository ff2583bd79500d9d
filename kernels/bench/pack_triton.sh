#!/usr/bin/env bash
# Packs a Triton release small enough to carry to the GPU machine (a call carries 64 MB; the
# wheel is 248 MB), to run the kernels there under another Triton than the one it ships:
#
#   bash kernels/bench/pack_triton.sh 3.8.0 .t38          # here: .t38/triton.tar.xz, about 49 MB
#   # there (carry .t38):
#   mkdir -p /tmp/t && tar -xJf .t38/triton.tar.xz -C /tmp/t
#   export PYTHONPATH=/tmp/t:$PWD/kernels TRITON_CACHE_DIR=/tmp/tc
#
# Kept: the compiler library (stripped of its symbols), ptxas, libdevice, the CUDA headers the
# launcher stub compiles against, and the AMD backend (the installed Triton's entry points name
# it, and discovery fails without it). Dropped: profiling (CUPTI, proton), the instrumentation
# test library, the Blackwell-only ptxas and the disassemblers. The wheel is for Python 3.12,
# the GPU machine's.
set -euo pipefail
version=${1:?Triton version, e.g. 3.8.0}
dest=${2:?output folder, e.g. .t38 (list it in .git/info/exclude)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 "triton==$version" -d "$work"
(cd "$work" && unzip -q triton-*.whl 'triton/*')
t=$work/triton
rm -rf "$t"/backends/nvidia/lib/cupti* "$t"/instrumentation "$t"/_C/libproton.so "$t"/profiler \
    "$t"/backends/nvidia/bin/ptxas-blackwell "$t"/backends/nvidia/bin/cuobjdump "$t"/backends/nvidia/bin/nvdisasm
strip --strip-unneeded "$t"/_C/libtriton.so
mkdir -p "$dest"
tar -C "$work" -cf - triton | xz -9 -T0 > "$dest/triton.tar.xz"
ls -la "$dest/triton.tar.xz"
