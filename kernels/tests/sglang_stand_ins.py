"""Stand-ins for the two sglang.srt modules that SGLang's Triton attention kernels import at module
level (`sglang.srt.environ`, `sglang.srt.utils`), so that those kernels (the peer) run from their
own files without SGLang's runtime and its GPU-only dependencies. Every environment switch reads
as off, as in a default server."""
import sys
import types

import torch


class _Switch:
    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


class _Envs:
    # SGLang's defaults for the switches its attention kernels read; any other reads as off
    DEFAULTS = {"SGLANG_FORCE_LEAN_GRID_CU_MULT": 1.0}

    def __getattr__(self, name):
        return _Switch(self.DEFAULTS.get(name, False))


def install():
    srt = types.ModuleType("sglang.srt")
    srt.__path__ = []
    environ = types.ModuleType("sglang.srt.environ")
    environ.envs = _Envs()
    utils = types.ModuleType("sglang.srt.utils")
    utils.is_cuda = lambda: torch.version.cuda is not None
    utils.is_hip = lambda: False
    utils.is_gfx95_supported = lambda: False
    utils.is_gfx1250_supported = lambda: False
    utils.get_device_core_count = lambda i=0: torch.cuda.get_device_properties(i).multi_processor_count
    sys.modules.update({"sglang.srt": srt, "sglang.srt.environ": environ, "sglang.srt.utils": utils})
