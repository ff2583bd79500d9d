"""Crash output as SGLang 0.5.23 writes it, then the process tree dies.

The scheduler logs ``Scheduler hit an exception: <traceback>`` and sends SIGQUIT
to the launcher, which logs its SIGQUIT line and SIGKILLs its process tree.
"""

from __future__ import annotations

import os
import signal
import sys

from . import logs

_PKG = "/usr/local/lib/python3.12/dist-packages"
_SCHED = f"{_PKG}/sglang/srt/managers/scheduler.py"

_HEAD = [
    (_SCHED, 6366, "run_scheduler_process", "scheduler.run_event_loop()"),
    (_SCHED, 1538, "run_event_loop", "dispatch_event_loop(self)"),
    (
        f"{_PKG}/sglang/srt/managers/scheduler_components/event_loop.py",
        212,
        "dispatch_event_loop",
        "scheduler.event_loop_overlap()",
    ),
    (f"{_PKG}/torch/utils/_contextlib.py", 120, "decorate_context", "return func(*args, **kwargs)"),
    (_SCHED, 1702, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
    (_SCHED, 3114, "run_batch", "batch_result = self.model_worker.forward_batch_generation("),
    (
        f"{_PKG}/sglang/srt/speculative/dflash_worker.py",
        688,
        "forward_batch_generation",
        "target_out = self.target_worker.forward_batch_generation(",
    ),
    (
        f"{_PKG}/sglang/srt/managers/tp_worker.py",
        702,
        "forward_batch_generation",
        "logits_output, can_run_cuda_graph = self.model_runner.forward(",
    ),
    (f"{_PKG}/sglang/srt/model_executor/model_runner.py", 2890, "forward", "output = self._forward_raw("),
    (f"{_PKG}/sglang/srt/model_executor/model_runner.py", 2964, "_forward_raw", "ret = self.forward_extend("),
    (
        f"{_PKG}/sglang/srt/model_executor/model_runner.py",
        2801,
        "forward_extend",
        "return self.model.forward(",
    ),
    (f"{_PKG}/sglang/srt/models/deepseek_v2.py", 3516, "forward", "hidden_states = self.model("),
    (
        f"{_PKG}/torch/nn/modules/module.py",
        1775,
        "_wrapped_call_impl",
        "return self._call_impl(*args, **kwargs)",
    ),
    (f"{_PKG}/torch/nn/modules/module.py", 1786, "_call_impl", "return forward_call(*args, **kwargs)"),
]

_PREFILL_OOM_TAIL = [
    (f"{_PKG}/sglang/srt/models/deepseek_v2.py", 3290, "forward", "hidden_states, residual = layer("),
    (f"{_PKG}/sglang/srt/models/deepseek_v2.py", 2911, "forward", "hidden_states = self.mlp("),
    (
        f"{_PKG}/sglang/srt/layers/moe/fused_moe_triton/layer.py",
        1120,
        "forward",
        "intermediate_cache = torch.empty(",
    ),
]

_DECODE_TAIL = [
    (
        f"{_PKG}/sglang/srt/model_executor/model_runner.py",
        2941,
        "forward_decode",
        "return self.graph_runner.replay(",
    ),
    (
        f"{_PKG}/sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
        1204,
        "replay",
        "self.graphs[self.bs].replay()",
    ),
    (f"{_PKG}/torch/cuda/graphs.py", 102, "replay", "super().replay()"),
]

_STARTUP_HEAD = [
    (_SCHED, 6360, "run_scheduler_process", "scheduler = Scheduler(server_args, port_args)"),
    (_SCHED, 612, "__init__", "self.init_model_worker()"),
    (_SCHED, 861, "init_model_worker", "self.tp_worker = TpModelWorker("),
    (f"{_PKG}/sglang/srt/managers/tp_worker.py", 318, "__init__", "self.model_runner = ModelRunner("),
    (
        f"{_PKG}/sglang/srt/model_executor/model_runner.py",
        705,
        "__init__",
        "self.initialize(min_per_gpu_memory)",
    ),
]

_KV_TAIL = [
    (
        f"{_PKG}/sglang/srt/model_executor/model_runner.py",
        1012,
        "initialize",
        "self.kv_cache_config = configure_kv_cache(self, pre_model_load_memory)",
    ),
    (
        f"{_PKG}/sglang/srt/mem_cache/kv_cache_configurator.py",
        412,
        "configure_kv_cache",
        "rest_bytes = configurator._profile_available_bytes(pre_model_load_memory)",
    ),
    (
        f"{_PKG}/sglang/srt/mem_cache/kv_cache_configurator.py",
        3051,
        "_profile_available_bytes",
        "raise ValueError(",
    ),
]

_GRAPH_TAIL = [
    (f"{_PKG}/sglang/srt/model_executor/model_runner.py", 1071, "initialize", "self.init_device_graphs()"),
    (
        f"{_PKG}/sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py",
        781,
        "capture_decode_graph",
        "runner = GraphRunnerCls(model_runner)",
    ),
    (
        f"{_PKG}/sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
        602,
        "__init__",
        "raise Exception(",
    ),
]


def _frames(frames) -> list[str]:
    out = []
    for path, line, func, code in frames:
        out.append(f'  File "{path}", line {line}, in {func}')
        out.append(f"    {code}")
    return out


def prefill_oom_traceback(oom_line: str) -> str:
    """The scheduler traceback of an activation OOM during a prefill (extend) forward."""
    lines = ["Traceback (most recent call last):"]
    lines += _frames(_HEAD + _PREFILL_OOM_TAIL)
    lines.append(oom_line)
    return "\n".join(lines)


def kv_no_memory_traceback(message: str) -> str:
    lines = ["Traceback (most recent call last):"]
    lines += _frames(_STARTUP_HEAD + _KV_TAIL)
    lines.append(f"ValueError: {message}")
    return "\n".join(lines)


def graph_oom_traceback(oom_line: str) -> str:
    """Capture failure: the OOM is re-raised as SGLang's "Capture cuda graph failed" Exception."""
    message = oom_line.split(": ", 1)[1]
    first = ["Traceback (most recent call last):"]
    first += _frames(
        [
            (
                f"{_PKG}/sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
                598,
                "__init__",
                "self.capture()",
            ),
            (
                f"{_PKG}/sglang/srt/model_executor/runner/decode_cuda_graph_runner.py",
                861,
                "capture",
                "graph, output_buffers = self.capture_one_batch_size(bs, forward, stream_idx)",
            ),
        ]
    )
    first.append(oom_line)
    second = ["Traceback (most recent call last):"]
    second += _frames(_STARTUP_HEAD + _GRAPH_TAIL)
    second.append(
        f"Exception: Capture cuda graph failed: {message}\n"
        "Possible solutions:\n"
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
        "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
        "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
        "(Not recommended. Huge performance loss)\n"
        "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
    )
    return "\n".join(
        first + ["", "During handling of the above exception, another exception occurred:", ""] + second
    )


def unknown_crash_traceback(kind: str, tp_size: int) -> str:
    """Drill crashes whose cause the toolkit cannot name: illegal memory access, NCCL."""
    lines = ["Traceback (most recent call last):"]
    if kind == "nccl":
        lines += _frames(
            _HEAD[:5]
            + [
                (_SCHED, 3114, "run_batch", "batch_result = self.model_worker.forward_batch_generation("),
                (
                    f"{_PKG}/sglang/srt/distributed/parallel_state.py",
                    623,
                    "all_reduce",
                    "torch.distributed.all_reduce(input_, group=self.device_group)",
                ),
                (f"{_PKG}/torch/distributed/c10d_logger.py", 81, "wrapper", "return func(*args, **kwargs)"),
                (
                    f"{_PKG}/torch/distributed/distributed_c10d.py",
                    2955,
                    "all_reduce",
                    "work = group.allreduce([tensor], opts)",
                ),
            ]
        )
        lines.append(
            "torch.distributed.DistBackendError: NCCL error in: "
            "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
            "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n"
            "ncclSystemError: System call (e.g. socket, malloc) or external library call failed "
            "or device error. \n"
            "Last error:\n"
            "Error while creating shared memory segment /dev/shm/nccl-Xr3k2a (size 9637888), "
            f"world size {tp_size}"
        )
    else:
        lines += _frames(
            _HEAD[:5]
            + [
                (_SCHED, 3170, "run_batch", "batch_result.copy_done.synchronize()"),
                (f"{_PKG}/torch/cuda/streams.py", 231, "synchronize", "super().synchronize()"),
            ]
        )
        lines.append(
            "RuntimeError: CUDA error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call, "
            "so the stacktrace below might be incorrect.\n"
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
        )
    return "\n".join(lines)


def die(traceback_text: str, *, serving: bool) -> None:
    """Log the scheduler exception and the launcher's SIGQUIT line, then SIGKILL the process."""
    logs.emit(f"Scheduler hit an exception: {traceback_text}", rank=0)
    if serving:
        logs.emit("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
    else:
        logs.emit("Received sigquit from a child process. It usually means the child failed.")
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
