"""`opsctl bench` against the lab engine (images/engine-sim/sglang_sim), run as a subprocess.

The simulator's timing model is pure functions in `sglang_sim.timing`; the truth below is
computed from them (times the time factor), never from copied constants. The simulator sleeps
to absolute due times, so it is never faster than its model: lower bounds hold on any machine.
How close the figures come to the model (a busy machine stretches them) is a benchmark,
bench_sim_accuracy.py, which prints them. Here, upper bounds are wide sanity bands: they catch
a benchmark that counts steps, units or windows wrongly, not a machine's jitter.
"""

from __future__ import annotations

import pytest
from simbench import ACCURACY_ENV, ACCURACY_FLAGS, ACCURACY_TIME_FACTOR, FAST_TIME_FACTOR, HAVE_SIM, Sim, truth

from opsctl.bench.client import BenchClient
from opsctl.bench.runner import SweepObserver, SweepSettings, load_result, run_concurrency, run_sweep

if not HAVE_SIM:
    pytest.skip("the lab engine (images/engine-sim/sglang_sim) is not here", allow_module_level=True)

# A wrong count, unit or window is off by 2x or more; a stall of a few tens of ms in a 0.3 s
# window is 10%. (bench_sim_accuracy.py prints the figures against the model's, goal 3%.) A
# window has no lower bound a slow machine keeps (the simulator keeps its schedule: a first token
# read late shortens it), so the bands below are upper ones or cover whole requests.
SANITY = (0.5, 2.0)
QUEUE_SLACK_S = 0.1


@pytest.fixture
def sim_factory(tmp_path):
    sims: list[Sim] = []

    def start(flags: list[str], time_factor: float = FAST_TIME_FACTOR, env: dict | None = None) -> Sim:
        sims.append(Sim(tmp_path, flags, time_factor, env))
        return sims[-1]

    yield start
    for s in sims:
        s.stop()


def test_a_sweep_measures_what_the_simulator_serves(sim_factory):
    sim = sim_factory(ACCURACY_FLAGS, ACCURACY_TIME_FACTOR, ACCURACY_ENV)
    contexts, gen = [1400, 4000, 11000, 16000], 160
    with BenchClient(sim.url) as client:
        result = run_sweep(SweepSettings(contexts=contexts, gen=gen, repeats=3), client)
    assert result.complete
    for p in result.points:
        want = truth(int(p.prompt_tokens), gen, ACCURACY_TIME_FACTOR)
        assert p.prompt_tokens == p.context_requested
        assert [s.cached_tokens for s in p.samples] == [0, 0, 0]
        # TTFT carries the model's whole prefill (never less: the simulator is never early)
        assert p.ttft_s >= 0.995 * want["ttft_s"], (p.context_requested, p.ttft_s, want)
        decode_s = (gen - 1) * want["step_ms"] / 1e3
        for sample in p.samples:  # one token a step after the first: 159 steps, at the window's mean context
            assert sample.decode_steps == gen - 1 and sample.completion_tokens == gen
            assert sample.decode_ctx_mean == pytest.approx(p.prompt_tokens + gen / 2, abs=1)
            # The last token is due a prefill and every step after the request came: never sooner.
            # (The window alone has no lower bound: the simulator keeps its schedule, so a first
            # token read late shortens it.)
            assert sample.ttft_s + sample.decode_window_s >= 0.995 * (want["ttft_s"] + decode_s), sample
        assert p.step_ms <= SANITY[1] * want["step_ms"], (p.context_requested, p.step_ms, want)
    # each longer context takes longer to prefill and to step (the model grows with the context by
    # much more than any stall here: 1.4k to 16k is 10x the prefill)
    first, last = result.points[0], result.points[-1]
    assert last.ttft_s > first.ttft_s and last.step_ms > first.step_ms
    assert result.fit["ms_per_1k"] > 0


def test_concurrent_streams_queue_their_prefills_and_decode_side_by_side(sim_factory):
    # The simulator runs one prefill at a time (as SGLang's scheduler does with chunked prefill)
    # and decodes every stream at its own context's step time.
    sim = sim_factory(ACCURACY_FLAGS, ACCURACY_TIME_FACTOR, ACCURACY_ENV)
    context, streams, gen = 8000, 4, 120
    with BenchClient(sim.url) as client:
        result = run_concurrency(client, context, streams, gen)
    want = truth(context, gen, ACCURACY_TIME_FACTOR)
    assert result.errors == [] and len(result.samples) == streams
    assert {(s.prompt_tokens, s.cached_tokens, s.completion_tokens) for s in result.samples} == {(context, 0, gen)}
    # The k-th stream's first token waits for k + 1 prefills, one after the other (a bench that
    # timed every stream from its own prefill's start would see one prefill each: 0.78 s short).
    # QUEUE_SLACK_S: the streams' sends, released together, leave their threads a few ms apart.
    ttfts = sorted(s.ttft_s for s in result.samples)
    for k, ttft in enumerate(ttfts):
        assert ttft >= (k + 1) * want["ttft_s"] - QUEUE_SLACK_S, (k, ttfts, want["ttft_s"])
    assert ttfts[-1] <= SANITY[1] * streams * want["ttft_s"], (ttfts, want["ttft_s"])
    for sample in result.samples:
        assert sample.decode_tok_s >= SANITY[0] * want["decode_tok_s"], (sample.decode_tok_s, want)
    # Aggregate: every completion token over the time until the last stream finished: the four
    # prefills, then that stream's decode (the simulator is never early for either).
    last_decode = (gen - 1) / want["decode_tok_s"]
    assert result.wall_s >= 0.995 * (streams * want["ttft_s"] + last_decode), (result.wall_s, want)
    assert result.wall_s <= SANITY[1] * (ttfts[-1] + last_decode), (result.wall_s, ttfts)


def test_nonce_defeats_the_radix_cache(sim_factory, monkeypatch):
    sim = sim_factory(["--mem-fraction-static", "0.93", "--chunked-prefill-size", "4096"])
    with BenchClient(sim.url) as client:
        server_info = client.server_info()
    assert server_info["disable_radix_cache"] is False  # the cache is on
    settings = SweepSettings(contexts=[2000, 4000], gen=8, repeats=3, flush=False)
    with BenchClient(sim.url) as client:
        result = run_sweep(settings, client)
    assert [[s.cached_tokens for s in p.samples] for p in result.points] == [[0, 0, 0], [0, 0, 0]]
    assert all(p.n_valid == 3 for p in result.points)

    # Control: the same prompt without a fresh nonce is served from the cache, and flagged.
    monkeypatch.setattr("opsctl.bench.prompts.new_nonce", lambda: "fixed")
    with BenchClient(sim.url) as client:
        control = run_sweep(
            SweepSettings(contexts=[4000], gen=8, repeats=2, flush=False, warmup=False), client
        )
    samples = control.points[0].samples
    assert samples[0].cached_tokens == 0
    assert samples[1].cached_tokens == 3999  # the simulator recomputes the last token
    assert samples[1].flags == ["cached"] and control.points[0].n_valid == 1


def test_server_dies_mid_sweep_then_resume_after_the_fix(sim_factory, tmp_path):
    out = tmp_path / "sweep.json"
    contexts = [1400, 11000, 32000, 64000]
    # The seed's first config: 0.94, default chunking, no expandable segments.
    bad = sim_factory(["--mem-fraction-static", "0.94"])
    with BenchClient(bad.url) as client:
        result = run_sweep(
            SweepSettings(contexts=contexts, gen=8),
            client,
            out_path=out,
            journal_excerpt=bad.journal_excerpt,
            health_retry_delay_s=0.05,
        )
    assert result.stopped is not None and result.stopped.kind == "server_died"
    died_at = result.stopped.context
    assert died_at in contexts[1:]
    assert f"server died at point {died_at // 1000}k" in result.stopped.reason
    assert "CUDA out of memory" in result.stopped.journal
    saved = load_result(out)
    kept = [p.context_requested for p in saved.points]
    assert kept == contexts[: contexts.index(died_at)] and kept
    assert bad.proc.wait(10) is not None  # the process is gone, as on the node

    # The fix (the seed's second config), then --resume: only the missing points run.
    good = sim_factory(
        ["--mem-fraction-static", "0.93", "--chunked-prefill-size", "4096"],
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    started = []

    class Seen(SweepObserver):
        def point_started(self, index, total, context, repeat, repeats):
            started.append(context)

    with BenchClient(good.url) as client:
        resumed = run_sweep(
            SweepSettings(contexts=contexts, gen=8),
            client,
            out_path=out,
            resume_from=load_result(out),
            observer=Seen(),
        )
    assert resumed.complete and load_result(out).complete
    assert started == contexts[contexts.index(died_at) :]
    assert [p.context_requested for p in resumed.points] == contexts
    segment = resumed.meta["segments"][-1]
    assert segment["server_args_changed"]["mem_fraction_static"] == [0.94, 0.93]
    assert segment["server_args_changed"]["chunked_prefill_size"] == [8192, 4096]


def test_seed_table_shape_through_the_cli(sim_factory, tmp_path):
    """The seed's six points, end to end through `opsctl bench run` and `report --markdown`."""
    from click.testing import CliRunner

    from opsctl.commands.bench import bench

    factor = 0.001  # shape only: at this factor the HTTP costs, not the model, set the small numbers
    sim = sim_factory(
        ["--mem-fraction-static", "0.93", "--chunked-prefill-size", "4096"],
        factor,
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    out = tmp_path / "seed.json"
    r = CliRunner().invoke(
        bench,
        [
            "run",
            "--url",
            sim.url,
            "--contexts",
            "1.4k,11k,32k,64k,128k,185k",
            "--gen",
            "24",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(bench, ["report", str(out), "--markdown", "--time-factor", str(factor)])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert (
        lines[0] == "| actual ctx | TTFT | prefill tok/s | decode tok/s | ms/step | floor ms/step | × floor |"
    )
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["1.4k", "11k", "32k", "64k", "128k", "185k"]
    result = load_result(out)
    assert result.complete and [p.prompt_tokens for p in result.points] == [
        1400,
        11000,
        32000,
        64000,
        128000,
        185000,
    ]
    # Each TTFT carries the model's prefill (never less); how far above it on this machine is
    # bench_sim_accuracy.py's figure (at this factor the HTTP round trip outweighs the small
    # points' prefill, 0.5 ms at 1.4k, so their order is the machine's, not the model's).
    want = [truth(int(p.prompt_tokens), 24, factor)["ttft_s"] for p in result.points]
    ttft = [p.ttft_s for p in result.points]
    assert all(t >= 0.995 * w for t, w in zip(ttft, want, strict=True)), (ttft, want)
    assert all(p.samples[0].cached_tokens == 0 for p in result.points)
