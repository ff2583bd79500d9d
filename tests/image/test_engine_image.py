"""The production engine image (images/sglang/Dockerfile), built here from a locally made base.

The kernel stage runs in every CI run: Triton compiles the verify kernel for sm_120 and sm_90
with no GPU, and the stage itself checks each cubin with cuobjdump. The full image (SGLang on
top) is the opt-in `image` tier: it installs the SGLang wheel without its CUDA dependencies,
since the lab base has no CUDA; on a GPU node the base is SGLang's own CUDA image.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_BASE = "dflash-lab/debian-python:bookworm"
# The Triton of this environment (the kernels' CPU tests), not the image's default (SGLang's pin):
# the stage's cache entries are compared by name with a build here, and the names hash Triton.
TRITON_SPEC = f"triton=={version('triton')}"


def _docker_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    inspect = subprocess.run(["docker", "image", "inspect", BUILD_BASE], capture_output=True, check=False)
    return inspect.returncode == 0


@pytest.fixture(scope="module")
def context(tmp_path_factory) -> Path:
    if not _docker_ready():
        pytest.skip(f"needs a Docker engine and {BUILD_BASE}: run scripts/test.sh (or lab/build-images.sh)")
    ctx = tmp_path_factory.mktemp("image-context")
    shutil.copytree(REPO / "images" / "sglang", ctx, dirs_exist_ok=True)
    shutil.copytree(REPO / "kernels", ctx / "kernels", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # The package registries are reached through a proxy whose CA this machine trusts.
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", ctx / "extra-ca" / "host-ca.crt")
    return ctx


def _build(context: Path, tag: str, *args: str) -> None:
    result = subprocess.run(["docker", "build", "--tag", tag, *args, str(context)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def test_kernel_stage_compiles_sm120_and_sm90(context, tmp_path):
    tag = "dflash/sglang-kernel-build:test"
    _build(context, tag, "--target", "kernel-build", "--build-arg", f"BUILD_IMAGE={BUILD_BASE}",
           "--build-arg", f"TRITON_SPEC={TRITON_SPEC}")
    manifest = subprocess.run(["docker", "run", "--rm", tag, "cat", "/out/kernels/manifest.json"],
                              capture_output=True, text=True, check=True).stdout
    archs = json.loads(manifest)["archs"]
    assert sorted(int(a) for a in archs) == [90, 120]
    # Blackwell code is mma.sync only: no Hopper-only wgmma in the sm_120 cubins.
    sass = subprocess.run(
        ["docker", "run", "--rm", tag, "sh", "-c",
         "for f in /out/kernels/sm_120/*.cubin; do "
         "$(/opt/build/bin/python -c 'import triton,os;print(os.path.dirname(triton.__file__))')"
         "/backends/nvidia/bin/cuobjdump --dump-sass $f; done"],
        capture_output=True, text=True, check=True).stdout
    assert "sm_120" in sass
    assert "HMMA" in sass and "HGMMA" not in sass
    # The stage also fills a Triton cache (the runtime's TRITON_CACHE_DIR). Its entries are named
    # by Triton's cache keys: the same names as a build here, whose keys the kernels' CPU tests
    # match against the launcher's own JIT calls (kernels/tests/test_aot.py), so the image's
    # binaries are the ones that run, with no compile at first use.
    in_image = subprocess.run(["docker", "run", "--rm", tag, "ls", "/out/triton-cache"],
                              capture_output=True, text=True, check=True).stdout.split()
    here = tmp_path / "triton-cache"
    build_here = subprocess.run(
        [sys.executable, "-m", "dflash_kernels.aot", "--arch", "120", "--arch", "90", "--out", str(tmp_path / "aot"),
         "--triton-cache", str(here)],
        capture_output=True, text=True, check=False, env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert build_here.returncode == 0, build_here.stderr[-2000:]
    assert in_image and sorted(in_image) == sorted(os.listdir(here))


def _dockerfile_triton_spec() -> str:
    dockerfile = (REPO / "images" / "sglang" / "Dockerfile").read_text()
    return next(line.split("=", 1)[1] for line in dockerfile.splitlines() if line.startswith("ARG TRITON_SPEC="))


def test_kernel_stage_builds_with_sglangs_triton_without_spills(context):
    """The stage as the production image builds it, with the Dockerfile's own TRITON_SPEC (the
    Triton SGLang's torch pins, which the tests here do not run): every kernel compiles for both
    archs, and no split kernel spills (a Triton release can change register allocation)."""
    spec = _dockerfile_triton_spec()
    tag = "dflash/sglang-kernel-build:default-triton"
    _build(context, tag, "--target", "kernel-build", "--build-arg", f"BUILD_IMAGE={BUILD_BASE}")
    manifest = json.loads(subprocess.run(["docker", "run", "--rm", tag, "cat", "/out/kernels/manifest.json"],
                                         capture_output=True, text=True, check=True).stdout)
    assert spec == f"triton=={manifest['triton_version']}"
    usage = subprocess.run(
        ["docker", "run", "--rm", tag, "sh", "-c",
         "for f in /out/kernels/sm_*/verify_split*.cubin; do echo \"$f\"; "
         "$(/opt/build/bin/python -c 'import triton,os;print(os.path.dirname(triton.__file__))')"
         "/backends/nvidia/bin/cuobjdump -res-usage $f | grep -o 'STACK:[0-9]*'; done"],
        capture_output=True, text=True, check=True).stdout.split()
    stacks = dict(zip(usage[::2], usage[1::2], strict=True))
    assert len(stacks) == 2 * 2 * 6  # two archs, h = 8 and 16, three pools x two index dtypes
    assert set(stacks.values()) == {"STACK:0"}, stacks


@pytest.mark.image
def test_full_image_builds_with_sglang_and_the_kernels(context, tmp_path):
    pip_base = tmp_path / "pip-base"
    pip_base.mkdir()
    (pip_base / "Dockerfile").write_text(
        f"FROM {BUILD_BASE}\nRUN apt-get update && apt-get install -y --no-install-recommends python3-pip\n")
    _build(pip_base, "dflash-lab/debian-pip:bookworm")
    tag = "dflash/sglang:test"
    _build(context, tag, "--build-arg", f"BUILD_IMAGE={BUILD_BASE}", "--build-arg", f"TRITON_SPEC={TRITON_SPEC}",
           "--build-arg", "BASE_IMAGE=dflash-lab/debian-pip:bookworm", "--build-arg", "PIP_FLAGS=--no-deps",
           "--build-arg", f"EXTRA_PACKAGES={TRITON_SPEC}",
           # The runtime stage's cache check runs the launcher on CPU tensors, and this base has
           # no torch; kernels/tests/test_aot.py runs the same check (prebuilt.check_cache).
           "--build-arg", "KERNEL_CACHE_CHECK=0")
    labels = json.loads(subprocess.run(["docker", "image", "inspect", tag], capture_output=True, text=True,
                                       check=True).stdout)[0]["Config"]["Labels"]
    assert labels["dflash.sglang.spec"] == "sglang==0.5.23"
    assert labels["dflash.kernel.archs"] == "120 90"
    check = subprocess.run(["docker", "run", "--rm", "--entrypoint", "sh", tag, "-c",
                            "python3 -m pip show sglang dflash-kernels | grep ^Version; ls /opt/dflash/kernels"],
                           capture_output=True, text=True, check=True).stdout
    assert "Version: 0.5.23" in check
    assert "sm_120" in check and "sm_90" in check
    cache = subprocess.run(["docker", "run", "--rm", "--entrypoint", "sh", tag, "-c",
                            "echo $TRITON_CACHE_DIR; ls $TRITON_CACHE_DIR | wc -l"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert cache[0] == "/opt/dflash/triton-cache" and int(cache[1]) > 0
