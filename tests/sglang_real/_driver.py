"""Runs inside the SGLang venv (not the project venv).

Reads one JSON list of requests on stdin, writes one JSON list of results on
stdout. Requests:
  {"op": "parse", "argv": [...]}
      -> {"ok": true, "namespace": {...}, "launch_command": str, "repr": str}
      -> {"ok": false, "exit_code": int, "error": "<argparse message>"}
  {"op": "memory_defaults", "argv": [...], "gpu_mem_mib": float, "mla": bool}
      -> {"ok": true, "mem_fraction_static": x, "chunked_prefill_size": n,
          "decode_cuda_graph_max_bs": n}
"""

import argparse
import contextlib
import enum
import io
import json
import logging
import sys
import types
import warnings

warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)

import sglang  # noqa: E402
from sglang.srt import server_args as sa_mod  # noqa: E402


def _safe(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_safe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _safe(v) for k, v in value.items()}
    return repr(value)


def _parse(argv):
    parser = argparse.ArgumentParser(prog="sglang serve")
    sa_mod.ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"ok": False, "exit_code": exc.code, "error": lines[-1] if lines else ""}
    out = {"ok": True, "namespace": {k: _safe(v) for k, v in vars(ns).items()}}
    # The launcher's own path: prepare_server_args (config merge, record, launch_command).
    with contextlib.redirect_stderr(io.StringIO()):
        record = sa_mod.prepare_server_args(list(argv))
    logging.disable(logging.CRITICAL)
    out["launch_command"] = record.launch_command
    out["repr"] = repr(record)
    return out


_fake_model_config = None


def _install_model_config_standin():
    # sglang.srt.configs.model_config needs transformers and a checkpoint; the
    # memory hook only reads attention_arch and is_multimodal from it.
    global _fake_model_config
    if _fake_model_config is not None:
        return
    mod = types.ModuleType("sglang.srt.configs.model_config")

    class AttentionArch(enum.Enum):
        MLA = enum.auto()
        MHA = enum.auto()

    class ModelConfig:
        pass

    mod.AttentionArch, mod.ModelConfig = AttentionArch, ModelConfig
    sys.modules.setdefault("sglang.srt.configs.model_config", mod)
    _fake_model_config = mod


def _memory_defaults(req):
    _install_model_config_standin()
    from sglang.srt.arg_groups import cuda_graph_hook, memory_hook
    from sglang.srt.arg_groups.overrides import resolution_result

    mod = sys.modules["sglang.srt.configs.model_config"]
    fake = mod.ModelConfig()
    fake.attention_arch = mod.AttentionArch.MLA if req.get("mla", True) else mod.AttentionArch.MHA
    fake.is_multimodal = False
    gpu = req["gpu_mem_mib"]
    memory_hook.get_device_memory_capacity = lambda device=None: gpu
    with contextlib.redirect_stderr(io.StringIO()):
        record = sa_mod.prepare_server_args(list(req["argv"]) + ["--device", "cuda"])
    logging.disable(logging.CRITICAL)
    record._model_config = fake
    record._raw_input = {f: getattr(record, f) for f in type(record).__struct_fields__}
    record._resolved_overrides = []
    cuda_graph_hook.handle_cuda_graph_config(record)
    memory_hook.handle_gpu_memory_settings(record)
    return {
        "ok": True,
        "mem_fraction_static": resolution_result(record, "mem_fraction_static"),
        "chunked_prefill_size": resolution_result(record, "chunked_prefill_size"),
        "decode_cuda_graph_max_bs": resolution_result(record, "cuda_graph_config").decode.max_bs,
    }


def main():
    requests = json.load(sys.stdin)
    results = []
    for req in requests:
        try:
            if req["op"] == "parse":
                results.append(_parse(req["argv"]))
            elif req["op"] == "memory_defaults":
                results.append(_memory_defaults(req))
            elif req["op"] == "version":
                results.append({"ok": True, "version": sglang.__version__})
            else:
                results.append({"ok": False, "exit_code": None, "error": f"unknown op {req['op']}"})
        except Exception as exc:  # report, keep going
            results.append({"ok": False, "exit_code": None, "error": f"{type(exc).__name__}: {exc}"})
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()
