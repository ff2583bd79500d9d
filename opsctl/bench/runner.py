"""The long-context sweep: one streaming request per point, unique prompts, kept results.

Method (what the seed's first attempt got wrong, and what this does instead):
- One prefill per measurement. TTFT comes from the first streamed token; the decode rate
  from the tokens after it: (n_last - n_first) / (t_last - t_first), which is the usual
  (n - 1) / (t_last - t_first) when the first chunk holds one token. No second request
  per point, so no doubled memory pressure and nothing for a prefix cache to serve.
- Every prompt starts with a nonce, so no prefix is cached; `/flush_cache` before each
  request is optional on top. A response reporting `cached_tokens > 0` is flagged and left
  out of the medians.
- Health check before each point. When a request fails and `/health` fails too, the sweep
  stops, keeps the points measured so far and says where and why; `resume_from` continues
  at the first missing point.
- The results document is written atomically after every point (tmp file + os.replace).

Units are in the names: `_s` seconds, `_ms` milliseconds, `_tok_s` tokens per second.
"""

from __future__ import annotations

import json
import math
import platform
import re
import socket
import statistics
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from opsctl import __version__
from opsctl.bench import prompts
from opsctl.bench.client import BenchClient, RequestFailed, RequestStopped, StreamResult

SCHEMA = "opsctl.bench/1"
PROMPT_MODES = ("ids", "text")
WARMUP_TOKENS = 256
WARMUP_GEN = 4
# Text mode: the reported prompt length may differ this much from the request before the
# sample is flagged (the tokenizer, not the tool, decides the count).
TEXT_TOLERANCE = 0.02
METRICS = ("ttft_s", "prefill_tok_s", "decode_tok_s", "step_ms", "accept_length")

JournalExcerpt = Callable[[], "str | None"]


# -- settings and records ---------------------------------------------------------------


@dataclass
class SweepSettings:
    """What is measured. The fields in `fingerprint()` must match for `--resume`."""

    contexts: list[int]  # requested prompt lengths, tokens
    gen: int = 32  # output tokens per request (ignore_eos, so always exactly this many)
    repeats: int = 1  # requests per point; medians and spread when > 1
    flush: bool = True  # POST /flush_cache before each request
    prompt_mode: str = "ids"  # "ids" (exact, input_ids) or "text" (checked against prompt_tokens)
    warmup: bool = True  # one short request before the sweep, not recorded
    timeout_s: float | None = None  # per request; None scales it with the context

    def fingerprint(self) -> dict[str, Any]:
        return {
            "contexts": list(self.contexts),
            "gen": self.gen,
            "repeats": self.repeats,
            "flush": self.flush,
            "prompt_mode": self.prompt_mode,
        }

    def validate(self) -> None:
        if self.gen < 2:
            raise ValueError("--gen must be at least 2 (the decode rate needs two tokens)")
        if self.repeats < 1:
            raise ValueError("--repeats must be at least 1")
        if self.prompt_mode not in PROMPT_MODES:
            raise ValueError(f"prompt mode must be one of {', '.join(PROMPT_MODES)}")
        if not self.contexts:
            raise ValueError("no context lengths to measure")


@dataclass
class Sample:
    """One streamed request."""

    context_requested: int  # tokens asked for
    repeat: int  # 0-based repeat index at this point
    prompt_tokens: int  # as reported by the server
    cached_tokens: int  # as reported; > 0 means a prefix cache served part of the prompt
    completion_tokens: int
    ttft_s: float  # send -> first streamed token
    prefill_tok_s: float  # prompt_tokens / ttft_s
    decode_tok_s: float | None  # tokens after the first chunk / (t_last - t_first)
    step_ms: float | None  # decode window / verify (or decode) steps in it
    decode_steps: float | None  # steps in the decode window
    accept_length: float | None  # spec_accept_length, or completion_tokens / spec_verify_ct
    spec_verify_ct: int | None
    decode_ctx_mean: float  # mean context length over the decode steps, tokens
    decode_window_s: float  # t_last - t_first
    e2e_latency_s: float | None  # server-reported
    wall_s: float  # send -> end of stream
    first_chunk_tokens: int
    flags: list[str] = field(default_factory=list)  # "cached", "prompt_mismatch", "short_output"

    @property
    def valid(self) -> bool:
        return "cached" not in self.flags


@dataclass
class PointResult:
    """One context length: its samples and the medians of the valid ones."""

    context_requested: int
    status: str  # "ok"; "cached" (every sample flagged); "error" (request failed, server up)
    samples: list[Sample] = field(default_factory=list)
    n_valid: int = 0
    prompt_tokens: float | None = None  # medians over the valid samples from here on
    decode_ctx_mean: float | None = None
    ttft_s: float | None = None
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    step_ms: float | None = None
    accept_length: float | None = None
    spread: dict[str, list[float]] = field(default_factory=dict)  # metric -> [min, max]
    error: str | None = None

    @property
    def done(self) -> bool:
        """Measured (possibly flagged); an "error" point is measured again on resume."""
        return self.status in ("ok", "cached")


@dataclass
class StopInfo:
    kind: str  # "server_died", "server_down", "interrupted", "warmup_failed"
    context: int | None  # the point that was being measured, tokens requested
    reason: str
    journal: str | None = None  # excerpt of the node's journal, when reachable


@dataclass
class RunResult:
    settings: SweepSettings
    meta: dict[str, Any] = field(default_factory=dict)
    points: list[PointResult] = field(default_factory=list)
    stopped: StopInfo | None = None
    fit: dict[str, float] | None = None
    floor: dict[str, Any] | None = None  # see opsctl.bench.floor.Floor.to_dict

    @property
    def complete(self) -> bool:
        done = {p.context_requested for p in self.points if p.done}
        return self.stopped is None and all(c in done for c in self.settings.contexts)

    def point(self, context: int) -> PointResult | None:
        return next((p for p in self.points if p.context_requested == context), None)

    def to_dict(self) -> dict[str, Any]:
        from opsctl.bench.floor import Floor

        floor = (
            Floor(**{k: self.floor[k] for k in ("bandwidth_tbs", "kv_cell_bytes", "label")})
            if self.floor
            else None
        )
        points = []
        for p in self.points:
            d = asdict(p)
            if floor and p.decode_ctx_mean is not None:
                d["floor_step_ms"] = floor.step_ms(p.decode_ctx_mean)
                d["x_floor"] = p.step_ms / d["floor_step_ms"] if p.step_ms else None
            points.append(d)
        return {
            "schema": SCHEMA,
            "kind": "sweep",
            "complete": self.complete,
            "settings": asdict(self.settings),
            "meta": self.meta,
            "floor": self.floor,
            "fit": self.fit,
            "stopped": asdict(self.stopped) if self.stopped else None,
            "points": points,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("kind") != "sweep":
            schema = data.get("schema") if isinstance(data, dict) else None
            raise ValueError(f"not an opsctl bench sweep file (schema {schema!r})")
        settings = SweepSettings(**_known(SweepSettings, data["settings"]))
        points = []
        for pd in data.get("points", []):
            samples = [Sample(**_known(Sample, s)) for s in pd.get("samples", [])]
            pdict = _known(PointResult, pd)
            pdict["samples"] = samples
            points.append(PointResult(**pdict))
        stopped = StopInfo(**data["stopped"]) if data.get("stopped") else None
        return cls(settings, data.get("meta", {}), points, stopped, data.get("fit"), data.get("floor"))


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def load_result(path: str | Path) -> RunResult:
    with open(path, encoding="utf-8") as f:
        return RunResult.from_dict(json.load(f))


def save_result(result: RunResult, path: str | Path) -> None:
    """Write the results document atomically and durably (fsynced, as opsctl's own state): a
    crash or a power loss never leaves half a file, or an empty one."""
    from opsctl.state import atomic_write

    atomic_write(Path(path), json.dumps(result.to_dict(), indent=2) + "\n")


class SettingsMismatch(ValueError):
    """--resume was asked with settings other than the file's."""


def check_resumable(previous: RunResult, settings: SweepSettings) -> None:
    old, new = previous.settings.fingerprint(), settings.fingerprint()
    diffs = [f"{k}: file has {old[k]!r}, asked {new[k]!r}" for k in old if old[k] != new[k]]
    if diffs:
        raise SettingsMismatch(
            "cannot resume with different settings (" + "; ".join(diffs) + "). "
            "Drop the differing options to reuse the file's, or start a new --out file."
        )


# -- measurement ------------------------------------------------------------------------


def summarize(
    stream: StreamResult,
    context_requested: int,
    repeat: int,
    expected_prompt_tokens: int | None,
    gen: int,
    tolerance: float = 0.0,
) -> Sample:
    """Turn one streamed request into a Sample (raises RequestFailed if nothing streamed)."""
    if not stream.chunks:
        raise RequestFailed("the stream carried no tokens")
    meta = stream.meta
    first, last = stream.chunks[0], stream.chunks[-1]
    prompt_tokens = int(meta.get("prompt_tokens") or 0)
    cached = int(meta.get("cached_tokens") or 0)
    n = int(meta.get("completion_tokens") or last.completion_tokens)
    ttft = first.t - stream.t_send
    window = last.t - first.t
    dtoks = last.completion_tokens - first.completion_tokens
    vct = meta.get("spec_verify_ct")
    vct = int(vct) if vct is not None else None
    acc = meta.get("spec_accept_length")
    accept = float(acc) if acc is not None else (n / vct if vct else None)

    if (
        first.spec_verify_ct is not None
        and last.spec_verify_ct is not None
        and last.spec_verify_ct > first.spec_verify_ct
    ):
        steps: float | None = float(last.spec_verify_ct - first.spec_verify_ct)
    elif vct and n > 1 and dtoks > 0:
        # Verify steps follow the prefill's token; share them out by tokens committed.
        steps = vct * dtoks / (n - 1)
    elif dtoks > 0:
        steps = dtoks / accept if accept else float(dtoks)
    else:
        steps = None
    decode_tok_s = dtoks / window if dtoks > 0 and window > 0 else None
    step_ms = window * 1e3 / steps if steps and window > 0 else None

    flags = []
    if cached > 0:
        flags.append("cached")
    if expected_prompt_tokens is not None and prompt_tokens:
        if abs(prompt_tokens - expected_prompt_tokens) > tolerance * expected_prompt_tokens:
            flags.append("prompt_mismatch")
    if n < gen:
        flags.append("short_output")
    e2e = meta.get("e2e_latency")
    return Sample(
        context_requested=context_requested,
        repeat=repeat,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        completion_tokens=n,
        ttft_s=ttft,
        prefill_tok_s=prompt_tokens / ttft if ttft > 0 else math.inf,
        decode_tok_s=decode_tok_s,
        step_ms=step_ms,
        decode_steps=steps,
        accept_length=accept,
        spec_verify_ct=vct,
        # Steps in the window run at contexts prompt + n_first ... prompt + n_last - 1.
        decode_ctx_mean=prompt_tokens + (first.completion_tokens + last.completion_tokens - 1) / 2,
        decode_window_s=window,
        e2e_latency_s=float(e2e) if e2e is not None else None,
        wall_s=stream.t_end - stream.t_send,
        first_chunk_tokens=first.completion_tokens,
        flags=flags,
    )


def aggregate(context: int, samples: list[Sample]) -> PointResult:
    """Medians and [min, max] of the valid (uncached) samples."""
    valid = [s for s in samples if s.valid]
    point = PointResult(context_requested=context, status="ok" if valid else "cached", samples=samples)
    point.n_valid = len(valid)
    if not valid:
        return point
    point.prompt_tokens = statistics.median(s.prompt_tokens for s in valid)
    point.decode_ctx_mean = statistics.median(s.decode_ctx_mean for s in valid)
    for name in METRICS:
        values = [getattr(s, name) for s in valid if getattr(s, name) is not None]
        if values:
            setattr(point, name, statistics.median(values))
            point.spread[name] = [min(values), max(values)]
    return point


def fit_step_time(points: list[PointResult]) -> dict[str, float] | None:
    """Least-squares line step_ms = ms_at_zero + ms_per_1k * (decode context / 1000)."""
    xy = [
        (p.decode_ctx_mean / 1000, p.step_ms) for p in points if p.step_ms is not None and p.decode_ctx_mean
    ]
    if len(xy) < 2:
        return None
    n = len(xy)
    mx = sum(x for x, _ in xy) / n
    my = sum(y for _, y in xy) / n
    sxx = sum((x - mx) ** 2 for x, _ in xy)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in xy) / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for _, y in xy)
    ss_res = sum((y - intercept - slope * x) ** 2 for x, y in xy)
    r2 = 1 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return {"ms_per_1k": slope, "ms_at_zero": intercept, "r2": r2, "n_points": n}


def default_timeout_s(context: int, gen: int, measured: list[PointResult] | None = None) -> float:
    """Per-request timeout, scaled to the context.

    With earlier points measured: four times a pessimistic projection from the largest one
    (prefill quadratic, step time linear in context), at least 60 s. Before that: a formula
    that covers the seed's slowest node (185k: 6.4 min TTFT + 1.4 s/step) with margin.
    """
    prior = [p for p in (measured or []) if p.ttft_s and p.step_ms and p.prompt_tokens]
    if prior:
        ref = max(prior, key=lambda p: p.prompt_tokens or 0)
        scale = max(1.0, context / ref.prompt_tokens)
        predicted = ref.ttft_s * scale**2 + gen * ref.step_ms / 1e3 * scale
        return max(60.0, 4 * predicted)
    k = context / 1000
    return 60 + 2.0 * k + 0.02 * k * k + gen * (0.05 + 0.02 * k)


class SweepObserver:
    """Progress hooks; the CLI draws a progress bar from them. All are optional."""

    def sweep_started(self, result: RunResult, todo: list[int]) -> None: ...
    def point_started(self, index: int, total: int, context: int, repeat: int, repeats: int) -> None: ...
    def phase(self, text: str) -> None: ...
    def sample_done(self, sample: Sample) -> None: ...
    def point_done(self, point: PointResult) -> None: ...
    def message(self, text: str) -> None: ...


# SGLang 0.5.23's /server_info is its resolved server_args: the API keys in clear (results files
# are shared and committed). Any other field named like a secret, or a command line's value of
# such a flag, is hidden too.
_SECRET_FIELD = re.compile(r"(?:^|_)(?:api_key|password|secret|watermark_key(?:_b)?)$")
_SECRET_FLAG = re.compile(r"(--(?:admin-)?api-key(?:=|\s+))\S+")


def redact_secrets(value: Any) -> Any:
    """`value` (JSON-like) with secrets' values replaced by "***"."""
    if isinstance(value, dict):
        return {key: "***" if _SECRET_FIELD.search(str(key)) and value[key] else redact_secrets(value[key])
                for key in value}
    if isinstance(value, list):
        return [redact_secrets(item) for item in value]
    if isinstance(value, str):
        return _SECRET_FLAG.sub(r"\1***", value)
    return value


def collect_meta(client: BenchClient, info: dict[str, Any] | None) -> dict[str, Any]:
    info = redact_secrets(info or {})
    server_args = {k: v for k, v in info.items() if k != "internal_states"}
    return {
        "date": _now(),
        "url": client.url,
        "node": urlparse(client.url).hostname,
        "client_host": socket.gethostname(),
        "opsctl_version": __version__,
        "httpx_version": httpx.__version__,
        "python": platform.python_version(),
        "server_version": info.get("version"),
        "server_args": server_args or None,
        "internal_states": info.get("internal_states"),
        "radix_cache_disabled": info.get("disable_radix_cache"),
        "segments": [],
    }


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _args_diff(old: dict | None, new: dict | None) -> dict[str, list]:
    old, new = old or {}, new or {}
    return {k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def run_sweep(
    settings: SweepSettings,
    client: BenchClient,
    *,
    out_path: str | Path | None = None,
    resume_from: RunResult | None = None,
    observer: SweepObserver | None = None,
    journal_excerpt: JournalExcerpt | None = None,
    floor: dict[str, Any] | None = None,
    meta_extra: dict[str, Any] | None = None,
    health_retries: int = 2,
    health_retry_delay_s: float = 2.0,
) -> RunResult:
    """Measure every context in `settings` not yet measured in `resume_from`.

    Returns the RunResult; it has `stopped` set when the server died or failed its health
    check (kind "server_died"/"server_down"), the warm-up failed, or on Ctrl-C
    ("interrupted"). The results so far are in it and, with `out_path`, on disk.
    """
    import time

    settings.validate()
    obs = observer or SweepObserver()
    if resume_from is not None:
        check_resumable(resume_from, settings)
        result = resume_from
        result.settings = settings
        result.stopped = None
        result.points = [p for p in result.points if p.done]
    else:
        result = RunResult(settings=settings)
    if floor is not None:
        result.floor = floor
    todo = [c for c in settings.contexts if not (result.point(c) and result.point(c).done)]

    def save() -> None:
        result.points.sort(key=lambda p: settings.contexts.index(p.context_requested))
        result.fit = fit_step_time([p for p in result.points if p.status == "ok"])
        if out_path is not None:
            save_result(result, out_path)

    def healthy() -> tuple[bool, str]:
        h = client.health()
        for _ in range(health_retries):
            if h.ok:
                break
            time.sleep(health_retry_delay_s)
            h = client.health()
        return h.ok, h.detail

    def stop(kind: str, context: int | None, reason: str, with_journal: bool = True) -> RunResult:
        journal = None
        if with_journal and journal_excerpt is not None:
            try:
                journal = journal_excerpt()
            except Exception as exc:  # the excerpt is a courtesy; never lose results over it
                journal = f"(journal not readable: {exc})"
        result.stopped = StopInfo(kind, context, reason, journal)
        save()
        return result

    current: int | None = todo[0] if todo else None
    try:
        ok, detail = healthy()
        if not ok:
            return stop("server_down", current, f"server not healthy before the sweep: /health {detail}")
        info = client.server_info()
        if result.floor and result.floor.pop("kv_cell_from_server", False):
            from opsctl.bench.floor import Floor, kimi_kv_cell_bytes

            result.floor = Floor(result.floor["bandwidth_tbs"], kimi_kv_cell_bytes((info or {}).get("kv_cache_dtype")),
                                 result.floor["label"]).to_dict()
        if resume_from is None:
            result.meta = collect_meta(client, info)
        result.meta.update(meta_extra or {})
        segment = {
            "date": _now(),
            "url": client.url,
            "first_context": current,
            "server_version": (info or {}).get("version"),
        }
        if resume_from is not None:
            new_args = {k: v for k, v in (info or {}).items() if k != "internal_states"}
            segment["server_args_changed"] = _args_diff(result.meta.get("server_args"), new_args)
        result.meta.setdefault("segments", []).append(segment)
        obs.sweep_started(result, todo)

        words_per_token = 1.0  # text mode: words to send per requested token, from the warm-up
        if settings.warmup and todo:
            obs.phase("warm-up")
            n = min(WARMUP_TOKENS, min(settings.contexts))
            try:
                warm = _request(client, settings, n, WARMUP_GEN, 120.0, words_per_token)
            except RequestFailed as exc:
                ok, detail = healthy()
                kind = "warmup_failed" if ok else "server_died"
                return stop(kind, current, f"warm-up request failed: {exc}; /health: {detail}", not ok)
            reported = int(warm.meta.get("prompt_tokens") or 0)
            if settings.prompt_mode == "text" and reported > 0:
                words_per_token = n / reported
            segment["warmup_prompt_tokens"] = reported

        measured_ok = [p for p in result.points if p.status == "ok"]
        for index, context in enumerate(todo):
            current = context
            obs.point_started(index, len(todo), context, 0, settings.repeats)
            obs.phase("health check")
            ok, detail = healthy()
            if not ok:
                return stop(
                    "server_down",
                    context,
                    f"/health failed before point {prompts.format_context(context)}: {detail}",
                )
            timeout = settings.timeout_s or default_timeout_s(context, settings.gen, measured_ok)
            samples: list[Sample] = []
            error: str | None = None
            for repeat in range(settings.repeats):
                if repeat:
                    obs.point_started(index, len(todo), context, repeat, settings.repeats)
                if settings.flush:
                    obs.phase("flush cache")
                    if not client.flush_cache():
                        obs.message("warning: /flush_cache failed; the nonce still keeps the prompt uncached")
                obs.phase("prefill + decode")
                try:
                    stream = _request(client, settings, context, settings.gen, timeout, words_per_token)
                    tol = 0.0 if settings.prompt_mode == "ids" else TEXT_TOLERANCE
                    sample = summarize(stream, context, repeat, context, settings.gen, tol)
                except RequestFailed as exc:
                    obs.phase("request failed; checking health")
                    ok, detail = healthy()
                    if not ok:
                        return stop(
                            "server_died",
                            context,
                            f"server died at point {prompts.format_context(context)}: {exc}; "
                            f"/health: {detail}",
                        )
                    error = str(exc)
                    break
                if "cached" in sample.flags:
                    obs.message(
                        f"warning: {sample.cached_tokens} cached tokens at "
                        f"{prompts.format_context(context)}; "
                        "sample flagged and left out of the medians"
                    )
                samples.append(sample)
                obs.sample_done(sample)
            if error is not None:
                point = aggregate(context, samples)
                point.status, point.error = "error", error
                obs.message(f"point {prompts.format_context(context)} failed (server still up): {error}")
            else:
                point = aggregate(context, samples)
                if point.status == "ok":
                    measured_ok.append(point)
            result.points = [p for p in result.points if p.context_requested != context] + [point]
            save()
            obs.point_done(point)
    except KeyboardInterrupt:
        return stop("interrupted", current, "interrupted (Ctrl-C); points measured so far are kept", False)
    save()
    return result


def _request(
    client: BenchClient,
    settings: SweepSettings,
    n_tokens: int,
    gen: int,
    timeout_s: float,
    words_per_token: float,
) -> StreamResult:
    nonce = prompts.new_nonce()
    rid = f"bench-{uuid.uuid4().hex[:12]}"
    if settings.prompt_mode == "ids":
        return client.generate_stream(
            input_ids=prompts.make_input_ids(n_tokens, nonce),
            max_new_tokens=gen,
            timeout_s=timeout_s,
            rid=rid,
        )
    n_words = max(2, round(n_tokens * words_per_token))
    return client.generate_stream(
        text=prompts.make_text(n_words, nonce), max_new_tokens=gen, timeout_s=timeout_s, rid=rid
    )


# -- concurrency ------------------------------------------------------------------------


@dataclass
class ConcurrencyResult:
    """N streams sent together at one context; aggregate throughput plus each stream."""

    context_requested: int
    streams: int
    gen: int
    samples: list[Sample]
    errors: list[str]
    wall_s: float  # first send -> last token of any stream
    output_tok_s: float  # all completion tokens / wall_s
    decode_tok_s_sum: float  # sum of the per-stream decode rates
    ttft_s_median: float | None
    ttft_s_max: float | None
    meta: dict[str, Any] = field(default_factory=dict)
    stopped: StopInfo | None = None  # Ctrl-C: the streams that had finished are the samples

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(schema=SCHEMA, kind="concurrency")
        return d


def run_concurrency(
    client: BenchClient,
    context: int,
    streams: int,
    gen: int = 64,
    *,
    flush: bool = True,
    prompt_mode: str = "ids",
    timeout_s: float | None = None,
) -> ConcurrencyResult:
    """Send `streams` unique prompts of `context` tokens at once and time them all.

    On Ctrl-C the streams still running are stopped (SGLang aborts their requests) and the
    result, with `stopped` set, holds the ones that had finished.
    """
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor, wait

    if streams < 1:
        raise ValueError("--streams must be at least 1")
    settings = SweepSettings(contexts=[context], gen=gen, flush=flush, prompt_mode=prompt_mode)
    settings.validate()
    # All prefills queue together, so the last one waits for all of them.
    timeout = timeout_s or default_timeout_s(context * streams, gen)
    barrier = threading.Barrier(streams)

    def one(_: int) -> StreamResult:
        barrier.wait()
        return _request(client, settings, context, gen, timeout, 1.0)

    info = None
    futures = []
    stopped = None
    with ThreadPoolExecutor(max_workers=streams) as pool:
        try:
            info = client.server_info()
            if flush:
                client.flush_cache()
            t0 = time.perf_counter()
            for i in range(streams):
                futures.append(pool.submit(one, i))
            wait(futures)
        except KeyboardInterrupt:
            # Raised here, in the main thread; the streams read on in theirs until stopped.
            barrier.abort()
            client.stop()
            stopped = StopInfo("interrupted", context, "interrupted (Ctrl-C)")
    samples, errors, ends = [], [], []
    for i, fut in enumerate(futures):
        try:
            stream = fut.result()
            samples.append(summarize(stream, context, i, context if prompt_mode == "ids" else None, gen))
            ends.append(stream.chunks[-1].t)
        except (RequestStopped, threading.BrokenBarrierError):
            pass  # cut short by the Ctrl-C: neither a sample nor a failure
        except RequestFailed as exc:
            errors.append(str(exc))
    if stopped is not None:
        stopped.reason += f"; the {len(samples)} of {streams} stream(s) that had finished are kept"
    wall = (max(ends) - t0) if ends else 0.0
    total = sum(s.completion_tokens for s in samples)
    ttfts = [s.ttft_s for s in samples]
    return ConcurrencyResult(
        context_requested=context,
        streams=streams,
        gen=gen,
        samples=samples,
        errors=errors,
        wall_s=wall,
        output_tok_s=total / wall if wall > 0 else 0.0,
        decode_tok_s_sum=sum(s.decode_tok_s or 0.0 for s in samples),
        ttft_s_median=statistics.median(ttfts) if ttfts else None,
        ttft_s_max=max(ttfts) if ttfts else None,
        meta=collect_meta(client, info),
        stopped=stopped,
    )
