#!/bin/bash
# On a machine with PyPI: SGLang's wheel and the Python 3.12 wheels of its pure-Python
# dependencies that the GPU machine lacks, into DEST (default .sglkit, about 55 MB: within a
# device call's carry). Then, on the GPU machine: bash kernels/bench/sglang_kit/run.sh DEST.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DEST=${1:-.sglkit}
mkdir -p "$DEST/wheels"
python3 -m pip download -q --no-deps -d "$DEST" sglang==0.5.23
grep -v '^#' "$HERE/wheels.txt" | xargs python3 -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 -d "$DEST/wheels"
du -sh "$DEST"
