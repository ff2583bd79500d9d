"""Parse the lines SGLang prints while it starts, and the prefixes around them.

Shared by `opsctl oom` (which config was in force when a crash happened) and
`opsctl plan` (calibrating the memory model from a node's own startup figures).

Line formats understood:

* journal short:      ``May 31 10:05:32 host python[10990]: <message>``
* journal short-iso:  ``2026-05-31T10:05:32+0000 host python[10990]: <message>``
* raw engine lines:   ``[2026-05-31 10:05:32 TP0] <message>`` (or no prefix at all)

Every figure SGLang logs as ``GB`` is GiB: it divides bytes by ``1 << 30``
(``get_available_gpu_memory`` in ``sglang/srt/utils/common.py``, and
``GB = 1024 * 1024 * 1024`` in ``sglang/srt/mem_cache/memory_pool.py``, 0.5.23).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

GIB = 1 << 30
MIB = 1 << 20

_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_JOURNAL_SHORT = re.compile(
    rf"^(?P<time>{_MONTH} [ \d]\d \d\d:\d\d:\d\d) (?P<host>\S+) (?P<ident>[^\s\[:]+)(?:\[(?P<pid>\d+)\])?: ?(?P<msg>.*)$"
)
_JOURNAL_ISO = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:?\d\d|Z)?) (?P<host>\S+) (?P<ident>[^\s\[:]+)(?:\[(?P<pid>\d+)\])?: ?(?P<msg>.*)$"
)
# SGLang's logging prefix: `[2026-05-31 10:05:32 TP0] ` or `[2026-05-31 10:05:32 DP0 TP3 EP3] `
# (or ATTN_CP0, MOE_DP0 ranks), with milliseconds under SGLANG_LOG_MS (`10:05:32.123`), or, for
# processes without a rank, `[2026-05-31 10:05:32] `.
_ENGINE_PREFIX = re.compile(
    r"^\[(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)?(?P<ranks>(?: [A-Z][A-Z_]*\d+)*)\] ?(?P<msg>.*)$")
_TP_RANK = re.compile(r"\bTP(\d+)\b")
# Where a flattened excerpt (several journal records pasted on one line) starts its next record.
_EMBEDDED_JOURNAL = re.compile(rf"(?<=\S) (?={_MONTH} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s\[:]+\[\d+\]: )")


@dataclass(frozen=True)
class LogLine:
    """One log record with its journal and engine prefixes taken apart.

    `time` is the engine's own timestamp (`YYYY-MM-DD HH:MM:SS`) when the line carries
    one, else the journal's; `msg` is the text after every prefix.
    `engine_record` says whether the line started a new SGLang log record (it had the
    `[date rank]` prefix); lines without it continue a traceback or a multi-line message.
    """

    raw: str
    msg: str
    time: str | None = None
    journal_time: str | None = None
    host: str | None = None
    ident: str | None = None
    pid: int | None = None
    tp_rank: int | None = None
    engine_record: bool = False


def split_records(line: str) -> list[str]:
    """Split a line that holds several journal records (a pasted excerpt) into records."""
    line = line.rstrip("\r\n")
    return _EMBEDDED_JOURNAL.split(line) if line.count("]: ") > 1 else [line]


def parse_line(line: str) -> LogLine:
    """Take the journal prefix, then SGLang's `[date TPn]` prefix, off one record."""
    raw = line.rstrip("\r\n")
    msg = raw
    journal_time = host = ident = None
    pid: int | None = None
    match = _JOURNAL_SHORT.match(raw) or _JOURNAL_ISO.match(raw)
    if match:
        journal_time, host, ident, msg = match["time"], match["host"], match["ident"], match["msg"]
        pid = int(match["pid"]) if match["pid"] else None
    time = journal_time
    tp_rank: int | None = None
    engine_record = False
    engine = _ENGINE_PREFIX.match(msg)
    if engine:
        time, msg, engine_record = engine["time"], engine["msg"], True
        rank = _TP_RANK.search(engine["ranks"] or "")
        tp_rank = int(rank.group(1)) if rank else None
    return LogLine(raw, msg, time, journal_time, host, ident, pid, tp_rank, engine_record)


def iter_log_lines(lines: Iterable[str]) -> Iterator[LogLine]:
    """Parse lines, splitting pasted multi-record lines first."""
    for line in lines:
        for record in split_records(line):
            yield parse_line(record)


# --- engine configuration ----------------------------------------------------------------


@dataclass
class EngineConfig:
    """The memory-relevant settings an engine ran with (None: not known).

    `expandable_segments` never appears in SGLang's log: it comes from the unit's
    environment (`PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF`) via a hint.
    """

    mem_fraction_static: float | None = None
    chunked_prefill_size: int | None = None
    tp_size: int | None = None
    page_size: int | None = None
    context_length: int | None = None
    max_running_requests: int | None = None
    speculative_algorithm: str | None = None
    kv_cache_dtype: str | None = None
    model_path: str | None = None
    expandable_segments: bool | None = None

    def merged_with(self, hint: EngineConfig | None) -> EngineConfig:
        """Fill the fields this config does not know from `hint`."""
        if hint is None:
            return replace(self)
        values = {
            name: getattr(self, name) if getattr(self, name) is not None else getattr(hint, name)
            for name in self.__dataclass_fields__
        }
        return EngineConfig(**values)


_INT_KEYS = ("chunked_prefill_size", "tp_size", "page_size", "context_length", "max_running_requests")
_STR_KEYS = ("speculative_algorithm", "kv_cache_dtype", "model_path")


def _arg_value(text: str, key: str) -> str | None:
    # Matches `key=value` (ServerArgs repr, older releases) and `'key': value` (the dict
    # that 0.5.23 logs from ServerArgs.resolved_dict()).
    match = re.search(rf"""(?<![\w])['"]?{key}['"]?\s*[=:]\s*('[^']*'|"[^"]*"|[^,\)\}}\s]+)""", text)
    if not match:
        return None
    value = match.group(1).strip("'\"")
    return None if value in ("None", "null", "") else value


def parse_server_args(msg: str) -> EngineConfig | None:
    """Read the engine config from SGLang's `server_args=ServerArgs(...)` / `server_args={...}` line."""
    if "server_args=" not in msg:
        return None
    cfg = EngineConfig()
    fraction = _arg_value(msg, "mem_fraction_static")
    try:
        cfg.mem_fraction_static = float(fraction) if fraction is not None else None
    except ValueError:
        cfg.mem_fraction_static = None
    for key in _INT_KEYS:
        value = _arg_value(msg, key)
        try:
            setattr(cfg, key, int(value) if value is not None else None)
        except ValueError:
            pass
    for key in _STR_KEYS:
        setattr(cfg, key, _arg_value(msg, key))
    return cfg


def expandable_segments_from_env(value: str | None) -> bool | None:
    """Whether a `PYTORCH_CUDA_ALLOC_CONF` value turns expandable segments on (None if unset)."""
    if value is None:
        return None
    for item in value.split(","):
        key, _, setting = item.partition(":")
        if key.strip() == "expandable_segments":
            return setting.strip().lower() in ("true", "1")
    return False


# --- startup figures ----------------------------------------------------------------------

_NUM = r"(\d+(?:\.\d+)?)"
_LOAD_BEGIN = re.compile(rf"Load weight begin\. avail mem={_NUM} GB")
_LOAD_END = re.compile(rf"Load weight end\..*?avail mem={_NUM} GB, mem usage={_NUM} GB")
_KV_ALLOC = re.compile(rf"KV Cache is allocated\.(?: dtype: (\S+),)? #tokens: (\d+), KV size: {_NUM} GB")
_POOL_END = re.compile(rf"Memory pool end\. avail mem={_NUM} GB")
# 0.5.23: `Capture decode CUDA graph end. elapsed=..., mem usage=0.71 GB, avail mem=5.21 GB.`
# older:  `Capture cuda graph end. Time elapsed: 31.02 s. mem usage=0.71 GB. avail mem=5.21 GB.`
_GRAPH_END = re.compile(rf"Capture .*?cuda graph end\..*?mem usage={_NUM} GB[.,] avail mem={_NUM} GB", re.IGNORECASE)
_MAX_TOKENS = re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), .*?context_len=(\d+)")
_AVAIL_AT_END = re.compile(rf"available_gpu_mem={_NUM} GB")
READY_LINE = "The server is fired up and ready to roll!"
# The verify-kernel plugin's self-check, one line per server process when DFLASH_VERIFY_KERNEL is
# on (kernels/dflash_kernels/selfcheck.py's SelfCheck.line(), logged by sglang_plugin.py).
_KERNEL_CHECK = re.compile(r"verify kernel self-check (?P<verdict>passed|FAILED) on (?P<device>.+?): (?P<kernel>[^,]+), "
                           r"(?P<heads>\d+) heads, (?P<pool>\S+) pool, worst row error (?P<err>\S+) \([^)]*\), "
                           r"[\d.]+ s(?P<rest>.*)$")
_KERNEL_CHECK_BROKEN = "the verify kernel's self-check could not run"
# what the plugin appends after the check's own reason
_PLUGIN_SUFFIXES = ("it serves target-verify", "SGLang's own verify path serves instead")


@dataclass(frozen=True)
class KernelCheck:
    """One server process's self-check of the verify kernel: passed means the kernel serves there."""

    tp_rank: int | None
    passed: bool
    device: str = ""
    kernel: str = ""
    detail: str = ""


def parse_kernel_check(line: LogLine) -> KernelCheck | None:
    if _KERNEL_CHECK_BROKEN in line.msg:
        return KernelCheck(line.tp_rank, False, detail="the check could not run (the traceback follows it in the log)")
    match = _KERNEL_CHECK.search(line.msg)
    if match is None:
        return None
    reasons = [part for part in match["rest"].split("; ") if part and not part.startswith(_PLUGIN_SUFFIXES)]
    return KernelCheck(line.tp_rank, match["verdict"] == "passed", match["device"], match["kernel"], "; ".join(reasons))


@dataclass
class StartupFacts:
    """What one engine start logged. Memory figures are GiB as SGLang prints them (2 decimals).

    Avail figures are the minimum over the ranks that logged them: SGLang sizes the pool
    from the minimum over ranks too (`get_available_gpu_memory(distributed=True)`).
    """

    config: EngineConfig = field(default_factory=EngineConfig)
    load_begin_avail_gib: float | None = None
    load_end_avail_gib: float | None = None
    weights_gib: float | None = None
    kv_tokens: int | None = None
    kv_size_gib: float | None = None
    kv_dtype: str | None = None
    pool_end_avail_gib: float | None = None
    graph_gib: float | None = None
    graph_end_avail_gib: float | None = None
    max_total_num_tokens: int | None = None
    chunked_prefill_size: int | None = None
    context_len: int | None = None
    available_gpu_mem_gib: float | None = None
    ready: bool = False
    kernel_checks: list[KernelCheck] = field(default_factory=list)

    @property
    def sized(self) -> bool:
        """Whether the KV pool size is known (the calibration anchor)."""
        return (self.max_total_num_tokens or self.kv_tokens) is not None

    @property
    def tokens(self) -> int | None:
        return self.max_total_num_tokens if self.max_total_num_tokens is not None else self.kv_tokens


def _min(current: float | None, new: float) -> float:
    return new if current is None else min(current, new)


class StartupTracker:
    """Follows engine starts in a stream of log lines; one `StartupFacts` per start.

    A `server_args=` line, or a `Load weight begin` after a start completed
    (`max_total_num_tokens=` or the ready line), starts a new record. Lines of the draft model's runner (DFlash, EAGLE) repeat the
    `Load weight` lines with smaller figures later in the same start; only the first
    begin/end pair of each rank is kept, as that is the target model's.
    """

    def __init__(self) -> None:
        self.runs: list[StartupFacts] = []
        self._begin_ranks: set[int | None] = set()
        self._end_ranks: set[int | None] = set()
        self._open_loads: dict[int | None, int] = {}  # loads each rank began and has not ended

    @property
    def current(self) -> StartupFacts | None:
        return self.runs[-1] if self.runs else None

    def loading_weights(self, rank: int | None) -> bool:
        """Whether `rank` is loading weights before the KV pool is sized: a load it began and has
        not ended (ranks load side by side, and one may fail while another is done). SGLang 0.5.23
        loads the target, then the DFlash draft, then sizes the pool (Scheduler.init_model_worker);
        a load after the pool (the draft's in older releases) competes with the pool the fraction
        sized, so it is not counted. A rank that logged no load (a cut log) follows the start's
        ranks as a whole."""
        run = self.current
        if run is None or run.kv_tokens is not None or run.pool_end_avail_gib is not None:
            return False
        if rank in self._open_loads:
            return self._open_loads[rank] > 0
        return run.load_begin_avail_gib is not None and run.load_end_avail_gib is None

    def _new_run(self, config: EngineConfig | None = None) -> StartupFacts:
        self.runs.append(StartupFacts(config=config or EngineConfig()))
        self._begin_ranks.clear()
        self._end_ranks.clear()
        self._open_loads.clear()
        return self.runs[-1]

    def feed(self, line: LogLine) -> None:
        msg = line.msg
        if "server_args=" in msg:
            config = parse_server_args(msg)
            if config is not None:
                self._new_run(config)
            return
        run = self.current
        if (match := _LOAD_BEGIN.search(msg)) is not None:
            if run is None or run.ready or run.max_total_num_tokens is not None:
                run = self._new_run()
            self._open_loads[line.tp_rank] = self._open_loads.get(line.tp_rank, 0) + 1
            if line.tp_rank not in self._begin_ranks:
                self._begin_ranks.add(line.tp_rank)
                run.load_begin_avail_gib = _min(run.load_begin_avail_gib, float(match[1]))
            return
        if run is None:
            if not any(
                key in msg
                for key in (
                    "Load weight end",
                    "KV Cache is allocated",
                    "Memory pool end",
                    "raph end",
                    "max_total_num_tokens=",
                    "verify kernel",
                )
            ):
                return
            run = self._new_run()
        if (match := _LOAD_END.search(msg)) is not None:
            self._open_loads[line.tp_rank] = max(0, self._open_loads.get(line.tp_rank, 0) - 1)
            if line.tp_rank not in self._end_ranks:
                self._end_ranks.add(line.tp_rank)
                run.load_end_avail_gib = _min(run.load_end_avail_gib, float(match[1]))
                run.weights_gib = max(run.weights_gib or 0.0, float(match[2]))
        elif (match := _KV_ALLOC.search(msg)) is not None and "draft" not in msg.lower():
            if run.kv_tokens is None:
                run.kv_dtype, run.kv_tokens, run.kv_size_gib = match[1], int(match[2]), float(match[3])
        elif (match := _POOL_END.search(msg)) is not None:
            run.pool_end_avail_gib = _min(run.pool_end_avail_gib, float(match[1]))
        elif (match := _GRAPH_END.search(msg)) is not None:
            # Several graphs (prefill, decode, draft) may be captured: their usages add up.
            run.graph_gib = (run.graph_gib or 0.0) + float(match[1]) if line.tp_rank in (0, None) else run.graph_gib
            run.graph_end_avail_gib = _min(run.graph_end_avail_gib, float(match[2]))
        elif (match := _MAX_TOKENS.search(msg)) is not None:
            run.max_total_num_tokens = int(match[1])
            run.chunked_prefill_size = int(match[2])
            run.context_len = int(match[3])
            if (avail := _AVAIL_AT_END.search(msg)) is not None:
                run.available_gpu_mem_gib = float(avail[1])
        elif READY_LINE in msg:
            run.ready = True
        elif "verify kernel" in msg and (check := parse_kernel_check(line)) is not None:
            run.kernel_checks.append(check)


def parse_startups(lines: Iterable[str]) -> list[StartupFacts]:
    """Every engine start found in `lines`, oldest first."""
    tracker = StartupTracker()
    for line in iter_log_lines(lines):
        tracker.feed(line)
    return tracker.runs


def last_sized_startup(lines: Iterable[str]) -> StartupFacts | None:
    """The most recent start that logged its KV pool size, or None."""
    sized = [run for run in parse_startups(lines) if run.sized]
    return sized[-1] if sized else None
