#!/usr/bin/env bash
# The tests, from nothing: installs what they need (scripts/bootstrap.sh), builds the lab images
# and the real-SGLang parser venv, then runs pytest over every tier that needs no GPU: unit,
# engine simulator, real-SGLang parser, kernel AOT build, lint, lab integration and molecule.
# Extra arguments go to pytest, e.g. scripts/test.sh -k "not molecule" -x (a -m of your own replaces
# the "not gpu and not image" below: add those to it)
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
scripts/bootstrap.sh
lab/build-images.sh
scripts/sglang-real-env.sh .venv-sglang
# SGLang's own wheel: the planner's formulas are checked against functions read from it, the
# plugin against its backend's call site, and the kernels against its Triton kernel (interpreter).
wheel_dir=.lab/cache/wheels
ls "$wheel_dir"/sglang-0.5.23-*.whl >/dev/null 2>&1 \
    || .venv/bin/pip download -q --no-deps -d "$wheel_dir" sglang==0.5.23 2>&1 | { grep -v '^WARNING: Location' >&2 || true; }
SGLANG_WHEEL=$(ls "$wheel_dir"/sglang-0.5.23-*.whl)
export SGLANG_WHEEL
echo "[test] setup took $(( $(date +%s) - t0 )) s" >&2
exec .venv/bin/python -m pytest -m "not gpu and not image" --durations=15 "$@"
