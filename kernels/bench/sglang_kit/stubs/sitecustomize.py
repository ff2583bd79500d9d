# GPU machine only: stand-ins for SGLang's compiled kernel packages (too large to carry). SGLang
# imports them at module level for paths the kit tests do not take (quantised GEMMs, other
# backends); any use of one raises.
import importlib.abc
import importlib.machinery
import os
import sys
import types

STUBBED = tuple(filter(None, os.environ.get("SGLKIT_STUBS", "sgl_kernel").split(",")))


class _Missing:
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._name} is a stand-in (not carried to this machine)")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self._name}.{attr}")

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}")


def _arch_support_pdl():
    import torch  # sgl_kernel.utils' rule (and SGLang's JIT copy): Hopper and newer
    return torch.cuda.get_device_capability()[0] >= 9


# the few functions of a stubbed package that the kit's paths do call: their real rules
KNOWN = {"sgl_kernel.utils": {"is_arch_support_pdl": _arch_support_pdl}}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__dict__.update(KNOWN.get(spec.name, {}))
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
