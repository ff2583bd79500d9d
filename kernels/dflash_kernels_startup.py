"""The SGLang plugin's start-up part (dflash_kernels/sglang_plugin.py has the rest): what the
plugin's .pth line runs at the start of every Python process in the server's container.

Standard library only, and outside the dflash_kernels package, whose import loads torch and
triton: the process may be a health check (the image's runs `python3 -c` every 30 s) that must
not pay seconds and hundreds of MB for them. With the switch on, it installs an import hook;
only when SGLang imports its Triton backend (torch is loaded by then) does the hook import
dflash_kernels.sglang_plugin and patch the backend class.
"""
from __future__ import annotations

import importlib.abc
import os
import sys

ENV = "DFLASH_VERIFY_KERNEL"
# what switches it on: "1", or a YAML true rendered into the env file ("True", "true", "yes", "on")
ON_VALUES = ("1", "true", "yes", "on")
TARGET_MODULE = "sglang.srt.layers.attention.triton_backend"
TARGET_CLASS = "TritonAttnBackend"


# what says off without a word; any other value is off too, but said (a typo such as "2" or
# "enable" must not leave an operator believing the kernel serves)
OFF_VALUES = ("", "0", "false", "no", "off")


def enabled() -> bool:
    return os.environ.get(ENV, "0").strip().lower() in ON_VALUES


def _patch(cls) -> None:
    """Patch SGLang's backend class; on any failure leave it as it is and say why. This runs
    inside SGLang's own import of its backend: an error here (dflash_kernels built for another
    Triton, a missing module) would stop the server, where switched off it would serve."""
    try:
        from dflash_kernels.sglang_plugin import patch_backend_class
        patch_backend_class(cls)
    except Exception as error:  # noqa: BLE001 - SGLang's own verify path serves instead
        import logging
        logging.getLogger("dflash_kernels").error(
            "%s=1, but the verify kernel could not be loaded (%s: %s); SGLang's own verify path serves. "
            "Check the image's dflash_kernels against its Triton (python3 -m dflash_kernels.prebuilt), "
            "or unset %s", ENV, type(error).__name__, error, ENV, exc_info=True)


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Import hook: when TARGET_MODULE is imported, patch its TARGET_CLASS right after it runs."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET_MODULE:
            return None
        spec = None  # the spec the other finders give, with its loader wrapped
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        orig_exec = loader.exec_module

        def exec_module(module):
            orig_exec(module)
            cls = getattr(module, TARGET_CLASS, None)
            if cls is not None:
                _patch(cls)

        loader.exec_module = exec_module
        return spec


def install() -> None:
    """Patch now if SGLang's backend is already imported, else when it is imported."""
    mod = sys.modules.get(TARGET_MODULE)
    if mod is not None and hasattr(mod, TARGET_CLASS):
        _patch(getattr(mod, TARGET_CLASS))
        return
    if not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())


def uninstall_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PatchAfterImport)]


def autoload() -> None:
    """Entry of the .pth line: installs the hook only when the switch is on."""
    value = os.environ.get(ENV)
    if enabled():
        install()
    elif value is not None and value.strip().lower() not in OFF_VALUES:
        sys.stderr.write(f"dflash_kernels: {ENV}={value!r} is neither on ({', '.join(ON_VALUES)}) nor off "
                         f"({', '.join(v for v in OFF_VALUES if v)}): the verify kernel is off, SGLang's own "
                         "verify path serves\n")
