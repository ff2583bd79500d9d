"""The guard's decisions, pure: what to do about an engine death, the budget, the backoff, hangs.

No I/O here: the daemon hands in what it saw (a `Death`), the config in force (a complete
`TunedValues`) and the limits (`GuardConfig`), and gets back one `Step`.

The ladder for an activation-spike OOM (PyTorch could not fit a prefill chunk's transient in
the headroom `1 - fraction`; a fragmentation OOM is the same spike that fragmentation made
miss), one rung per death, from the config in force:

1. enable expandable_segments (gives fragmented blocks back, costs nothing);
2. halve --chunked-prefill-size, down to `chunk_floor` (a smaller spike, slower long prefills);
   with chunking off (-1), first turn it on at `DEFAULT_CHUNK`: an unchunked prefill's spike
   grows with the whole prompt, and no other rung bounds it;
3. lower --mem-fraction-static by `fraction_step`, down to the lowest fraction whose KV pool
   still holds the context target per the planner (more headroom, a smaller pool).

Past the last rung the ladder is exhausted: stop and alert. Because each rung is computed from
the config in force, a replayed decision after a restart of the guard gives the same step.

A startup KV allocation failure moves the fraction the other way: "no GPU memory for the KV
cache" raises it (to the value SGLang names, its smallest fraction with room for a pool, at most
`fraction_max`; by `fraction_step` where it names none); a CUDA OOM while the pool
and graphs are allocated lowers it by one step (not below the planner's lowest fraction).

Any other death (illegal memory access, NCCL, a kill with no cause in view, host OOM) and a hang
get an as-is restart, at most `max_blind_restarts` an hour; then stop and alert, no config change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from opsctl import oom
from opsctl.config import GuardConfig
from opsctl.overrides import TunedValues

HOUR_S = 3600.0

# Causes (an `oom` classification, or one of these two).
HANG = "hang"  # /health_generate stopped answering while the unit is active
NO_CAUSE = oom.UNKNOWN

ACTIVATION_CAUSES = (oom.ACTIVATION_SPIKE, oom.FRAGMENTATION)

# Step actions.
TUNE = "tune"  # restart on new values
RESTART = "restart"  # restart on the values in force
STOP = "stop"  # do nothing more; alert

# Rungs (recorded in the audit log; stable names).
EXPANDABLE = "expandable_segments"
ENABLE_CHUNK = "enable_chunking"
HALVE_CHUNK = "halve_chunk"
LOWER_FRACTION = "lower_fraction"
RAISE_FRACTION = "raise_fraction"
AS_IS = "as_is"
NONE = "none"


@dataclasses.dataclass(frozen=True)
class Death:
    """What killed the engine, as the guard understood it."""

    cause: str  # an oom classification, HANG or NO_CAUSE
    kind: str = ""  # the incident's kind (cuda_oom, startup_no_kv_memory, nccl_error, killed, ...)
    detail: str = ""
    raise_to: float | None = None  # the fraction SGLang's "Raise --mem-fraction-static above X" asks for

    @property
    def known_memory_cause(self) -> bool:
        return self.cause in ACTIVATION_CAUSES or self.cause == oom.STARTUP


@dataclasses.dataclass(frozen=True)
class Step:
    action: str  # TUNE, RESTART or STOP
    rung: str
    to: TunedValues | None  # the complete config to run (None for STOP)
    why: str


# SGLang's --chunked-prefill-size where none is set, on GPUs of 60 to 160 GiB (the RTX PRO 6000, the
# H200); also where the ladder turns chunking on.
DEFAULT_CHUNK = 8192


def complete(values: TunedValues, default_chunk: int = DEFAULT_CHUNK) -> TunedValues:
    """The config in force with SGLang's defaults where nothing sets a value."""
    return TunedValues(values.mem_fraction_static, values.chunked_prefill_size or default_chunk,
                       bool(values.expandable_segments))


def _lower(fraction: float, step: float) -> float:
    return round(fraction - step, 3)


def activation_rungs(current: TunedValues, limits: GuardConfig,
                     lowest_fraction: Callable[[], float | None]) -> Iterable[tuple[str, TunedValues, str]]:
    """The ladder's rungs from `current` on, in order (each from the one before)."""
    values = current
    if not values.expandable_segments:
        values = dataclasses.replace(values, expandable_segments=True)
        yield EXPANDABLE, values, "enable expandable_segments: fragmented blocks can serve the spike"
    chunk = values.chunked_prefill_size or 0
    if chunk < 0:  # -1: chunking off, a prefill's spike is the whole prompt's
        chunk = max(limits.chunk_floor, DEFAULT_CHUNK)
        values = dataclasses.replace(values, chunked_prefill_size=chunk)
        yield ENABLE_CHUNK, values, (f"turn chunked prefill on at {chunk} tokens: an unchunked prefill's spike grows "
                                     "with the whole prompt")
    while chunk > limits.chunk_floor:
        chunk = max(limits.chunk_floor, chunk // 2)
        values = dataclasses.replace(values, chunked_prefill_size=chunk)
        yield HALVE_CHUNK, values, f"halve the prefill chunk to {chunk} tokens (floor {limits.chunk_floor})"
    fraction = values.mem_fraction_static
    if fraction is None:
        return
    lowest = lowest_fraction()
    if lowest is None:
        return
    while _lower(fraction, limits.fraction_step) >= lowest:
        fraction = _lower(fraction, limits.fraction_step)
        values = dataclasses.replace(values, mem_fraction_static=fraction)
        yield LOWER_FRACTION, values, (f"lower the fraction to {fraction}: more headroom; the pool still holds "
                                       f"the context target down to {lowest}")


def decide(death: Death, current: TunedValues, limits: GuardConfig, *,
           lowest_fraction: Callable[[], float | None] = lambda: None,
           blind_restarts_last_hour: int = 0,
           failed: Sequence[TunedValues] = ()) -> Step:
    """The one step to take about `death`, from the complete config in force.

    `failed`: configs a step of this guard already tried that did not come up; the ladder passes
    over them. `lowest_fraction` is called only when the fraction rung is reached.
    """
    if death.cause in ACTIVATION_CAUSES:
        for rung, values, why in activation_rungs(current, limits, lowest_fraction):
            if values not in failed:
                return Step(TUNE, rung, values, why)
        lowest = lowest_fraction() if current.mem_fraction_static is not None else None
        floor = f"the lowest fraction for the context target is {lowest}" if lowest is not None else \
            "the planner cannot say how low the fraction may go"
        return Step(STOP, NONE, None, f"the activation ladder is exhausted at {_describe(current)} "
                                      f"(chunk floor {limits.chunk_floor}; {floor})")
    if death.cause == oom.STARTUP:
        return _startup_step(death, current, limits, lowest_fraction, failed)
    if blind_restarts_last_hour >= limits.max_blind_restarts:
        return Step(STOP, NONE, None, f"{_cause_words(death)}: already restarted as-is {blind_restarts_last_hour} "
                                      f"time(s) this hour (limit {limits.max_blind_restarts}); not a memory "
                                      "problem the guard can tune, a person must look")
    return Step(RESTART, AS_IS, current, f"{_cause_words(death)}: restart as-is "
                                         f"({blind_restarts_last_hour + 1} of {limits.max_blind_restarts} this hour), "
                                         "no config change")


def _startup_step(death: Death, current: TunedValues, limits: GuardConfig,
                  lowest_fraction: Callable[[], float | None], failed: Sequence[TunedValues]) -> Step:
    fraction = current.mem_fraction_static
    if fraction is None:
        return Step(STOP, NONE, None, "a startup allocation failed and the fraction in force is unknown")
    if death.kind == "startup_no_kv_memory":
        # The value SGLang names is already its smallest with room for a pool (`death_from`): going
        # higher only takes headroom from the activations (before: the next 0.01 above it, which
        # passed `fraction_max` when SGLang named the maximum itself).
        if death.raise_to is not None and death.raise_to > fraction:
            target = round(death.raise_to, 3)
        else:
            target = round(fraction + limits.fraction_step, 3)
        values = dataclasses.replace(current, mem_fraction_static=target)
        if target > limits.fraction_max or values in failed:
            return Step(STOP, NONE, None, f"the weights leave no room for the KV pool at {fraction}; raising it to "
                                          f"{target} passes the guard's maximum {limits.fraction_max}")
        return Step(TUNE, RAISE_FRACTION, values, f"the weights leave no room for the KV pool: raise the fraction "
                                                  f"to {target}")
    lowest = lowest_fraction()
    target = _lower(fraction, limits.fraction_step)
    values = dataclasses.replace(current, mem_fraction_static=target)
    if lowest is None or target < lowest or values in failed:
        return Step(STOP, NONE, None, f"weights + KV pool + graphs do not fit at {fraction}, and {target} is below "
                                      f"the lowest fraction that holds the context target ({lowest})")
    return Step(TUNE, LOWER_FRACTION, values, f"weights + KV pool + graphs do not fit at startup: lower the fraction "
                                              f"to {target}")


def _cause_words(death: Death) -> str:
    if death.cause == HANG:
        return "hung (/health_generate does not answer)"
    if death.cause == oom.NOT_MEMORY:
        return f"not a memory problem ({death.kind})"
    if death.cause == oom.WEIGHTS_LOAD:
        return "the weights do not fit while they load (another process on the GPU?); no fraction helps"
    return f"no known cause ({death.kind or death.cause})"


def _describe(values: TunedValues) -> str:
    return (f"fraction {values.mem_fraction_static}, chunk {values.chunked_prefill_size}, "
            f"expandable_segments {values.expandable_segments}")


# --- budget and backoff ----------------------------------------------------------------------


def in_last_hour(times: Iterable[float], now: float) -> list[float]:
    return [t for t in times if now - t < HOUR_S]


def budget_left(remediation_times: Iterable[float], now: float, limits: GuardConfig) -> int:
    return max(0, limits.budget_per_hour - len(in_last_hour(remediation_times, now)))


def backoff_s(remediation_times: Sequence[float], now: float, limits: GuardConfig) -> float:
    """Seconds to wait before the next remediation: none for the first in the hour, then
    `backoff_initial_s` doubling per remediation, at most `backoff_max_s`, counted from the last one."""
    recent = sorted(in_last_hour(remediation_times, now))
    if not recent:
        return 0.0
    wait = min(limits.backoff_max_s, limits.backoff_initial_s * 2 ** (len(recent) - 1))
    return max(0.0, recent[-1] + wait - now)


# --- hangs -----------------------------------------------------------------------------------


# Batches logged beside failing probes hold a hang off for at most this many hang timeouts: a
# forward pass takes seconds, so probes that fail longer while batches go on mean the answers
# are lost on their way out (a stuck detokenizer), and a restart is due.
BUSY_HOLDS_HANG_OFF = 3


# SGLang 0.5.23 logs a prefill batch from its result, after the forward: with chunked prefill off
# (-1) a long prompt is one forward that logs nothing until it ends (the seed's 185k prompt had a
# 6-minute TTFT). The guard then waits at least this long before it calls an engine hung.
UNCHUNKED_FORWARD_S = 600.0


def hang_timeout(configured_s: float, chunked_prefill_size: int | None) -> float:
    """The hang timeout for the config in force: `configured_s`, or UNCHUNKED_FORWARD_S at least
    with chunked prefill off."""
    return max(configured_s, UNCHUNKED_FORWARD_S) if chunked_prefill_size == -1 else configured_s


class HangDetector:
    """Hung = /health_generate has not answered 200 for `hang_timeout_s`, over at least
    `min_failures` probes in a row, while the unit is active, and the scheduler has logged no
    batch for as long. One slow probe is never a hang; nor, for a while, is an engine whose
    scheduler still logs its batches (a chunk of a long prefill a line, logged as it ends; see
    `hang_timeout` for a prefill that is not chunked): a restart would only kill its requests."""

    def __init__(self, hang_timeout_s: float, min_failures: int = 3):
        self.hang_timeout_s = hang_timeout_s
        self.min_failures = min_failures
        self.failing_since: float | None = None
        self.failures = 0
        self.last_error: str | None = None
        self.progress_at: float | None = None  # the scheduler's last batch line

    def record(self, ok: bool, now: float, error: str | None = None) -> None:
        if ok:
            self.failing_since, self.failures, self.last_error = None, 0, None
            return
        if self.failing_since is None:
            self.failing_since = now
        self.failures += 1
        self.last_error = error

    def progress(self, now: float) -> None:
        self.progress_at = now

    def reset(self) -> None:
        self.record(True, 0.0)

    def failing(self, now: float) -> bool:
        """The probes alone say hung."""
        return (self.failing_since is not None and self.failures >= self.min_failures
                and now - self.failing_since >= self.hang_timeout_s)

    def busy(self, now: float) -> bool:
        """The scheduler logged a batch within the hang timeout."""
        return self.progress_at is not None and now - self.progress_at < self.hang_timeout_s

    def hung(self, now: float) -> bool:
        if not self.failing(now):
            return False
        assert self.failing_since is not None
        held_off = now - self.failing_since < BUSY_HOLDS_HANG_OFF * self.hang_timeout_s
        return not (self.busy(now) and held_off)
