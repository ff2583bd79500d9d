#!/bin/bash
# On the GPU machine (no network): SGLang 0.5.23's Python files (from its wheel, without the
# compiled extensions) and the carried wheels, then the plugin's tests inside SGLang's own
# attention test kit (kernels/tests/test_sglang_kit.py). Usage: run.sh DEST [pytest args];
# SGLKIT_SCRIPT=path runs that script instead of the tests (eager_leg.py).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
KERNELS=$(dirname "$(dirname "$HERE")")
DEST=${1:-.sglkit}; shift || true
python3 -m pip install -q --no-deps --no-index --target /tmp/sglkit-deps "$DEST"/wheels/*.whl 2>&1 | grep -v WARN | tail -2
python3 - "$DEST" <<'PY'
import glob, sys, zipfile
wheel = zipfile.ZipFile(glob.glob(f"{sys.argv[1]}/sglang-*.whl")[0])
wheel.extractall("/tmp/sglkit-src", [n for n in wheel.namelist() if n.startswith("sglang/") and not n.endswith(".so")])
PY
# a PYTHONPATH set by the caller comes last (another Triton unpacked by pack_triton.sh, say)
export PYTHONPATH=$HERE/stubs:$KERNELS:/tmp/sglkit-src:/tmp/sglkit-deps${PYTHONPATH:+:$PYTHONPATH}
# compiled packages SGLang imports at module level: stand-ins (stubs/sitecustomize.py), found by
# importing the kit and the backend until nothing is missing
export SGLKIT_STUBS=sgl_kernel
for _ in $(seq 1 12); do
    err=$(python3 -W ignore -c "import sglang.test.kits.attention_unittest.runner_modes.speculative_target_verify_runner, sglang.srt.layers.attention.triton_backend" 2>&1 | tail -1)
    mod=$(echo "$err" | sed -n "s/.*No module named '\([^'.]*\).*/\1/p")
    [ -z "$mod" ] && break
    SGLKIT_STUBS="$SGLKIT_STUBS,$mod"
done
echo "stand-ins: $SGLKIT_STUBS${err:+; last import error: $err}"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
if [ -n "${SGLKIT_SCRIPT:-}" ]; then
    python3 -W ignore "$SGLKIT_SCRIPT"
else
    python3 -W ignore -m pytest -q "$KERNELS/tests/test_sglang_kit.py" -p no:cacheprovider -rs "$@"
fi
