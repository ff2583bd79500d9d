"""Find OOMs and crashes in an SGLang unit's log, classify them, recommend a setting.

Library first: `OomScanner` is fed lines (journal short or short-iso format, or raw
engine lines) and returns incidents as they complete, so a live journal stream can be
watched; `analyze` is the one-shot convenience. Tracebacks spread over several journal
lines are stitched per process id. Malformed or truncated lines never raise.

Byte figures are ints in bytes. PyTorch prints sizes as `N bytes`, `x.xx KiB|MiB|GiB`
(binary units), which is what is parsed back.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from opsctl import planner
from opsctl.startup_log import GIB, EngineConfig, LogLine, StartupTracker, iter_log_lines

# Classifications.
ACTIVATION_SPIKE = "activation_spike"  # a transient did not fit the headroom (1 - fraction)
FRAGMENTATION = "fragmentation"  # the cached-but-unallocated blocks would have held it
KV_POOL = "kv_pool_too_small"  # the pool ran out (retract, prefill/decode out of memory)
STARTUP = "startup_allocation"  # weights + pool (+ graphs) do not fit at startup
WEIGHTS_LOAD = "weights_load"  # the weights alone do not fit (another process, too few GPUs): no fraction helps
HOST_MEMORY = "host_memory"  # the kernel's OOM killer: host RAM, not the GPU
NOT_MEMORY = "not_memory"  # illegal memory access, NCCL, other exceptions
UNKNOWN = "unknown"  # a kill or SIGQUIT with no cause in view

_SIZE = r"(\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB|TiB)"
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_OOM_MARK = re.compile(r"out of memory\. Tried to allocate", re.IGNORECASE)
_TRIED = re.compile(rf"Tried to allocate {_SIZE}")
_CURRENT_GPU = re.compile(rf"GPU (\d+) has a total capa\w*ty of {_SIZE} of which {_SIZE} is free")
_PROCESS = re.compile(rf"Process (\d+) has {_SIZE} memory in use")
_THIS_PROCESS = re.compile(rf"this process has {_SIZE} memory")
_ALLOCATED = re.compile(rf"Of the allocated memory {_SIZE} is allocated by PyTorch")
_PRIVATE = re.compile(rf"with {_SIZE} allocated in private pools")
_UNALLOCATED = re.compile(rf"and {_SIZE} is reserved by PyTorch but unallocated")
# Older PyTorch: `(GPU 0; 94.97 GiB total capacity; 90.12 GiB already allocated; 893.38 MiB free;
# 91.52 GiB reserved in total by PyTorch)`; before 1.4 the last item read `... cached)`.
_OLD_GPU = re.compile(rf"\(GPU (\d+); {_SIZE} total capacity")
_OLD_ALLOCATED = re.compile(rf"; {_SIZE} already allocated")
_OLD_FREE = re.compile(rf"; {_SIZE} free")
_OLD_RESERVED = re.compile(rf"; {_SIZE} (?:reserved in total by PyTorch|cached)")
_COMPLETE = re.compile(r"reserved by PyTorch but unallocated|reserved in total by PyTorch|cached\)")

_HIT_EXCEPTION = re.compile(r"(\w+) hit an exception: ?(.*)$")
_RETRACT = re.compile(r"KV cache pool is full\. Retract requests\.(?: #retracted_reqs: (\d+))?")
_KERNEL_OOM = re.compile(
    r"(?:Memory cgroup )?[Oo]ut of memory: Kill(?:ed)? process (\d+) \(([^)]*)\)"
    r"(?:.*?total-vm:(\d+)kB)?(?:.*?anon-rss:(\d+)kB)?"
)
_UNIT_OOM = "killed by the OOM killer"
_SIGQUIT = re.compile(r"Received sigquit from a child process|SIGQUIT received\.")
_KILLED = re.compile(r"Main process exited, code=(?:killed|dumped), status=(\d+)/(\w+)")
_ILLEGAL = re.compile(r"illegal memory access|misaligned address|illegal instruction|unspecified launch failure")
_NCCL = re.compile(
    r"NCCL error|nccl\w*Error|ncclInternalError|ncclUnhandledCudaError|ncclSystemError|"
    r"ncclRemoteError|Watchdog caught collective operation timeout"
)
_CUDA_ERROR = re.compile(r"CUDA error: (.*)")
_NO_KV = re.compile(
    r"Loaded weights leave no GPU memory for the KV cache|Not enough memory\. Please try to increase --mem-fraction-static"
)
_RAISE_ABOVE = re.compile(r"Raise --mem-fraction-static above (\d+\.\d+)")
# Frames of sizing the pool and capturing graphs, and of loading the weights; both are an engine
# start's, for an OOM with no start in view. Not `cuda_graph_runner` alone: 0.5.23 replays its
# prefill and decode graphs from `runner/*_cuda_graph_runner.py` while serving.
_POOL_FRAMES = re.compile(r"init_memory_pool|alloc_memory_pool|kv_cache_configurator|profile_max_num_token|"
                          r"init_cuda_graphs|capture_|init_device_graphs")
_WEIGHT_FRAMES = re.compile(r"\bload_model\b|\bload_weights\b|model_loader")
_STARTUP_FRAMES = re.compile(rf"{_POOL_FRAMES.pattern}|load_model")
# The scheduler's per-batch lines: the engine is serving.
BATCH_LINE = re.compile(r"\b(Prefill|Decode) batch\b")
# SGLang 0.5.23 runs a health check (/health and /health_generate alike) that finds the scheduler
# idle as a 1-token prefill and logs it like any batch (metrics_reporter.report_prefill_stats):
# those lines, one token a request with nothing running, are the probes' own, not work for clients
# (two probes at once, `opsctl status`'s, come as one batch of two, or one while the other waits).
_PROBE_PREFILL = re.compile(r"Prefill batch(?: \[\d+\])?, #new-seq: (\d+), #new-token: \1, .*#running-req: 0\b")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): ?(.*)$")
_MAX_PENDING_LINES = 400


def scheduler_working(line: str) -> bool:
    """A batch line of the scheduler's work for clients (not a health probe's own prefill)."""
    return bool(BATCH_LINE.search(line)) and not _PROBE_PREFILL.search(line)


def _bytes(number: str, unit: str) -> int:
    return int(round(float(number) * _UNITS[unit]))


@dataclass
class Setting:
    """One engine setting to run, with what the planner says about it when it was asked.

    `tokens`/`meets_target`/`safe` stay None without planner inputs.
    """

    fraction: float | None
    chunk: int | None
    expandable_segments: bool | None
    why: str
    tokens: int | None = None
    meets_target: bool | None = None
    safe: bool | None = None
    # the rule found the spike fits from the OOM's own figures, with no safety margin (the planner,
    # asked, may still find the headroom short)
    fits_by_oom_figures: bool = False


@dataclass
class Recommendation:
    """What to do about an incident: the action in words, settings best first, and notes."""

    action: str
    settings: list[Setting] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Incident:
    """One OOM or crash. Byte figures are bytes; None when the log did not say (or was cut)."""

    kind: str
    classification: str
    time: str | None = None
    host: str | None = None
    pid: int | None = None
    tp_rank: int | None = None
    gpu: int | None = None
    tried_bytes: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    in_use_bytes: int | None = None
    other_processes: dict[int, int] = field(default_factory=dict)
    allocated_bytes: int | None = None
    private_pool_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None
    truncated: bool = False
    phase: str = "unknown"  # startup | serving | unknown
    engine_killed: bool = False
    config: EngineConfig | None = None
    # the fraction in `config` is not the crashed run's own (its server_args line is not in the
    # log): the values in force now, given as a hint, are no evidence of what it ran with
    config_guessed: bool = False
    detail: str = ""
    lines: list[str] = field(default_factory=list)
    recommendation: Recommendation | None = None
    # the dflash verify kernel served in this engine run (its self-check passed on some rank)
    verify_kernel: bool = False

    def spike_observation(self) -> planner.SpikeObservation | None:
        """What this incident proves about the activation spike (activation/fragmentation OOMs only)."""
        if self.kind != "cuda_oom" or self.classification not in (ACTIVATION_SPIKE, FRAGMENTATION):
            return None
        if self.tried_bytes is None or self.free_bytes is None or self.config is None or self.config_guessed:
            return None
        fraction = self.config.mem_fraction_static
        chunk = self.config.chunked_prefill_size or _default_chunk(self)
        if fraction is None or not chunk:
            return None
        return planner.SpikeObservation(
            fraction=fraction,
            chunk=chunk,
            tried_bytes=self.tried_bytes,
            free_bytes=self.free_bytes,
            reserved_unallocated_bytes=self.reserved_unallocated_bytes,
            expandable_segments=self.config.expandable_segments,
            label=f"at {self.time}" if self.time else "",
        )


def _default_chunk(incident: Incident) -> int | None:
    if incident.total_bytes is None:
        return None
    return planner.default_chunked_prefill_size(incident.total_bytes / GIB)


# --- parsing one CUDA OOM message ----------------------------------------------------------


def parse_cuda_oom(text: str, incident: Incident) -> None:
    """Fill `incident` from PyTorch's OOM message (current or older form, possibly truncated)."""
    if (m := _TRIED.search(text)) is not None:
        incident.tried_bytes = _bytes(m[1], m[2])
    if (m := _CURRENT_GPU.search(text)) is not None:
        incident.gpu = int(m[1])
        incident.total_bytes = _bytes(m[2], m[3])
        incident.free_bytes = _bytes(m[4], m[5])
        incident.other_processes = {int(p[1]): _bytes(p[2], p[3]) for p in _PROCESS.finditer(text)}
        if (m := _THIS_PROCESS.search(text)) is not None:
            incident.in_use_bytes = _bytes(m[1], m[2])
        if (m := _ALLOCATED.search(text)) is not None:
            incident.allocated_bytes = _bytes(m[1], m[2])
        if (m := _PRIVATE.search(text)) is not None:
            incident.private_pool_bytes = _bytes(m[1], m[2])
        if (m := _UNALLOCATED.search(text)) is not None:
            incident.reserved_unallocated_bytes = _bytes(m[1], m[2])
    elif (m := _OLD_GPU.search(text)) is not None:
        incident.gpu = int(m[1])
        incident.total_bytes = _bytes(m[2], m[3])
        if (m := _OLD_FREE.search(text)) is not None:
            incident.free_bytes = _bytes(m[1], m[2])
        if (m := _OLD_ALLOCATED.search(text)) is not None:
            incident.allocated_bytes = _bytes(m[1], m[2])
        if (m := _OLD_RESERVED.search(text)) is not None and incident.allocated_bytes is not None:
            incident.reserved_unallocated_bytes = max(0, _bytes(m[1], m[2]) - incident.allocated_bytes)
    incident.truncated = _COMPLETE.search(text) is None


def _oom_message(lines: list[str]) -> str:
    """The OOM message from a traceback: its line plus wrapped continuation lines."""
    for index, line in enumerate(lines):
        if _OOM_MARK.search(line):
            parts = [line.strip()]
            for following in lines[index + 1 : index + 8]:
                stripped = following.strip()
                if not stripped or stripped.startswith(("Traceback", "File ", "During handling", "The above")):
                    break
                parts.append(stripped)
            return " ".join(parts)
    return ""


# --- the scanner -------------------------------------------------------------------------------


@dataclass
class _Pending:
    """A traceback or multi-line message being collected for one process."""

    first: LogLine
    lines: list[str]
    phase: str
    config: EngineConfig | None
    raw: list[str] = field(default_factory=list)
    loading_weights: bool = False  # this process's rank was loading the target's weights
    config_guessed: bool = False  # Incident.config_guessed  # the engine start in view logged "Load weight begin" and not its end


class OomScanner:
    """Feed log lines; get incidents back as they complete.

    An incident completes when its process logs its next record, when a SIGQUIT or
    kill line arrives, or on `flush()` (call it at end of input, or after a quiet
    period on a live stream). A later SIGQUIT line sets `engine_killed` on the
    incident already returned.
    """

    def __init__(self, config_hint: EngineConfig | None = None, hint_stated: bool = False) -> None:
        # hint_stated: the hint's fraction is what the crashed run used, as an operator stated it
        # (`opsctl oom --mem-fraction-static`), not merely the value in force now
        self.config_hint = config_hint
        self.hint_stated = hint_stated
        self.startups = StartupTracker()
        self._pending: dict[int | None, _Pending] = {}
        self._last: Incident | None = None
        self._batches_seen = False  # a batch line since the engine start in view (or since the first line)

    # Config and phase of the engine start the scanner is in.
    def _config(self) -> EngineConfig | None:
        run = self.startups.current
        if run is not None and run.config is not None and any(value is not None for value in vars(run.config).values()):
            return run.config.merged_with(self.config_hint)
        return replace(self.config_hint) if self.config_hint is not None else None

    def _config_guessed(self) -> bool:
        """Whether _config's fraction comes from the hint, not from the engine start's own log."""
        run = self.startups.current
        if run is not None and run.config is not None and run.config.mem_fraction_static is not None:
            return False
        return not (self.hint_stated and self.config_hint is not None)

    def _new_pending(self, rec: LogLine, lines: list[str]) -> _Pending:
        """A traceback or message to collect, with the phase of the engine start it belongs to."""
        return _Pending(rec, lines, self._phase(), self._config(), [rec.raw],
                        self.startups.loading_weights(rec.tp_rank), self._config_guessed())

    def _phase(self) -> str:
        run = self.startups.current
        if self._batches_seen:
            return "serving"
        if run is None:
            return "unknown"
        return "serving" if run.ready or run.max_total_num_tokens is not None else "startup"

    def feed(self, line: str) -> list[Incident]:
        """Take one input line (it may hold several pasted journal records)."""
        done: list[Incident] = []
        try:
            for record in iter_log_lines([line]):
                done.extend(self._feed_record(record))
        except Exception as exc:  # noqa: BLE001 - a strange line must never stop the scan
            done.extend(
                self._emit(Incident("unparsed", UNKNOWN, detail=f"line could not be parsed: {exc}", lines=[line]))
            )
        return done

    def flush(self) -> list[Incident]:
        """Complete everything still being collected."""
        done = []
        for key in list(self._pending):
            done.extend(self._finish(key))
        return done

    def _feed_record(self, rec: LogLine) -> list[Incident]:
        key = rec.pid
        pending = self._pending.get(key)
        if pending is not None and not rec.engine_record and not self._starts_record(rec):
            if len(pending.lines) < _MAX_PENDING_LINES:
                pending.lines.append(rec.msg)
                pending.raw.append(rec.raw)
            return []
        done = self._finish(key) if pending is not None else []
        run_before = self.startups.current
        self.startups.feed(rec)
        msg = rec.msg
        if self.startups.current is not run_before:
            # A new engine start: what follows belongs to it, not to the incidents of the last one.
            self._last, self._batches_seen = None, False
        if BATCH_LINE.search(msg):
            self._batches_seen = True
        if _SIGQUIT.search(msg) or _KILLED.search(msg):
            done.extend(self.flush())
            done.extend(self._crash_signal(rec))
        elif (m := _HIT_EXCEPTION.search(msg)) is not None:
            self._pending[key] = self._new_pending(rec, [m[2]] if m[2] else [])
        elif (
            _OOM_MARK.search(msg)
            or _NO_KV.search(msg)
            or "Prefill out of memory" in msg
            or "Decode out of memory" in msg
        ):
            self._pending[key] = self._new_pending(rec, [msg])
        elif (m := _RETRACT.search(msg)) is not None:
            detail = f"KV cache pool is full; {m[1] or '?'} requests retracted"
            last = self._last
            if (last is not None and last.kind == "kv_pool_full" and last.time == rec.time and last.detail == detail
                    and last.tp_rank != rec.tp_rank):
                last.lines.append(rec.raw)  # (every TP rank logs the same retraction: one incident)
            else:
                incident = self._new(rec, "kv_pool_full", KV_POOL, self._config(), self._phase())
                incident.detail = detail
                done.extend(self._emit(incident))
        elif (m := _KERNEL_OOM.search(msg)) is not None:
            incident = self._new(rec, "kernel_oom_kill", HOST_MEMORY, self._config(), self._phase())
            incident.detail = f"kernel OOM killer killed process {m[1]} ({m[2]})"
            if m[4]:
                incident.detail += f", anon-rss {int(m[4]) / (1 << 20):.2f} GiB"
            done.extend(self._emit(incident))
        elif _UNIT_OOM in msg:
            if self._last is None or self._last.kind != "kernel_oom_kill":
                incident = self._new(rec, "kernel_oom_kill", HOST_MEMORY, self._config(), self._phase())
                incident.detail = "systemd: a process of the unit was killed by the OOM killer"
                done.extend(self._emit(incident))
        elif _ILLEGAL.search(msg) or _NCCL.search(msg) or _CUDA_ERROR.search(msg):
            self._pending[key] = self._new_pending(rec, [msg])
        return done

    @staticmethod
    def _starts_record(rec: LogLine) -> bool:
        # Journal lines from systemd or the kernel, or other loggers' lines, start records too.
        return rec.ident in ("kernel", "systemd") or bool(_SIGQUIT.search(rec.msg))

    def _new(self, rec: LogLine, kind: str, classification: str, config: EngineConfig | None, phase: str,
             config_guessed: bool | None = None) -> Incident:
        run = self.startups.current
        return Incident(
            config_guessed=self._config_guessed() if config_guessed is None else config_guessed,
            kind=kind,
            classification=classification,
            time=rec.time,
            host=rec.host,
            pid=rec.pid,
            tp_rank=rec.tp_rank,
            config=config,
            phase=phase,
            lines=[rec.raw],
            verify_kernel=run is not None and any(check.passed for check in run.kernel_checks),
        )

    def _emit(self, incident: Incident) -> list[Incident]:
        if incident.recommendation is None:
            incident.recommendation = rule_recommendation(incident)
        self._last = incident
        return [incident]

    def _crash_signal(self, rec: LogLine) -> list[Incident]:
        # A kill belongs to the engine's last fatal incident; a KV-pool retraction is not fatal.
        last = self._last if self._last is not None and self._last.kind != "kv_pool_full" else None
        if last is not None and last.classification != UNKNOWN and not last.engine_killed:
            last.engine_killed = True
            last.lines.append(rec.raw)
            return []
        # SGLang's SIGQUIT handler kills the launcher too: systemd's kill line after it is the same death.
        if last is not None and (last.kind == "killed" or (last.engine_killed and _KILLED.search(rec.msg))):
            last.lines.append(rec.raw)
            return []
        incident = self._new(rec, "killed", UNKNOWN, self._config(), self._phase())
        m = _KILLED.search(rec.msg)
        incident.detail = f"killed by signal {m[2]}" if m else "SIGQUIT: a child process failed (no cause in view)"
        return self._emit(incident)

    def _finish(self, key: int | None) -> list[Incident]:
        pending = self._pending.pop(key, None)
        if pending is None:
            return []
        incident = self._classify(pending)
        if incident is None:
            return []
        # The scheduler logs "Prefill out of memory" and then raises it: one incident.
        last = self._last
        if (
            last is not None
            and last.kind == incident.kind
            and last.pid == incident.pid
            and incident.kind in ("prefill_oom", "decode_oom", "startup_no_kv_memory")
        ):
            last.lines.extend(incident.lines)
            return []
        return self._emit(incident)

    def _classify(self, pending: _Pending) -> Incident | None:
        lines = pending.lines
        text = "\n".join(lines)
        rec = pending.first
        incident = self._new(rec, "scheduler_exception", NOT_MEMORY, pending.config, pending.phase,
                             pending.config_guessed)
        incident.lines = list(pending.raw)
        oom_text = _oom_message(lines)
        if oom_text:
            incident.kind = "cuda_oom"
            parse_cuda_oom(oom_text, incident)
            incident.detail = oom_text[:300]
            startup = pending.phase == "startup" or (pending.phase == "unknown" and _STARTUP_FRAMES.search(text))
            expandable = bool(pending.config and pending.config.expandable_segments)
            # The fraction sizes the KV pool after the weights load (the target's, then in SGLang
            # 0.5.23 the DFlash draft's): an OOM while they load is no reason to lower it (the OOM
            # message names other processes that hold memory). A load after the pool (the draft's
            # in older releases) is the fraction's: it comes into the headroom the fraction leaves.
            # With no engine start in view, the traceback's frames decide.
            loading = pending.loading_weights or (pending.phase == "unknown" and _WEIGHT_FRAMES.search(text)
                                                  and not _POOL_FRAMES.search(text))
            if loading:
                incident.classification = WEIGHTS_LOAD
            elif startup:
                incident.classification = STARTUP
            elif (
                not expandable
                and incident.reserved_unallocated_bytes is not None
                and incident.tried_bytes is not None
                and incident.reserved_unallocated_bytes >= incident.tried_bytes
            ):
                incident.classification = FRAGMENTATION
            else:
                incident.classification = ACTIVATION_SPIKE
            return incident
        if (m := _NO_KV.search(text)) is not None:
            incident.kind, incident.classification = "startup_no_kv_memory", STARTUP
            incident.detail = _line_with(lines, m.group(0))
        elif "Prefill out of memory" in text or "Decode out of memory" in text:
            incident.kind = "prefill_oom" if "Prefill out of memory" in text else "decode_oom"
            incident.classification = KV_POOL
            incident.detail = " ".join(line.strip() for line in lines[:2])
        elif _ILLEGAL.search(text):
            incident.kind = "illegal_memory_access"
            incident.detail = _line_with(lines, _ILLEGAL.search(text).group(0))
        elif _NCCL.search(text):
            incident.kind = "nccl_error"
            incident.detail = _line_with(lines, _NCCL.search(text).group(0))
        elif _CUDA_ERROR.search(text):
            incident.kind = "cuda_error"
            incident.detail = _line_with(lines, "CUDA error")
        else:
            exception = next((m for line in reversed(lines) if (m := _EXCEPTION_LINE.match(line.strip()))), None)
            incident.detail = exception.group(0)[:300] if exception else (lines[-1].strip()[:300] if lines else "")
        return incident


def _line_with(lines: list[str], needle: str) -> str:
    return next((line.strip() for line in lines if needle in line), needle)[:300]


def analyze(lines: Iterable[str], config_hint: EngineConfig | None = None, hint_stated: bool = False) -> list[Incident]:
    """Every OOM and crash in `lines`, oldest first, each with a rule-based recommendation."""
    scanner = OomScanner(config_hint, hint_stated)
    incidents: list[Incident] = []
    for line in lines:
        incidents.extend(scanner.feed(line))
    incidents.extend(scanner.flush())
    return incidents


# --- recommendations ---------------------------------------------------------------------


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / GIB:.2f} GiB"


def _mib(value: int | None) -> str:
    return "?" if value is None else f"{value / (1 << 20):.2f} MiB"


def _step_down(fraction: float | None, step: float = 0.01) -> float | None:
    return None if fraction is None else round(fraction - step, 3)


def _half_chunk(chunk: int) -> int:
    return max(1024, chunk // 2)


def rule_recommendation(incident: Incident) -> Recommendation:
    """What to change, from the incident alone (no node figures)."""
    config = incident.config or EngineConfig()
    fraction = config.mem_fraction_static
    chunk = config.chunked_prefill_size if config.chunked_prefill_size and config.chunked_prefill_size > 0 else None
    chunk = chunk or _default_chunk(incident)
    c = incident.classification
    if c == ACTIVATION_SPIKE:
        settings = [
            Setting(
                _step_down(fraction),
                _half_chunk(chunk) if chunk else None,
                True,
                "0.01 more headroom, a smaller prefill spike, fragmented blocks given back",
            )
        ]
        notes = []
        if fraction is None:
            notes.append("the fraction in force is unknown: lower --mem-fraction-static by 0.01")
        if chunk and incident.tried_bytes is not None and incident.free_bytes is not None:
            shortfall = incident.tried_bytes - incident.free_bytes
            saving = incident.tried_bytes - int(incident.tried_bytes * _half_chunk(chunk) / chunk)
            if chunk > _half_chunk(chunk) and saving >= shortfall:
                settings.append(
                    Setting(
                        fraction,
                        _half_chunk(chunk),
                        True,
                        f"keeps the pool; the spike fits once the chunk halves "
                        f"(saves ~{_mib(saving)} against a {_mib(max(shortfall, 0))} shortfall)",
                        fits_by_oom_figures=True,
                    )
                )
        return Recommendation("lower the fraction and the prefill chunk; enable expandable_segments", settings, notes)
    if c == FRAGMENTATION:
        return Recommendation(
            "enable expandable_segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
            [
                Setting(
                    fraction,
                    chunk,
                    True,
                    f"{_gib(incident.reserved_unallocated_bytes)} reserved but unallocated "
                    f"would have held the {_mib(incident.tried_bytes)} allocation",
                ),
                Setting(_step_down(fraction), chunk, True, "and 0.01 more headroom if it recurs"),
            ],
        )
    if c == STARTUP:
        if incident.kind == "startup_no_kv_memory":
            m = _RAISE_ABOVE.search(" ".join(incident.lines))
            target = float(m[1]) if m else None
            if fraction is not None and (target is None or target <= fraction):  # never "raise" to where it failed
                target = round(fraction + 0.01, 3)
            return Recommendation(
                "raise --mem-fraction-static: the weights leave no room for the KV pool",
                [Setting(target, chunk, config.expandable_segments, "the smallest fraction that leaves a pool")],
                ["or use more GPUs (TP) / a smaller KV dtype"],
            )
        return Recommendation(
            "lower --mem-fraction-static: weights + KV pool + CUDA graphs do not fit at startup",
            [Setting(_step_down(fraction), chunk, True, "a smaller pool leaves room for the startup allocations")],
        )
    if c == KV_POOL:
        return Recommendation(
            "more KV cache is needed; this is not a reason to lower the fraction",
            [
                Setting(
                    round(fraction + 0.01, 3) if fraction is not None else None,
                    chunk,
                    config.expandable_segments,
                    "a larger pool, if the planner shows the headroom still fits the spike",
                )
            ],
            ["or lower --max-running-requests or --context-length"],
        )
    if c == WEIGHTS_LOAD:
        return Recommendation(
            "the weights do not fit on the GPU while they load: --mem-fraction-static cannot help (it sizes "
            "the KV pool after the weights)",
            notes=["another process holding GPU memory is the usual cause: the OOM message names it "
                   "(\"Process N has ... in use\"); check nvidia-smi on the node",
                   "otherwise the model needs more GPUs (--tp-size) or a smaller quantization"],
        )
    if c == HOST_MEMORY:
        return Recommendation(
            "host RAM ran out (kernel OOM killer): not a GPU setting",
            notes=["check host memory: pinned/offload buffers, other processes, the unit's MemoryMax"],
        )
    if c == NOT_MEMORY:
        specific = {
            "illegal_memory_access": "a kernel fault: check the attention backend and custom kernels (CUDA_LAUNCH_BLOCKING=1 locates it)",
            "nccl_error": "a collective failed: check NCCL (NCCL_DEBUG=INFO), P2P/PCIe topology, a peer rank's crash",
            "cuda_error": "a CUDA error: check the driver, the kernels and the GPU's health (Xid in dmesg)",
        }.get(incident.kind, "read the exception: it is not a memory problem")
        notes = [specific]
        if incident.verify_kernel or any("dflash_kernels" in line for line in incident.lines):
            # A fault of a custom kernel is reported at some later CUDA call: the traceback need
            # not name it. The plugin's switch takes it out of the way at the next start.
            notes.insert(0, "the dflash verify kernel served in this run: rule it out first with "
                            "DFLASH_VERIFY_KERNEL=0 (sglang_engine_env, then the playbook; SGLang's own "
                            "verify kernel serves), and keep this excerpt for the kernel's fix")
        return Recommendation("not a memory problem: leave --mem-fraction-static as it is", notes=notes)
    return Recommendation("no cause in view: read the journal lines before it", notes=["try --since earlier"])


def recommend(
    incident: Incident,
    planner_inputs: planner.PlanInputs,
    context_target: int = planner.DEFAULT_CONTEXT_TARGET,
) -> Recommendation:
    """The rule-based recommendation, checked by the planner against the context target.

    The planner is first calibrated with what this incident proved about the spike. Each
    setting gets its pool size, whether it holds the target, and whether its spike fits;
    when none holds the target, the planner's own choice is appended.
    """
    base = rule_recommendation(incident)
    inputs = planner_inputs
    if (obs := incident.spike_observation()) is not None:
        inputs = planner.calibrate_from_ooms(inputs, [obs])
    settings = []
    for setting in base.settings:
        checked = replace(setting)
        if setting.fraction is not None:
            checked.tokens = planner.max_total_num_tokens(setting.fraction, inputs)
            checked.meets_target = checked.tokens >= context_target
            if setting.chunk:
                checked.safe = planner.is_safe(
                    setting.fraction, setting.chunk, inputs, expandable=bool(setting.expandable_segments)
                )
                if not checked.safe and setting.fits_by_oom_figures:
                    checked.why += (f"; by the OOM's figures alone: the planner, with its "
                                    f"{inputs.safety_margin_gib:g} GiB safety margin, finds the headroom short")
        settings.append(checked)
    notes = list(base.notes)
    for setting in settings:
        if setting.tokens is not None and not setting.meets_target:
            notes.append(
                f"{setting.fraction} holds {setting.tokens:,} tokens, "
                f"{setting.tokens / context_target:.1%} of the {context_target:,} target"
            )
    if incident.classification in (ACTIVATION_SPIKE, FRAGMENTATION, STARTUP, KV_POOL) and not any(
        s.meets_target and s.safe is not False for s in settings
    ):
        plan = planner.recommend(context_target, inputs)
        if plan.fraction is not None:
            settings.append(
                Setting(
                    plan.fraction, plan.chunk, True, "planner: " + plan.reason, plan.tokens, plan.meets_target, True
                )
            )
    return Recommendation(base.action, settings, notes)


# --- reading the journal -----------------------------------------------------------------


class JournalError(RuntimeError):
    """journalctl is missing or failed."""


def read_journal(unit: str, since: str | None = None, last: int | None = None,
                 timeout_s: float | None = None) -> Iterator[str]:
    """Lines of `journalctl -u UNIT -o short-iso --no-pager [--since SINCE] [-n LAST]`."""
    if shutil.which("journalctl") is None:
        raise JournalError("journalctl not found; read a saved log with --file PATH (or - for stdin)")
    command = ["journalctl", "-u", unit, "-o", "short-iso", "--no-pager"]
    if since:
        command += ["--since", since]
    if last:
        command += ["-n", str(last)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, errors="replace", check=False,
                                timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise JournalError(f"journalctl did not answer within {timeout_s:.0f} s for unit {unit}") from None
    if result.returncode != 0:
        message = result.stderr.strip() or f"exit status {result.returncode}"
        raise JournalError(f"journalctl failed for unit {unit}: {message}")
    lines = [line for line in result.stdout.splitlines() if line != "-- No entries --"]
    if not lines and result.stderr.strip():  # (exit 0 and "No journal files were found.")
        raise JournalError(f"journalctl read nothing for unit {unit}: {result.stderr.strip()}")
    yield from lines
