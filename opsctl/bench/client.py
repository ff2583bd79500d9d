"""A small HTTP client for SGLang's native API, timed for benchmarking.

`generate_stream` posts one streaming `/generate` request and records, for every SSE chunk,
the arrival time (`time.perf_counter`, seconds) and the cumulative `completion_tokens`
(and `spec_verify_ct` when the server reports it). Timing starts just before the request
is sent, so TTFT includes the HTTP round trip, as a user would see it.

`stop` ends the streams of other threads at once (Ctrl-C in `opsctl bench concurrency`).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import httpx


class RequestFailed(Exception):
    """The request did not complete: connection lost, HTTP error, timeout or an error chunk."""


class RequestStopped(RequestFailed):
    """`BenchClient.stop` ended the request (Ctrl-C); the server did nothing wrong."""


@dataclass
class Health:
    ok: bool
    detail: str  # "200 OK", "503 ...", "connection refused: ..."


@dataclass
class Chunk:
    t: float  # perf_counter seconds at arrival
    completion_tokens: int
    spec_verify_ct: int | None


@dataclass
class StreamResult:
    """One streamed generate: send time, per-chunk arrivals and the last meta_info."""

    t_send: float  # perf_counter seconds just before the request was sent
    t_end: float  # perf_counter seconds when the stream ended ([DONE] or close)
    chunks: list[Chunk] = field(default_factory=list)  # chunks that added tokens
    meta: dict[str, Any] = field(default_factory=dict)  # meta_info of the last chunk


class BenchClient:
    """Talks to one SGLang server. `api_key` is sent as `Authorization: Bearer ...`."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        connect_timeout_s: float = 10.0,
        health_timeout_s: float = 20.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.connect_timeout_s = connect_timeout_s
        self.health_timeout_s = health_timeout_s
        self._lock = threading.Lock()
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()  # every connection's
        self._stopped = False
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(health_timeout_s, connect=connect_timeout_s),
            transport=transport,
            event_hooks={"request": [self._trace_connections]},
        )

    def close(self) -> None:
        self._http.close()

    def stop(self) -> None:
        """End every request in flight, from any thread: each fails at once with RequestStopped,
        and SGLang, its client gone, aborts it. The client makes no request after this.

        The sockets are shut down, not closed: closing one does not wake a thread blocked reading
        it (a stream waiting minutes for its prefill), nor tell the server.
        """
        with self._lock:
            self._stopped = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut_down(sock)

    def _trace_connections(self, request: httpx.Request) -> None:
        request.extensions["trace"] = self._note_socket

    def _note_socket(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: keep each new connection's socket (the TLS one over https)."""
        if event not in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            return
        sock = info["return_value"].get_extra_info("socket")
        if sock is None:
            return
        with self._lock:
            self._sockets.add(sock)
            stopped = self._stopped
        if stopped:
            _shut_down(sock)

    def __enter__(self) -> BenchClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- probes -------------------------------------------------------------------------

    def health(self) -> Health:
        """GET /health: ok on 200 (SGLang answers 503 while starting or when stuck)."""
        try:
            r = self._http.get("/health", timeout=self.health_timeout_s)
        except httpx.HTTPError as exc:
            return Health(False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        if r.status_code == 200:
            return Health(True, "200 OK")
        return Health(False, f"HTTP {r.status_code}: {r.text.strip()[:200]}")

    def server_info(self) -> dict[str, Any] | None:
        """GET /server_info (or the old /get_server_info); None when neither answers."""
        for path in ("/server_info", "/get_server_info"):
            try:
                r = self._http.get(path)
            except httpx.HTTPError:
                return None
            if r.status_code == 200:
                try:
                    data = r.json()
                except ValueError:
                    return None
                return data if isinstance(data, dict) else None
        return None

    def flush_cache(self, attempts: int = 3, delay_s: float = 0.5) -> bool:
        """POST /flush_cache; SGLang answers 400 while requests run, so retry a little."""
        for attempt in range(attempts):
            try:
                r = self._http.post("/flush_cache")
            except httpx.HTTPError:
                return False
            if r.status_code == 200:
                return True
            if attempt + 1 < attempts:
                time.sleep(delay_s)
        return False

    # -- generate -----------------------------------------------------------------------

    def generate_stream(
        self,
        *,
        max_new_tokens: int,
        input_ids: list[int] | None = None,
        text: str | None = None,
        ignore_eos: bool = True,
        timeout_s: float = 600.0,
        rid: str | None = None,
    ) -> StreamResult:
        """One streaming POST /generate; raises RequestFailed unless it ends normally
        (RequestStopped when `stop` ended it).

        `timeout_s` bounds both the wait for any single chunk (the first one waits for the
        whole prefill) and the request as a whole.
        """
        body: dict[str, Any] = {
            "sampling_params": {
                "max_new_tokens": max_new_tokens,
                "temperature": 0.0,
                "ignore_eos": ignore_eos,
            },
            "stream": True,
        }
        if input_ids is not None:
            body["input_ids"] = input_ids
        elif text is not None:
            body["text"] = text
        else:
            raise ValueError("give input_ids or text")
        if rid:
            body["rid"] = rid
        try:
            if self._stopped:
                raise RequestFailed("not sent")
            return self._post_stream(body, timeout_s)
        except RequestFailed as exc:
            if self._stopped:
                raise RequestStopped(f"stopped before it finished ({exc})") from exc
            raise

    def _post_stream(self, body: dict[str, Any], timeout_s: float) -> StreamResult:
        timeout = httpx.Timeout(timeout_s, connect=self.connect_timeout_s)
        # Encode before the clock starts: TTFT is the server's time, not our JSON encoder's.
        content = json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"}
        t_send = time.perf_counter()
        deadline = t_send + timeout_s
        result = StreamResult(t_send=t_send, t_end=t_send)
        last_tokens = 0
        done = False
        try:
            with self._http.stream(
                "POST", "/generate", content=content, headers=headers, timeout=timeout
            ) as r:
                if r.status_code != 200:
                    r.read()
                    raise RequestFailed(f"HTTP {r.status_code}: {r.text.strip()[:300]}")
                for line in r.iter_lines():
                    now = time.perf_counter()
                    if now > deadline:
                        raise RequestFailed(f"timed out after {timeout_s:.0f} s")
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        done = True
                        break
                    try:
                        data = json.loads(payload)
                    except ValueError as exc:
                        raise RequestFailed(f"bad SSE chunk: {payload[:200]!r}") from exc
                    if not isinstance(data, dict):
                        raise RequestFailed(f"bad SSE chunk (not a JSON object): {payload[:200]!r}")
                    if "error" in data:
                        raise RequestFailed(f"server error: {str(data['error'])[:300]}")
                    meta = data.get("meta_info") or {}
                    if not isinstance(meta, dict):
                        raise RequestFailed(f"bad SSE chunk (meta_info is not an object): {payload[:200]!r}")
                    tokens = meta.get("completion_tokens", last_tokens)
                    vct = meta.get("spec_verify_ct")
                    if not _is_count(tokens) or (vct is not None and not _is_count(vct)):
                        raise RequestFailed(
                            f"bad SSE chunk (completion_tokens or spec_verify_ct is not an integer): {payload[:200]!r}"
                        )
                    result.meta = meta
                    if tokens > last_tokens:
                        result.chunks.append(Chunk(now, tokens, vct))
                        last_tokens = tokens
                    finish = meta.get("finish_reason")
                    if isinstance(finish, dict) and finish.get("type") == "abort":
                        raise RequestFailed(f"request aborted: {finish.get('message', finish)}")
        except httpx.TimeoutException as exc:
            raise RequestFailed(f"timed out after {timeout_s:.0f} s ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            detail = str(exc) or type(exc).__name__
            raise RequestFailed(f"connection lost: {detail}") from exc
        result.t_end = time.perf_counter()
        if not done and not result.meta.get("finish_reason"):
            raise RequestFailed("stream ended without [DONE] or a finish_reason")
        return result


def _shut_down(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # closed already, or (a plain socket under TLS) detached
        pass


def _is_count(value: object) -> bool:
    """A token or step count as SGLang sends it: a JSON integer (not null, text or true)."""
    return isinstance(value, int) and not isinstance(value, bool)
