"""`opsctl bench` against a tiny fake SGLang server (http.server, in a thread).

The fake streams like SGLang's /generate (SSE `data: {...}` chunks with cumulative
`meta_info`, then `data: [DONE]`), keeps a radix cache (cached_tokens = longest common
prefix with earlier prompts) and can be told to die at a given request.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from opsctl.bench.client import BenchClient
from opsctl.bench.runner import (
    SweepObserver,
    SweepSettings,
    load_result,
    run_concurrency,
    run_sweep,
)
from opsctl.commands import bench as bench_cmd

PREFILL_S_PER_TOKEN = 2e-6  # 500k tok/s: 8k tokens in 16 ms
STEP_S_AT_ZERO = 2e-3
STEP_S_PER_TOKEN = 1e-7  # +0.1 ms per 1k tokens of context
# Measured step times are checked against what the fake did, not against its schedule: it records
# when it sent each stream's first and last chunk, so a late wake-up on a busy machine (43 ms once,
# with a CI run beside it) moves the truth with the measurement. What is left is the client's
# own reading delay, checked as an offset over the whole decode window.
MAX_DECODE_WINDOW_OFFSET_MS = 15.0


def assert_step_time(step_ms: float, window_s: float, decode_steps: int) -> None:
    """The benchmark's step time against the fake's decode window (first to last chunk sent)."""
    offset_ms = step_ms * decode_steps - 1e3 * window_s
    assert abs(offset_ms) <= MAX_DECODE_WINDOW_OFFSET_MS, (step_ms, window_s, decode_steps)


class FakeSGLang:
    def __init__(self, radix: bool = True, accept_length: int = 1) -> None:
        self.radix = radix
        self.accept_length = accept_length
        self.kv_cache_dtype = "auto"
        self.seen: list[list] = []
        self.die_at_request: int | None = None  # index of the /generate request that kills it
        self.dead = False
        self.requests = 0
        self.flushes = 0
        self.api_keys: list[str | None] = []
        self.max_prompt: int | None = None  # longer prompts get HTTP 413, the server stays up
        self.decode_windows: list[float] = []  # per stream: seconds from its first chunk sent to its last
        # /generate request index -> "before headers" or "after headers": held in a prefill that
        # lasts until the client goes away; the indexes of those that saw it go are in `gone`
        self.hold: dict[int, str] = {}
        self.gone: list[int] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _send(self, code: int, body: str, ctype: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _hold(self, index: int) -> None:
                readable, _, _ = select.select([self.connection], [], [], 30.0)
                if readable and not self.connection.recv(1, socket.MSG_PEEK):  # EOF: the client went
                    fake.gone.append(index)
                self.close_connection = True

            def do_GET(self):
                if self.path == "/health":
                    return self._send(503, "dead") if fake.dead else self._send(200, "")
                if self.path == "/server_info":
                    info = {
                        "version": "0.5.23-fake",
                        "disable_radix_cache": not fake.radix,
                        "chunked_prefill_size": 4096,
                        "kv_cache_dtype": fake.kv_cache_dtype,
                    }
                    return self._send(200, json.dumps(info), "application/json")
                self._send(404, "not found")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path == "/flush_cache":
                    fake.seen.clear()
                    fake.flushes += 1
                    return self._send(200, "Cache flushed.\n")
                if self.path != "/generate":
                    return self._send(404, "not found")
                fake.api_keys.append(self.headers.get("Authorization"))
                index = fake.requests
                fake.requests += 1
                if fake.dead or index == fake.die_at_request:
                    fake.dead = True
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)  # the connection drops, as when the launcher dies
                    return
                prompt = body.get("input_ids") or body["text"].split()
                if fake.max_prompt is not None and len(prompt) > fake.max_prompt:
                    return self._send(413, "Maximum request body size exceeded.")
                cached = 0
                if fake.radix:
                    for old in fake.seen:
                        n = 0
                        for a, b in zip(old, prompt, strict=False):
                            if a != b:
                                break
                            n += 1
                        cached = max(cached, n)
                fake.seen.append(prompt)
                gen = body["sampling_params"]["max_new_tokens"]
                if fake.hold.get(index) == "before headers":
                    return self._hold(index)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                if fake.hold.get(index) == "after headers":
                    return self._hold(index)
                t0 = time.perf_counter()
                # Sleep to absolute times on a schedule, so per-chunk overheads do not add up.
                due = t0 + (len(prompt) - cached) * PREFILL_S_PER_TOKEN
                time.sleep(max(0.0, due - time.perf_counter()))
                done, steps = 1, 0
                while True:
                    meta = {
                        "prompt_tokens": len(prompt),
                        "completion_tokens": done,
                        "cached_tokens": cached,
                        "finish_reason": None,
                    }
                    if fake.accept_length > 1:
                        meta["spec_verify_ct"] = steps
                    if done >= gen:
                        meta["finish_reason"] = {"type": "length", "length": gen}
                        meta["e2e_latency"] = time.perf_counter() - t0
                        if fake.accept_length > 1:
                            meta["spec_accept_length"] = gen / steps
                    self.wfile.write(f"data: {json.dumps({'text': 'x', 'meta_info': meta})}\n\n".encode())
                    self.wfile.flush()
                    sent = time.perf_counter()
                    if steps == 0:  # the first token's chunk
                        first_sent = sent
                    if done >= gen:
                        fake.decode_windows.append(sent - first_sent)
                        break
                    due += STEP_S_AT_ZERO + STEP_S_PER_TOKEN * (len(prompt) + done)
                    time.sleep(max(0.0, due - time.perf_counter()))
                    done = min(gen, done + fake.accept_length)
                    steps += 1
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeSGLang:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    with FakeSGLang() as f:
        yield f


def _sweep(url, contexts, **kw) -> tuple[SweepSettings, BenchClient]:
    settings = SweepSettings(contexts=contexts, gen=kw.pop("gen", 8), **kw)
    return settings, BenchClient(url)


def test_sweep_measures_each_point_once_with_unique_prompts(fake, tmp_path):
    settings, client = _sweep(fake.url, [1000, 4000, 8000], gen=128)
    with client:
        result = run_sweep(settings, client, out_path=tmp_path / "r.json")
    assert result.complete and result.stopped is None
    assert fake.requests == 1 + 3  # warm-up + one request per point
    assert fake.flushes == 3
    assert [p.prompt_tokens for p in result.points] == [1000, 4000, 8000]
    for p, window_s in zip(result.points, fake.decode_windows[1:], strict=True):  # after the warm-up's
        s = p.samples[0]
        assert s.cached_tokens == 0 and s.completion_tokens == 128 and s.flags == []
        assert_step_time(p.step_ms, window_s, decode_steps=127)
        # and the fake kept to its model within a millisecond a step (steps at done 1..127)
        assert p.step_ms == pytest.approx(1e3 * (STEP_S_AT_ZERO + STEP_S_PER_TOKEN * (p.prompt_tokens + 64)), abs=1.0)
        assert p.ttft_s >= p.prompt_tokens * PREFILL_S_PER_TOKEN
    saved = load_result(tmp_path / "r.json")
    assert saved.complete and len(saved.points) == 3
    assert saved.meta["server_version"] == "0.5.23-fake"
    assert saved.meta["segments"][0]["warmup_prompt_tokens"] == 256


def test_nonce_defeats_the_radix_cache_without_flush(fake):
    # No flush, same context twice as repeats: without the nonce the second would be cached.
    settings, client = _sweep(fake.url, [2000], repeats=3, flush=False)
    with client:
        result = run_sweep(settings, client)
    assert fake.flushes == 0
    assert [s.cached_tokens for s in result.points[0].samples] == [0, 0, 0]
    assert result.points[0].n_valid == 3
    assert set(result.points[0].spread) >= {"ttft_s", "step_ms", "decode_tok_s"}


def test_cached_response_is_flagged_not_averaged(fake, monkeypatch):
    # Force the old mistake: the same prompt every time (no nonce).
    monkeypatch.setattr("opsctl.bench.prompts.new_nonce", lambda: "same")
    settings, client = _sweep(fake.url, [2000], repeats=3, flush=False, warmup=False)
    messages = []

    class Obs(SweepObserver):
        def message(self, text):
            messages.append(text)

    with client:
        result = run_sweep(settings, client, observer=Obs())
    p = result.points[0]
    assert [s.cached_tokens for s in p.samples] == [0, 2000, 2000]  # the whole prompt served from cache
    assert [s.flags for s in p.samples] == [[], ["cached"], ["cached"]]
    assert p.n_valid == 1
    assert p.ttft_s == p.samples[0].ttft_s  # the median is the only uncached sample
    assert sum("cached tokens" in m for m in messages) == 2


def test_server_death_stops_cleanly_and_resume_continues(fake, tmp_path):
    out = tmp_path / "r.json"
    fake.die_at_request = 3  # warm-up 0, 1k 1, 2k 2, 4k dies
    journal = "Nov 29 scheduler: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB."
    settings, client = _sweep(fake.url, [1000, 2000, 4000, 8000])
    with client:
        result = run_sweep(
            settings, client, out_path=out, journal_excerpt=lambda: journal, health_retry_delay_s=0.01
        )
    assert not result.complete
    assert result.stopped.kind == "server_died" and result.stopped.context == 4000
    assert "server died at point 4k" in result.stopped.reason and "503" in result.stopped.reason
    assert result.stopped.journal == journal
    saved = load_result(out)
    assert [p.context_requested for p in saved.points] == [1000, 2000]
    kept = [p.samples[0].ttft_s for p in saved.points]

    fake.dead = False  # "after a fix"
    with BenchClient(fake.url) as client:
        resumed = run_sweep(
            SweepSettings(contexts=[1000, 2000, 4000, 8000], gen=8),
            client,
            out_path=out,
            resume_from=load_result(out),
        )
    assert resumed.complete
    assert [p.context_requested for p in resumed.points] == [1000, 2000, 4000, 8000]
    assert [p.samples[0].ttft_s for p in resumed.points[:2]] == kept  # not measured again
    assert len(resumed.meta["segments"]) == 2 and resumed.meta["segments"][1]["first_context"] == 4000
    assert load_result(out).complete


def test_interrupt_keeps_points(fake, tmp_path):
    class Interrupt(SweepObserver):
        def point_started(self, index, total, context, repeat, repeats):
            if context == 4000:
                raise KeyboardInterrupt

    settings, client = _sweep(fake.url, [1000, 2000, 4000])
    with client:
        result = run_sweep(settings, client, out_path=tmp_path / "r.json", observer=Interrupt())
    assert result.stopped.kind == "interrupted" and result.stopped.context == 4000
    assert [p.context_requested for p in load_result(tmp_path / "r.json").points] == [1000, 2000]


def test_speculative_step_time_from_verify_count():
    with FakeSGLang(accept_length=3) as f:
        settings, client = _sweep(f.url, [1000], gen=301, warmup=False)
        with client:
            result = run_sweep(settings, client)
    p = result.points[0]
    assert p.accept_length == pytest.approx(301 / 100)
    assert p.samples[0].decode_steps == 100  # 300 tokens after the first, 3 per step
    # Per step, not per token: dividing by tokens would read a third of the truth.
    assert_step_time(p.step_ms, f.decode_windows[0], decode_steps=100)


def test_concurrency_streams_are_unique_and_counted(fake):
    with BenchClient(fake.url) as client:
        res = run_concurrency(client, 2000, 4, gen=8)
    assert len(res.samples) == 4 and not res.errors
    assert [s.cached_tokens for s in res.samples] == [0, 0, 0, 0]
    assert res.output_tok_s == pytest.approx(32 / res.wall_s)
    ttfts = sorted(s.ttft_s for s in res.samples)
    assert ttfts[0] > 0
    assert res.ttft_s_max == ttfts[-1] and res.ttft_s_median == pytest.approx((ttfts[1] + ttfts[2]) / 2)


def test_bad_stream_events_fail_the_point_not_the_sweep():
    """Valid JSON that is not an event object, or a null token count, escaped run_sweep as a
    TypeError or AttributeError: the sweep ended in a traceback and the point was lost."""
    import httpx

    bodies = {
        "null": "data: null",
        "[1,2]": "data: [1,2]",
        '"error"': 'data: "error"',
        "meta_info is not an object": 'data: {"meta_info": [1]}',
        "completion_tokens is null": 'data: {"text": "a", "meta_info": {"completion_tokens": null}}',
        "spec_verify_ct is text": 'data: {"text": "a", "meta_info": {"completion_tokens": 1, "spec_verify_ct": "x"}}',
    }
    for name, event in bodies.items():

        def handler(request, event=event):
            if request.url.path == "/generate":
                return httpx.Response(200, text=f"{event}\n\ndata: [DONE]\n\n")
            return httpx.Response(200, json={})

        client = BenchClient("http://fake", transport=httpx.MockTransport(handler))
        result = run_sweep(SweepSettings(contexts=[1000], gen=4, warmup=False), client, health_retries=0)
        point = result.points[0]
        assert result.stopped is None and point.status == "error", name
        assert point.error.startswith("bad SSE chunk (") and event[6:] in point.error, (name, point.error)


def test_ctrl_c_stops_the_concurrency_streams_and_keeps_those_that_finished(fake, tmp_path):
    """Ctrl-C exited 1 ("Aborted!"), saved nothing, and left the streams reading until their
    prefills ended: a thread blocked reading a socket is not woken when the socket is closed."""
    fake.hold = {1: "before headers", 2: "after headers"}  # of three streams, one finishes
    main = threading.get_ident()

    def ctrl_c():
        deadline = time.monotonic() + 10
        while (fake.requests < 3 or not fake.decode_windows) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # for the client to read the finished stream's [DONE]
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    out = tmp_path / "c.json"
    started = time.monotonic()
    r = CliRunner().invoke(bench_cmd.bench, ["concurrency", "--url", fake.url, "--context", "1k", "--streams", "3",
                                             "--gen", "8", "--out", str(out)])
    assert r.exit_code == 130, r.output
    assert time.monotonic() - started < 5  # the held streams would have read for 30 s
    saved = json.loads(out.read_text())
    assert saved["stopped"]["kind"] == "interrupted" and saved["errors"] == []
    assert [s["completion_tokens"] for s in saved["samples"]] == [8]
    assert f"the 1 of 3 stream(s) that had finished are kept in {out}" in r.stderr.replace("\n", "")
    deadline = time.monotonic() + 5
    while len(fake.gone) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(fake.gone) == [1, 2]  # the server saw both clients go (SGLang aborts their requests)


# -- the CLI ---------------------------------------------------------------------------


def test_cli_run_json_csv_plot_and_exit_0(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCTL_API_KEY", "sekrit")
    out, csvp, png = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "r.png"
    r = CliRunner().invoke(
        bench_cmd.bench,
        [
            "run",
            "--url",
            fake.url,
            "--contexts",
            "1k,2k",
            "--gen",
            "8",
            "--out",
            str(out),
            "--csv",
            str(csvp),
            "--plot",
            str(png),
            "--json",
            "--gpu",
            "h200",
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["complete"] is True and doc["kind"] == "sweep"
    assert [p["prompt_tokens"] for p in doc["points"]] == [1000, 2000]
    assert doc["floor"]["bandwidth_tbs"] == 4.8
    assert doc["points"][0]["floor_step_ms"] == pytest.approx(
        doc["points"][0]["decode_ctx_mean"] * 70272 / 4.8e12 * 1e3
    )
    assert set(fake.api_keys) == {"Bearer sekrit"}
    assert csvp.read_text().startswith("context_requested,prompt_tokens,status")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert load_result(out).complete


def test_cli_stops_with_exit_1_then_resumes(fake, tmp_path):
    out = tmp_path / "r.json"
    fake.die_at_request = 2
    monkey = pytest.MonkeyPatch()
    monkey.setattr(bench_cmd, "HEALTH_RETRY_DELAY_S", 0.01)
    # The node's journal, as opsctl.journal.excerpt reads it on a node.
    monkey.setattr(bench_cmd.journal, "excerpt",
                   lambda unit: "Received sigquit from a child process. It usually means the child failed.")
    try:
        r = CliRunner().invoke(
            bench_cmd.bench,
            ["run", "--url", fake.url, "--contexts", "1k,2k,4k", "--gen", "8", "--out", str(out)],
        )
    finally:
        monkey.undo()
    assert r.exit_code == 1, r.output
    assert "stopped at point 2k" in r.stderr
    assert "Received sigquit from a child process" in r.stderr
    assert f"--resume {out}" in r.stderr
    assert [p.context_requested for p in load_result(out).points] == [1000]

    # A different --gen is refused (exit 2), then the same settings resume.
    fake.dead = False
    r = CliRunner().invoke(bench_cmd.bench, ["run", "--url", fake.url, "--resume", str(out), "--gen", "16"])
    assert r.exit_code == 2
    assert "gen: file has 8, asked 16" in r.stderr
    r = CliRunner().invoke(bench_cmd.bench, ["run", "--url", fake.url, "--resume", str(out)])
    assert r.exit_code == 0, r.output
    assert "resuming: 1 point(s) kept, 2 to measure" in r.stderr
    assert "actual ctx" in r.stdout and "4k" in r.stdout
    assert [p.context_requested for p in load_result(out).points] == [1000, 2000, 4000]


def test_cli_usage_errors_exit_2(tmp_path):
    r = CliRunner().invoke(bench_cmd.bench, ["run", "--contexts", "1k,zz"])
    assert r.exit_code == 2 and "not a context length: 'zz'" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = CliRunner().invoke(bench_cmd.bench, ["compare", str(bad), str(bad)])
    assert r.exit_code == 2 and "is not an opsctl bench sweep file" in r.stderr
    # (it exited 1, "stopped early", and left an empty results file with a --resume hint)
    out = tmp_path / "r.json"
    r = CliRunner().invoke(bench_cmd.bench, ["run", "--url", "nonsense", "--out", str(out)])
    assert r.exit_code == 2 and "'nonsense' is not an http(s) URL" in r.stderr and not out.exists()


def test_cli_unreachable_server_stops_with_exit_1(tmp_path):
    with FakeSGLang() as f:
        url = f.url
    monkey = pytest.MonkeyPatch()
    monkey.setattr(bench_cmd, "HEALTH_RETRIES", 0)
    try:
        r = CliRunner().invoke(
            bench_cmd.bench, ["run", "--url", url, "--contexts", "1k", "--out", str(tmp_path / "r.json")]
        )
    finally:
        monkey.undo()
    assert r.exit_code == 1
    assert "server not healthy before the sweep" in r.stderr


def test_cli_compare_prints_ratios(fake, tmp_path):
    paths = []
    for name in ("a", "b"):
        p = tmp_path / f"{name}.json"
        # 64 tokens: a decode window of ~130 ms, long against a few ms of lateness at either end
        # (8 tokens gave 15 ms, which one descheduling on a busy machine could double)
        r = CliRunner().invoke(
            bench_cmd.bench,
            ["run", "--url", fake.url, "--contexts", "1k,2k", "--gen", "64", "--out", str(p), "--json"],
        )
        assert r.exit_code == 0, r.output
        paths.append(p)
    r = CliRunner().invoke(bench_cmd.bench, ["compare", str(paths[0]), str(paths[1]), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [p["context_requested"] for p in doc["points"]] == [1000, 2000]
    for p in doc["points"]:
        assert p["step_ms_ratio"] == pytest.approx(p["step_ms_b"] / p["step_ms_a"])
        assert 0.5 < p["step_ms_ratio"] < 2  # the same fake server both times
    r = CliRunner().invoke(bench_cmd.bench, ["compare", str(paths[0]), str(paths[1])])
    assert "ms/step B/A" in r.stdout and "geomean" in r.stdout


def test_cli_report_markdown(fake, tmp_path):
    out = tmp_path / "r.json"
    r = CliRunner().invoke(
        bench_cmd.bench, ["run", "--url", fake.url, "--contexts", "1k,2k", "--gen", "8", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(bench_cmd.bench, ["report", str(out), "--markdown"])
    assert r.exit_code == 0
    assert r.stdout.splitlines()[0].startswith(
        "| actual ctx | TTFT | prefill tok/s | decode tok/s | ms/step |"
    )
    assert r.stdout.splitlines()[2].startswith("| 1k |")


def test_cli_plot_without_matplotlib_says_how_to_install(fake, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mpl(name, *a, **kw):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    r = CliRunner().invoke(
        bench_cmd.bench, ["run", "--url", fake.url, "--contexts", "1k", "--plot", str(tmp_path / "x.png")]
    )
    assert r.exit_code == 1
    assert "pip install 'dflash-ops[plot]'" in r.stderr
    assert fake.requests == 0  # refused before measuring anything


def test_cli_failed_point_with_server_up_exits_1_and_resume_retries_it(fake, tmp_path):
    out = tmp_path / "r.json"
    fake.max_prompt = 1500
    r = CliRunner().invoke(
        bench_cmd.bench, ["run", "--url", fake.url, "--contexts", "1k,2k", "--gen", "8", "--out", str(out)]
    )
    assert r.exit_code == 1
    assert (
        "1 point(s) failed with the server still up: 2k (HTTP 413: Maximum request body size exceeded.)"
        in r.stderr
    )
    saved = load_result(out)
    assert [(p.context_requested, p.status) for p in saved.points] == [(1000, "ok"), (2000, "error")]
    assert not saved.complete
    fake.max_prompt = None
    r = CliRunner().invoke(bench_cmd.bench, ["run", "--url", fake.url, "--resume", str(out)])
    assert r.exit_code == 0, r.output
    assert [(p.context_requested, p.status) for p in load_result(out).points] == [(1000, "ok"), (2000, "ok")]


def test_an_out_path_that_cannot_be_written_is_refused_before_measuring(fake, tmp_path):
    """Before, `run` failed with a traceback after its first point and `concurrency` after the
    whole run, and its figures were lost; a folder that does not exist yet is made."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args in (["run", "--url", fake.url, "--contexts", "1k", "--gen", "8"],
                 ["concurrency", "--url", fake.url, "--context", "1k", "--streams", "2", "--gen", "8"]):
        r = CliRunner().invoke(bench_cmd.bench, [*args, "--out", str(blocker / "r.json")])
        assert r.exit_code == 2 and "cannot write" in r.output, r.output
    assert fake.requests == 0 and fake.flushes == 0
    r = CliRunner().invoke(bench_cmd.bench, ["concurrency", "--url", fake.url, "--context", "1k", "--streams", "2",
                                             "--gen", "8", "--out", str(tmp_path / "new" / "c.json")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "new" / "c.json").read_text())["streams"] == 2


def test_a_results_file_that_is_not_an_object_is_a_clear_error(tmp_path):
    bad = tmp_path / "list.json"
    bad.write_text("[1, 2]")
    r = CliRunner().invoke(bench_cmd.bench, ["report", str(bad)])
    assert r.exit_code != 0 and "not an opsctl bench sweep file" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("dtype, cell", [("auto", 70_272), ("fp8_e4m3", 35_136)])
def test_the_floor_reads_the_servers_kv_dtype(fake, dtype, cell):
    """An fp8 cache reads half the bytes: a bf16 floor made its "x floor" column read 2x better."""
    from opsctl.commands.bench import _floor

    fake.kv_cache_dtype = dtype
    floor = _floor("rtx-pro-6000", None, None) | {"kv_cell_from_server": True}
    settings, client = _sweep(fake.url, [1000])
    with client:
        result = run_sweep(settings, client, floor=floor)
    assert result.floor["kv_cell_bytes"] == cell and "kv_cell_from_server" not in result.floor
    given = _floor("rtx-pro-6000", None, 12_345)  # --kv-cell-bytes wins, whatever the server says
    with BenchClient(fake.url) as client:
        assert run_sweep(settings, client, floor=given).floor["kv_cell_bytes"] == 12_345


def test_a_resumed_sweep_keeps_its_floor_unless_one_is_given(fake, tmp_path):
    """A sweep run on an H200 (--gpu h200), resumed without --gpu: the default RTX PRO 6000 floor
    replaced the file's, and every point's "x floor" was rewritten with it."""
    out = tmp_path / "h200.json"
    fake.die_at_request = 2
    r = CliRunner().invoke(bench_cmd.bench, ["run", "--url", fake.url, "--contexts", "1k,2k", "--gen", "8",
                                             "--gpu", "h200", "--out", str(out)])
    assert r.exit_code == 1, r.output
    fake.dead = False
    r = CliRunner().invoke(bench_cmd.bench, ["run", "--url", fake.url, "--resume", str(out)])
    assert r.exit_code == 0, r.output
    assert load_result(out).floor["label"].startswith("H200")
    r = CliRunner().invoke(bench_cmd.bench, ["run", "--url", fake.url, "--resume", str(out), "--bandwidth-tbs", "4.24"])
    assert load_result(out).floor["label"] == "H200, 4.24 TB/s"  # a partial option keeps the file's GPU
    r = CliRunner().invoke(bench_cmd.bench, ["run", "--url", fake.url, "--resume", str(out), "--gpu", "rtx-pro-6000"])
    assert load_result(out).floor["label"].startswith("RTX PRO 6000")
