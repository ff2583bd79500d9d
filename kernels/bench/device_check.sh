#!/bin/bash
# First device call after a kernel change, inside one call's 10 minutes: the candidate variants
# side by side (each checked against the float32 reference before it is timed), then the GPU tests.
# Run from the repo root on the GPU machine, with .peer carried:
#   bash kernels/bench/device_check.sh   (VARIANTS=... POINTS=... SWEEP_ARGS=--phases change the sweep)
# Every step has a timeout: a synchronisation error in a kernel hangs rather than fails, and
# exit status 124 says which step hung. Logs (and sweep_verify.json) go to $OUT.
set -u
out=${OUT:-/tmp/device_check}
mkdir -p "$out"
export OUT=$out
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv | tee "$out/gpu.txt"
timeout 300 python kernels/bench/sweep_verify.py --variants "${VARIANTS:-gluon-n64,gluon-ws}" \
    --points "${POINTS:-131072:16,131072:64,32768:16,200000:16}" ${SWEEP_ARGS:-} 2>&1 | tee "$out/sweep.log"
echo "sweep: exit ${PIPESTATUS[0]}" | tee -a "$out/sweep.log"
SGLANG_TRITON_BACKEND_PY=$PWD/.peer/triton_backend_0.5.23.py timeout 240 \
    python -m pytest kernels/tests -q -p no:cacheprovider 2>&1 | tee "$out/pytest.log"
echo "pytest: exit ${PIPESTATUS[0]}" | tee -a "$out/pytest.log"
