"""CPU: ahead-of-time build for sm_120 and sm_90 with no GPU, and what the cubins contain."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest
import triton
from dflash_kernels import aot

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
SM120_SMEM_LIMIT = 101376  # 99 KB per block on sm_120 (RTX PRO 6000 / RTX 50xx)
HOPPER_ONLY = re.compile(r"\b(HGMMA|WGMMA|UTMALDG|UTMASTG|UTMAPF|UBLKCP|SYNCS)\b")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("aot")
    manifest = aot.build((120, 90), str(out), heads=(8,), bs_pads=(8,))
    return out, manifest


def _sass(path):
    r = subprocess.run([CUOBJDUMP, "--dump-sass", str(path)], capture_output=True, text=True, check=True)
    return r.stdout


def test_manifest(built):
    out, manifest = built
    with open(os.path.join(out, "manifest.json")) as f:
        on_disk = json.load(f)
    assert on_disk == json.loads(json.dumps(manifest))
    assert manifest["triton_version"] == triton.__version__
    assert manifest["archs"] == [120, 90]
    names = {(k["arch"], k["name"]) for k in manifest["kernels"]}
    for arch in (120, 90):
        for name in ("verify_plan", "verify_split", "verify_merge"):
            assert (arch, name) in names
    for k in manifest["kernels"]:
        assert os.path.getsize(os.path.join(out, k["cubin"])) > 0
        assert k["symbol"].startswith("_verify_")


def test_sm120_cubin_is_sm120_mma_sync_only(built):
    out, manifest = built
    cubins = sorted(glob.glob(os.path.join(out, "sm_120", "*.cubin")))
    assert len(cubins) == 3
    for c in cubins:
        sass = _sass(c)
        assert re.search(r"code for sm_120a?\b", sass), f"{c}: not sm_120 code"
        bad = set(HOPPER_ONLY.findall(sass))
        assert not bad, f"{c}: Hopper-only instructions {bad}"
    split = _sass(os.path.join(out, "sm_120", "verify_split_h8.cubin"))
    assert "HMMA.16816.F32.BF16" in split  # mma.sync tensor-core path
    for k in manifest["kernels"]:
        if k["arch"] == 120:
            assert k["shared_bytes"] <= SM120_SMEM_LIMIT, k


def test_sm90_cubin_uses_wgmma(built):
    """The same check finds Hopper instructions where they are expected, so a clean sm_120
    result above means something."""
    out, _ = built
    sass = _sass(os.path.join(out, "sm_90", "verify_split_h8.cubin"))
    assert re.search(r"code for sm_90a?\b", sass)
    assert "HGMMA" in sass


def test_cli(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dflash_kernels.aot", "--arch", "120", "--out", str(tmp_path),
                        "--heads", "16", "--batch-pad", "2"],
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr[-2000:]
    with open(tmp_path / "manifest.json") as f:
        m = json.load(f)
    assert {k["name"] for k in m["kernels"]} == {"verify_plan", "verify_split", "verify_merge"}
