"""CPU: the kernels' logic (split plan, tree mask, online softmax, merge) through Triton's
interpreter on small problems, against the float32 reference. Fresh random inputs each run;
the output starts as NaN so an unwritten element fails."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TOL = 1e-2  # bf16 inputs, bf16 P and bf16 output (see test_verify_gpu.py)


def _run(spec):
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, os.path.join(HERE, "interp_check.py"), json.dumps(spec)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


SMALL = dict(block_m=16, block_n=16, num_warps=4, num_stages=1, min_chunk=16)


@pytest.mark.parametrize("spec", [
    # several requests of different lengths, empty prefixes, t = 1, random trees, several slices
    # each, merged two partials at a time (the merge's running maximum across chunks)
    dict(lens=[0, 300, 7, 0, 95], ts=[2, 3, 1, 2, 4], heads=8, num_splits=5,
         config=dict(SMALL, idx_ahead=True, merge_tile=(64, 2))),
    # chain mask, one slice only
    dict(lens=[500], ts=[5], heads=4, num_splits=1, mask="chain", config=SMALL),
    # more slices than tokens; pages of 16; 128-column merge programs, four partials at a time
    dict(lens=[40, 33], ts=[3, 3], heads=2, num_splits=64, page_size=16,
         config=dict(SMALL, merge_tile=(128, 4))),
    # a 40-node tree: the packed mask spans two 32-bit words, with 64-wide tiles
    dict(lens=[70, 3], ts=[40, 33], heads=1, num_splits=2,
         config=dict(block_m=32, block_n=64, num_warps=4, num_stages=1, min_chunk=64, idx_ahead=True)),
], ids=["mixed-batch", "chain", "many-splits-paged", "tree-40"])
def test_kernels_match_reference(spec):
    r = _run(spec)
    assert not r["nan"], "unwritten or NaN output"
    assert r["rel_err"] < TOL, r
    assert r["lse_err"] < 2e-3, r
