"""The engine simulator as a process: endpoints, streaming, cache, crashes, faults, shutdown."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

FIXED = ["--mem-fraction-static", "0.93", "--chunked-prefill-size", "4096", "--enable-metrics"]
EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def wait_for(predicate, timeout: float = 10.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout} s"
        time.sleep(0.02)


def sse_events(body: str) -> list:
    events = [line[len("data: ") :] for line in body.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_startup_log_and_info_endpoints(start_sim):
    sim = start_sim(FIXED, env=EXPANDABLE)
    out = sim.output()
    assert "server_args={'model_path': '/models/Kimi-K2.6'" in out
    assert "'mem_fraction_static': 0.93, " in out and "chunked_prefill_size=4096, " in out
    assert "TP7] Load weight begin. avail mem=93.80 GB" in out
    assert "TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 195011, KV size: 12.76 GB" in out
    assert (
        "TP0] max_total_num_tokens=195011, chunked_prefill_size=4096, max_prefill_tokens=16384, "
        "max_running_requests=48, context_len=200000, available_gpu_mem=5.86 GB"
    ) in out
    with sim.client() as c:
        assert c.get("/health").status_code == 200
        assert c.get("/health_generate").status_code == 200
        info = c.get("/server_info").json()
        assert info["max_total_num_tokens"] == 195011
        assert info["max_req_input_len"] == 195005
        assert info["version"] == "0.5.23"
        assert info["mem_fraction_static"] == 0.93
        assert info["speculative_algorithm"] == "DFLASH"
        state = info["internal_states"][0]
        assert state["avg_spec_accept_length"] == 1.0
        assert state["memory_usage"]["token_capacity"] == 195011
        assert c.get("/get_server_info").json()["max_total_num_tokens"] == 195011
        model = c.get("/model_info").json()
        assert model["model_path"] == "/models/Kimi-K2.6" and model["is_generation"] is True
        assert c.get("/v1/models").json()["data"][0]["id"] == "/models/Kimi-K2.6"


def test_generate_cache_flush_stream_and_metrics(start_sim):
    sim = start_sim(FIXED, env=EXPANDABLE)
    prompt = words(300, "a")
    with sim.client() as c:
        r = c.post("/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 5}})
        assert r.status_code == 200
        body = r.json()
        assert body["text"] == "The quick brown fox jumps"
        meta = body["meta_info"]
        assert (meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]) == (300, 5, 0)
        assert meta["finish_reason"] == {"type": "length", "length": 5}
        assert meta["spec_verify_ct"] == 4 and meta["spec_accept_length"] == 1.25
        # The same prompt hits the radix cache (all but the last token).
        again = c.post("/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 1}}).json()
        assert again["meta_info"]["cached_tokens"] == 299
        # A shared prefix hits too.
        longer = c.post(
            "/generate", json={"text": prompt + " tail more", "sampling_params": {"max_new_tokens": 1}}
        )
        assert longer.json()["meta_info"]["cached_tokens"] == 300
        flushed = c.post("/flush_cache")
        assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed.\n")
        cold = c.post(
            "/generate",
            json={
                "input_ids": list(range(50)),
                "sampling_params": {"max_new_tokens": 3},
                "stream": True,
                "rid": "r1",
            },
        )
        events = sse_events(cold.text)
        assert [e["text"] for e in events] == ["The", "The quick", "The quick brown"]
        assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None, None]
        last = events[-1]["meta_info"]
        assert last["id"] == "r1" and last["finish_reason"] == {"type": "length", "length": 3}
        assert (last["prompt_tokens"], last["completion_tokens"], last["cached_tokens"]) == (50, 3, 0)
        assert "e2e_latency" in last and last["spec_verify_ct"] == 2
        comp = c.post("/v1/completions", json={"model": "m", "prompt": "hello world", "max_tokens": 2}).json()
        assert comp["choices"][0]["text"] == "The quick" and comp["usage"]["prompt_tokens"] == 2
        stream = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True}).text
        chunks = [json.loads(x[6:]) for x in stream.split("\n\n") if x.startswith("data: {")]
        assert "".join(ch["choices"][0]["text"] for ch in chunks) == "The quick"
        assert stream.endswith("data: [DONE]\n\n")
        metrics = c.get("/metrics").text
    labels = 'engine_type="unified",model_name="/models/Kimi-K2.6",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    assert f"sglang:max_total_num_tokens{{{labels}}} 195011.0" in metrics
    assert f"sglang:num_running_reqs{{{labels}}} 0.0" in metrics
    for name in (
        "sglang:token_usage",
        "sglang:num_used_tokens",
        "sglang:gen_throughput",
        "sglang:cache_hit_rate",
        "sglang:spec_accept_length",
        "sglang:num_queue_reqs",
        "sglang:num_retracted_reqs",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:inter_token_latency_seconds_bucket",
        "sglang:e2e_request_latency_seconds_count",
    ):
        assert name in metrics
    out = sim.output()
    assert "Prefill batch, #new-seq: 1, #new-token: 300, #cached-token: 0, token usage: 0.00, " in out
    assert "Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 299, " in out


def test_too_long_prompts_are_refused_not_crashing(start_sim):
    sim = start_sim([*FIXED, "--context-length", "1000"])  # the last --context-length wins
    with sim.client() as c:
        r = c.post("/generate", json={"text": words(1000, "x")})
        assert r.status_code == 400
        assert r.json() == {
            "error": {
                "message": "The input (1000 tokens) is longer than the model's context length (1000 tokens)."
            }
        }
        r = c.post("/generate", json={"text": words(996, "x")})
        assert r.status_code == 400
        assert r.json()["error"]["message"].startswith(
            "Input length (996 tokens) exceeds the maximum allowed length (994 tokens)."
        )
        assert c.get("/health").status_code == 200
    assert sim.proc.poll() is None


def test_seed_crash_sequence(start_sim):
    sim = start_sim(["--mem-fraction-static", "0.94"], env={"SGLANG_SIM_TIME_FACTOR": "0.0005"})
    with sim.client() as c:
        for i, n in enumerate([1024, 1024, 8192, 8192]):
            r = c.post(
                "/generate", json={"text": words(n, f"p{i}_"), "sampling_params": {"max_new_tokens": 2}}
            )
            assert r.status_code == 200
        try:
            c.post("/generate", json={"text": words(32768, "p4_"), "sampling_params": {"max_new_tokens": 2}})
            raise AssertionError("the 32k prefill should have killed the server")
        except httpx.TransportError:
            pass
    assert sim.wait_exit() != 0
    out = sim.output()
    assert "chunked_prefill_size=8192" in out
    assert "TP0] Scheduler hit an exception: Traceback (most recent call last):" in out
    assert (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total "
        "capacity "
        "of 94.97 GiB of which 893.35 MiB is free. Process "
    ) in out
    assert "1.40 GiB is reserved by PyTorch but unallocated." in out
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in out


def test_fixed_config_survives_185k(start_sim):
    sim = start_sim(FIXED, env={**EXPANDABLE, "SGLANG_SIM_TIME_FACTOR": "0.0002"})
    with sim.client() as c:
        for i, n in enumerate([8192, 32768, 185000]):
            r = c.post(
                "/generate", json={"text": words(n, f"s{i}_"), "sampling_params": {"max_new_tokens": 2}}
            )
            assert r.status_code == 200 and r.json()["meta_info"]["prompt_tokens"] == n
        assert c.get("/health").status_code == 200


def test_a_client_that_goes_away_mid_stream_aborts_its_request(start_sim):
    """An interrupted `opsctl bench` (Ctrl-C during a stream) left its request running for good:
    /health answered 503 ("couldn't get a response from detokenizer") until a restart."""
    sim = start_sim(FIXED, env={**EXPANDABLE, "SGLANG_SIM_TIME_FACTOR": "0.02", "SGLANG_SIM_LOAD_SECONDS": "0"})
    body = {"text": words(2000, "g"), "sampling_params": {"max_new_tokens": 5000}, "stream": True}
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        with client.stream("POST", "/generate", json=body) as stream:
            next(stream.iter_bytes())  # the first token, then the client goes away
    with sim.client() as c:
        wait_for(lambda: c.get("/health", timeout=5).status_code == 200, timeout=10, what="a healthy engine")
        r = c.post("/generate", json={"text": "hello again", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200
    assert "Health check failed" not in sim.output()


def test_health_generate_is_answered_during_a_long_prefill(start_sim):
    """SGLang's scheduler does not run a health check while it prefills: it answers it when the
    current chunk ends. So a prefill far longer than the health check's timeout is healthy,
    which is what keeps the guard from restarting an engine busy with a 185k prompt."""
    # 60k tokens at this factor: 15 chunks, 1.0 s of prefill (51 model s); the health check's own
    # timeout is 20 s x 0.02 = 0.4 s, so a check that waited for the prefill would fail.
    sim = start_sim(FIXED, env={**EXPANDABLE, "SGLANG_SIM_TIME_FACTOR": "0.02", "SGLANG_SIM_LOAD_SECONDS": "0"})
    result = {}

    def call():
        result["r"] = httpx.post(sim.url + "/generate", timeout=60,
                                 json={"text": words(60000, "p"), "sampling_params": {"max_new_tokens": 2}})
        result["done"] = time.monotonic()

    t = threading.Thread(target=call)
    t.start()
    wait_for(lambda: "#new-token: 4096, #cached-token: 4096" in sim.output(), what="the prefill's second chunk")
    with sim.client() as c:
        r = c.get("/health_generate")
        answered = time.monotonic()
    t.join(30)
    assert r.status_code == 200
    assert result["r"].status_code == 200 and answered < result["done"]  # answered mid-prefill
    assert "Health check failed" not in sim.output()


def test_a_lone_chunked_prefill_is_neither_running_nor_queued_as_in_sglang(start_sim):
    """SGLang 0.5.23 keeps the request whose prefill is being chunked out of both its running batch
    and its waiting queue, so its gauges and its prefill lines read 0 and 0 until the request
    decodes (what `opsctl status` must read as busy); the simulator counted it as running."""
    # 60k tokens at this factor: 15 chunks, about 5 s of prefill
    sim = start_sim(FIXED, env={**EXPANDABLE, "SGLANG_SIM_TIME_FACTOR": "0.1", "SGLANG_SIM_LOAD_SECONDS": "0"})
    labels = 'engine_type="unified",model_name="/models/Kimi-K2.6",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    first_token = {}

    def stream():
        body = {"text": words(60000, "q"), "sampling_params": {"max_new_tokens": 120}, "stream": True}
        with httpx.Client(base_url=sim.url, timeout=60) as client, client.stream("POST", "/generate", json=body) as r:
            for _ in r.iter_bytes():
                first_token.setdefault("at", time.monotonic())

    def gauge(text, name):
        return float(re.search(rf"^{name}{{{re.escape(labels)}}} (\S+)$", text, re.M).group(1))

    thread = threading.Thread(target=stream)
    thread.start()
    with sim.client() as c:
        wait_for(lambda: gauge(c.get("/metrics").text, "sglang:num_used_tokens") > 0, what="a prefill under way")
        during, scraped_at = c.get("/metrics").text, time.monotonic()
        wait_for(lambda: "at" in first_token, timeout=30, what="the first token")
        decoding = c.get("/metrics").text
        thread.join(60)
    assert thread.is_alive() is False
    assert scraped_at < first_token["at"]  # the scrape came before the prefill's end
    assert gauge(during, "sglang:num_running_reqs") == 0 and gauge(during, "sglang:num_queue_reqs") == 0
    prefills = [line for line in sim.output().splitlines() if "Prefill batch" in line]
    assert len(prefills) == 15 and all("#running-req: 0, #queue-req: 0" in line for line in prefills)
    assert gauge(decoding, "sglang:num_running_reqs") == 1  # decoding: in the running batch


def test_health_checks_side_by_side_log_prefills_of_an_idle_engine(start_sim):
    """`opsctl status` probes /health and /health_generate at once. A request whose one token comes
    from its prefill never joins SGLang's running batch, so each probe's prefill line reads 0
    running (what tells a probe's line from a client's); the simulator counted the other probe as
    running, and `opsctl status` took the probes' lines for a client's prefill."""
    sim = start_sim(FIXED, env={**EXPANDABLE, "SGLANG_SIM_LOAD_SECONDS": "0"})
    with sim.client() as c:
        for _ in range(5):
            threads = [threading.Thread(target=c.get, args=(path,)) for path in ("/health", "/health_generate")]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
    from opsctl import oom

    prefills = [line for line in sim.output().splitlines() if "Prefill batch" in line]
    assert len(prefills) >= 10 and not [line for line in prefills if oom.scheduler_working(line)], prefills


def test_startup_failures(start_sim):
    high = start_sim(["--mem-fraction-static", "0.99"], ready=False)
    low = start_sim(["--mem-fraction-static", "0.70"], ready=False)
    assert high.wait_exit() != 0 and low.wait_exit() != 0
    out = high.output()
    assert (
        "Scheduler hit an exception: Traceback" in out
        and "torch.OutOfMemoryError: CUDA out of memory." in out
    )
    assert "Received sigquit from a child process. It usually means the child failed." in out
    assert "The server is fired up" not in out
    assert (
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.7. "
    ) in low.output()


def test_health_is_503_while_loading(start_sim):
    sim = start_sim(FIXED, env={"SGLANG_SIM_LOAD_SECONDS": "100000"}, ready=False)
    deadline = time.monotonic() + 10
    while True:
        try:
            r = httpx.get(sim.url + "/health")
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert r.status_code == 503
    assert httpx.get(sim.url + "/health_generate").status_code == 503
    assert httpx.get(sim.url + "/ready").status_code == 503


def test_faults_file_and_endpoint(start_sim, tmp_path):
    faults = tmp_path / "faults.json"
    faults.write_text("{not json")
    sim = start_sim(FIXED, env={"SGLANG_SIM_FAULTS_FILE": str(faults)})
    assert f"faults file {faults} ignored" in sim.output()
    faults.write_text(json.dumps({"hang_health_generate": True}))
    with sim.client() as c:
        wait_for(lambda: c.get("/_sim/faults").json().get("hang_health_generate") is True,
                 what="the faults file's re-read")  # every 0.5 s
        # A hung engine: /health_generate does not answer at all, /health still says 200.
        with pytest.raises(httpx.ReadTimeout):
            c.get("/health_generate", timeout=1.0)
        assert c.get("/health").status_code == 200
        assert (
            c.post("/generate", json={"text": "x y", "sampling_params": {"max_new_tokens": 1}}).status_code
            == 200
        )
        state = c.post("/_sim/faults", json={"hang_health_generate": False}).json()
        assert state["hang_health_generate"] is False
        assert c.get("/health_generate").status_code == 200
        c.post("/_sim/faults", json={"crash_after_seconds": 0, "crash_kind": "nccl"})
    assert sim.wait_exit() != 0
    assert "torch.distributed.DistBackendError: NCCL error in:" in sim.output()


def test_crash_at_start_from_env(start_sim):
    sim = start_sim(FIXED, env={"SGLANG_SIM_FAULT_CRASH_AT_START": "1"}, ready=False)
    assert sim.wait_exit() != 0
    out = sim.output()
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in out
    assert "Received sigquit from a child process. It usually means the child failed." in out


def test_gpu_mem_fault_shrinks_the_card_at_the_next_start(start_sim, tmp_path):
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"gpu_mem_gib": 47}))
    env = {"SGLANG_SIM_FAULTS_FILE": str(faults)}
    fits = start_sim(["--mem-fraction-static", "0.92", "--chunked-prefill-size", "2048"], env=env)
    assert "Load weight begin. avail mem=45.83 GB" in fits.output()
    too_big = start_sim(["--mem-fraction-static", "0.93", "--chunked-prefill-size", "2048"], env=env, ready=False)
    assert too_big.wait_exit() != 0
    assert "torch.OutOfMemoryError: CUDA out of memory." in too_big.output()
    assert "GPU 0 has a total capacity of 47.00 GiB" in too_big.output()


def test_api_key(start_sim):
    """As SGLang 0.5.23 (server_args.resolved_dict), the key is in clear in the server_args log line
    and in /server_info: what opsctl and the playbooks copy from them must hide it."""
    sim = start_sim([*FIXED, "--api-key", "sekrit"])
    assert "'api_key': 'sekrit'" in sim.output()
    with sim.client() as c:
        assert c.get("/health").status_code == 200
        assert c.get("/metrics").status_code == 200
        r = c.post("/generate", json={"text": "a"})
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
        assert c.get("/server_info").status_code == 401
        ok = c.get("/server_info", headers={"Authorization": "Bearer sekrit"})
        assert ok.status_code == 200 and ok.json()["api_key"] == "sekrit"


def test_sigterm_lets_inflight_request_finish(start_sim):
    # A 20k-token prefill takes ~0.5 s at this time factor: SIGTERM lands while it runs.
    sim = start_sim(FIXED, env={"SGLANG_SIM_TIME_FACTOR": "0.05", "SGLANG_SIM_LOAD_SECONDS": "0"})
    result = {}

    def call():
        result["r"] = httpx.post(
            sim.url + "/generate",
            json={"text": words(20000, "t"), "sampling_params": {"max_new_tokens": 8}},
            timeout=30,
        )
        result["done"] = time.monotonic()

    t = threading.Thread(target=call)
    t.start()
    wait_for(lambda: "#new-token: 4096" in sim.output(), what="the prefill's first chunk")
    sent = time.monotonic()
    sim.proc.send_signal(signal.SIGTERM)
    t.join(10)
    assert result["r"].status_code == 200 and result["r"].json()["meta_info"]["completion_tokens"] == 8
    assert result["done"] > sent
    assert sim.wait_exit() == 0
    out = sim.output()
    assert out.index("Received SIGTERM") < out.index("Gracefully exiting.")


def test_unknown_flag_exits_2(tmp_path):
    from sglang_sim.process import PACKAGE_PARENT

    r = subprocess.run(
        [sys.executable, "-m", "sglang_sim", "--model-path", "/m", "--bogus-flag"],
        capture_output=True,
        text=True,
        cwd=PACKAGE_PARENT,
        timeout=30,
    )
    assert r.returncode == 2
    assert r.stderr.endswith("sglang serve: error: unrecognized arguments: --bogus-flag\n")
