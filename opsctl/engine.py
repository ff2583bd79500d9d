"""HTTP probes of the engine: health, a real 1-token generate, server info and metrics."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclasses.dataclass
class Probe:
    """One HTTP probe: `ok` is a 200 within the timeout; `error` says what went wrong otherwise."""

    url: str
    ok: bool
    status: int | None
    latency_ms: float | None
    error: str | None = None
    body: Any = None


def probe(client: httpx.Client, path: str, timeout_s: float, want_json: bool = False) -> Probe:
    """GET `path`, the whole exchange within `timeout_s`.

    httpx's timeout bounds each connect, read and write, not their sum: a server that trickles
    its answer a byte at a time never trips it. So the GET runs in a daemon thread and this
    waits for it at most `timeout_s`; one left behind fails at its next read once `client` is
    closed (`timeout_s` at most), or ends with the process.
    """
    url = str(client.base_url).rstrip("/") + path
    answers: queue.SimpleQueue[Probe | BaseException] = queue.SimpleQueue()

    def get() -> None:
        try:
            answers.put(_get(client, path, url, timeout_s, want_json))
        except BaseException as error:  # for the caller to raise, as when the GET ran in its thread
            answers.put(error)

    threading.Thread(target=get, name=f"probe {path}", daemon=True).start()
    try:
        answer = answers.get(timeout=timeout_s)
    except queue.Empty:
        return Probe(url, False, None, None, f"no answer within {timeout_s:g} s")
    if isinstance(answer, BaseException):
        raise answer
    return answer


def _get(client: httpx.Client, path: str, url: str, timeout_s: float, want_json: bool) -> Probe:
    started = time.perf_counter()
    try:
        response = client.get(path, timeout=timeout_s)
    except httpx.TimeoutException:
        return Probe(url, False, None, None, f"no answer within {timeout_s:g} s")
    except httpx.HTTPError as error:
        return Probe(url, False, None, None, f"{type(error).__name__}: {error}")
    latency_ms = (time.perf_counter() - started) * 1000
    body: Any = response.text
    if want_json and response.status_code == 200:
        try:
            body = response.json()
        except ValueError:
            return Probe(url, False, 200, latency_ms, "answer is not JSON")
    ok = response.status_code == 200
    return Probe(url, ok, response.status_code, latency_ms, None if ok else f"HTTP {response.status_code}", body)


# Labels that tell the TP ranks of one scheduler's series apart. By default SGLang exports from each
# attention-TP group's first rank only; with --enable-metrics-for-all-schedulers every rank exports
# the same batch again (8 series at TP8: a token usage of 400%, a KV pool 8 times its size).
_RANK_LABELS = ("tp_rank", "moe_ep_rank")


def _rank(labels: dict[str, str]) -> int:
    try:
        return int(labels.get("tp_rank", 0))
    except ValueError:
        return 0


def parse_metrics(text: str) -> dict[str, float]:
    """SGLang's Prometheus gauges and counters by name: summed over its schedulers (data-parallel
    groups, pipeline stages), each taken from its lowest TP rank."""
    lowest: dict[tuple, tuple[int, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created")):
                continue
            scheduler = (sample.name, *sorted((k, v) for k, v in sample.labels.items() if k not in _RANK_LABELS))
            rank = _rank(sample.labels)
            if scheduler not in lowest or rank < lowest[scheduler][0]:
                lowest[scheduler] = (rank, sample.value)
    values: dict[str, float] = {}
    for scheduler, (_, value) in lowest.items():
        values[scheduler[0]] = values.get(scheduler[0], 0.0) + value
    return values


@dataclasses.dataclass
class EngineView:
    health: Probe
    health_generate: Probe
    server_info: Probe
    metrics: Probe

    @property
    def info(self) -> dict[str, Any]:
        return self.server_info.body if self.server_info.ok and isinstance(self.server_info.body, dict) else {}

    @property
    def metric_values(self) -> dict[str, float]:
        if not self.metrics.ok:
            return {}
        try:
            return parse_metrics(self.metrics.body)
        except ValueError:
            return {}


def look(base_url: str, timeout_s: float = 2.0, api_key: str | None = None) -> EngineView:
    """Probe the engine's endpoints in parallel, so a hung endpoint costs one timeout, not four."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=base_url, headers=headers) as client, ThreadPoolExecutor(4) as pool:
        health = pool.submit(probe, client, "/health", timeout_s)
        generate = pool.submit(probe, client, "/health_generate", timeout_s)
        info = pool.submit(probe, client, "/server_info", timeout_s, True)
        metrics = pool.submit(probe, client, "/metrics", timeout_s)
        return EngineView(health.result(), generate.result(), info.result(), metrics.result())
