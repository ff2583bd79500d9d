"""OOM/crash analysis: parsing every format, classification, recommendations, the CLI."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from opsctl import oom, planner
from opsctl.commands.oom import oom as oom_command
from opsctl.model_shapes import preset
from opsctl.startup_log import EngineConfig, last_sized_startup

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "oom"
MIB, GIB = 1 << 20, 1 << 30


def _lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text(errors="replace").splitlines()


def test_seed_excerpt_truncated_oom_is_an_activation_spike_at_094():
    [incident] = oom.analyze(_lines("seed_journal.log"), EngineConfig(mem_fraction_static=0.94))
    assert (incident.kind, incident.classification, incident.truncated) == ("cuda_oom", oom.ACTIVATION_SPIKE, True)
    assert (incident.time, incident.host, incident.pid, incident.tp_rank, incident.gpu) == (
        "2026-05-31 10:05:32", "dflash-train", 10990, 0, 0)
    assert incident.tried_bytes == 896 * MIB
    assert incident.free_bytes == round(893.38 * MIB)
    assert incident.total_bytes == round(94.97 * GIB)
    assert incident.in_use_bytes == round(93.40 * GIB)
    assert incident.other_processes == {10973: 700 * MIB}
    assert incident.reserved_unallocated_bytes is None
    assert len(incident.lines) == 2
    rec = incident.recommendation
    assert [(s.fraction, s.chunk, s.expandable_segments) for s in rec.settings] == [(0.93, 4096, True), (0.94, 4096, True)]
    assert "2.62 MiB shortfall" in rec.settings[1].why


def test_seed_excerpt_pasted_on_one_line_gives_the_same_incident():
    flat = "=== recent errors === " + " ".join(_lines("seed_journal.log"))
    [incident] = oom.analyze([flat], EngineConfig(mem_fraction_static=0.94))
    assert (incident.tried_bytes, incident.free_bytes, incident.classification) == (
        896 * MIB, round(893.38 * MIB), oom.ACTIVATION_SPIKE)


def test_seed_recommendation_checked_by_the_planner():
    [incident] = oom.analyze(_lines("seed_node.log"))
    assert incident.config.mem_fraction_static == 0.94 and incident.config.chunked_prefill_size == 8192
    assert incident.phase == "serving" and incident.engine_killed
    base = planner.PlanInputs(gpu=planner.GpuSpec(94.97, 1.56), shape=preset("kimi-k2.6"), weights_gib=74.29, tp=8)
    facts_only = planner.calibrate_from_startup(base, last_sized_startup(_lines("startup_093.log")))
    rec = oom.recommend(incident, facts_only, context_target=200_000)
    # 0.94 holds the target but this OOM proved 3.40 GiB in use besides the chunk's buffer, which
    # 0.94's 4.28 GiB cannot fit with a 4096 chunk and the margin: the planner adds its own choice,
    # the lowest fraction that holds the target (between the 0.01 grid's steps)
    assert [(s.fraction, s.chunk, s.tokens, s.meets_target, s.safe) for s in rec.settings] == [
        (0.93, 4096, 195_011, False, True),
        (0.94, 4096, 208_782, True, False),
        (0.934, 8192, 200_519, True, True),
    ]
    # the rule's "the spike fits once the chunk halves" (no margin) says why the planner disagrees
    assert "the planner, with its 0.5 GiB safety margin, finds the headroom short" in rec.settings[1].why
    assert "0.93 holds 195,011 tokens, 97.5% of the 200,000 target" in rec.notes


def test_full_current_message_with_fragmentation():
    [incident] = oom.analyze(_lines("oom_current.log"))
    assert (incident.kind, incident.classification, incident.truncated, incident.phase) == (
        "cuda_oom", oom.FRAGMENTATION, False, "serving")
    assert incident.allocated_bytes == round(90.12 * GIB)
    assert incident.private_pool_bytes == round(1.20 * GIB)
    assert incident.reserved_unallocated_bytes == round(1.40 * GIB)
    assert (incident.config.mem_fraction_static, incident.config.chunked_prefill_size) == (0.94, 8192)
    assert incident.engine_killed
    assert [(s.fraction, s.chunk, s.expandable_segments) for s in incident.recommendation.settings] == [
        (0.94, 8192, True), (0.93, 8192, True)]


def test_fragmentation_not_claimed_when_expandable_segments_already_on():
    [incident] = oom.analyze(_lines("oom_current.log"), EngineConfig(expandable_segments=True))
    assert incident.classification == oom.ACTIVATION_SPIKE


def test_older_runtime_error_form():
    [incident] = oom.analyze(_lines("oom_old.log"))
    assert (incident.kind, incident.gpu, incident.tp_rank, incident.pid) == ("cuda_oom", 2, 2, 4411)
    assert incident.tried_bytes == 448 * MIB
    assert incident.total_bytes == round(94.97 * GIB)
    assert incident.free_bytes == round(301.25 * MIB)
    assert incident.allocated_bytes == round(90.50 * GIB)
    assert incident.reserved_unallocated_bytes == round(92.88 * GIB) - round(90.50 * GIB)
    assert incident.classification == oom.FRAGMENTATION and incident.engine_killed
    # No fraction in view; the chunk defaults to SGLang's for a 94.97 GiB GPU.
    assert incident.recommendation.settings[0].chunk == 8192 and incident.recommendation.settings[0].fraction is None


def test_kv_pool_full_and_prefill_oom_are_kv_pool_not_fraction_cuts():
    incidents = oom.analyze(_lines("kv_pool.log"), EngineConfig(mem_fraction_static=0.93))
    assert [(i.kind, i.classification) for i in incidents] == [
        ("kv_pool_full", oom.KV_POOL), ("prefill_oom", oom.KV_POOL)]
    assert incidents[0].detail == "KV cache pool is full; 3 requests retracted"
    assert incidents[1].detail == "Prefill out of memory. Try to lower your batch size. Try to allocate 8192 tokens."
    assert incidents[1].recommendation.settings[0].fraction == 0.94


def test_kernel_oom_killer_is_host_memory():
    [incident] = oom.analyze(_lines("kernel_oom.log"))
    assert (incident.kind, incident.classification, incident.engine_killed) == ("kernel_oom_kill", oom.HOST_MEMORY, True)
    assert incident.detail == "kernel OOM killer killed process 1234 (python3), anon-rss 480.00 GiB"
    assert incident.recommendation.settings == []


@pytest.mark.parametrize(
    ("name", "kind", "detail"),
    [
        ("illegal_access.log", "illegal_memory_access", "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"),
        ("nccl.log", "nccl_error", "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3"),
    ],
)
def test_non_memory_crashes(name, kind, detail):
    [incident] = oom.analyze(_lines(name))
    assert (incident.kind, incident.classification, incident.detail) == (kind, oom.NOT_MEMORY, detail)
    assert incident.recommendation.action == "not a memory problem: leave --mem-fraction-static as it is"


def test_a_kernel_fault_in_a_run_the_verify_kernel_served_points_at_it_first():
    """A custom kernel's fault surfaces at a later CUDA call, so the traceback need not name it:
    in a run where the dflash verify kernel served (its self-check passed), switching it off is
    the first thing to rule out; in a run without it, the advice is as before."""
    served = ("[2026-05-27 16:30:00 TP5] dflash_kernels.sglang_plugin: verify kernel self-check passed on NVIDIA "
              "RTX PRO 6000 Blackwell Server Edition (sm_120): _verify_split_kernel_teams, 8 heads, bf16 pool, "
              "worst row error 2.6e-03 (bound 2e-02), 1.42 s; it serves target-verify")
    [incident] = oom.analyze([served, *_lines("illegal_access.log")])
    assert incident.verify_kernel and incident.classification == oom.NOT_MEMORY
    assert incident.recommendation.notes[0].startswith("the dflash verify kernel served in this run")
    assert "DFLASH_VERIFY_KERNEL=0" in incident.recommendation.notes[0]
    [without] = oom.analyze(_lines("illegal_access.log"))
    assert not without.verify_kernel
    assert not any("dflash" in note for note in without.recommendation.notes)
    failed = served.replace("passed", "FAILED").replace("; it serves target-verify",
                                                          "; rows differ from the float32 reference")
    [not_served] = oom.analyze([failed, *_lines("illegal_access.log")])  # SGLang's own kernel served there
    assert not not_served.verify_kernel


def test_other_scheduler_exception_and_lone_sigquit():
    incidents = oom.analyze([
        "[2026-05-01 00:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "ValueError: bad request shape",
        "[2026-05-01 00:00:01] Received sigquit from a child process. It usually means the child failed.",
        "[2026-05-02 00:00:01] Received sigquit from a child process. It usually means the child failed.",
    ])
    assert [(i.kind, i.classification, i.detail) for i in incidents] == [
        ("scheduler_exception", oom.NOT_MEMORY, "ValueError: bad request shape"),
        ("killed", oom.UNKNOWN, "SIGQUIT: a child process failed (no cause in view)"),
    ]


def test_startup_oom_and_no_kv_memory():
    incidents = oom.analyze([
        "[2026-05-01 00:00:00] server_args=ServerArgs(mem_fraction_static=0.97, chunked_prefill_size=8192)",
        "[2026-05-01 00:00:05 TP0] Load weight begin. avail mem=93.41 GB",
        # (after the weights: an OOM before this line is the weights' own, test below)
        "[2026-05-01 00:00:08 TP0] Load weight end. elapsed=3.00 s, type=DeepseekV3ForCausalLM, "
        "dtype=torch.bfloat16, avail mem=19.12 GB, mem usage=74.29 GB.",
        "[2026-05-01 00:00:09 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 94.97 GiB of which 1.00 GiB is free.",
        "[2026-05-01 01:00:00] server_args=ServerArgs(mem_fraction_static=0.70, chunked_prefill_size=8192)",
        "[2026-05-01 01:00:09 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.7. Raise --mem-fraction-static above 0.796 (minimum viable = 1 - available/pre = 0.7953). If using speculative decoding, draft weights are now counted.",
    ])
    assert [(i.kind, i.classification, i.phase) for i in incidents] == [
        ("cuda_oom", oom.STARTUP, "startup"), ("startup_no_kv_memory", oom.STARTUP, "startup")]
    assert incidents[0].recommendation.settings[0].fraction == 0.96
    assert incidents[1].recommendation.settings[0].fraction == 0.796


def test_garbage_and_truncated_lines_never_crash():
    incidents = oom.analyze(_lines("garbage.log"))
    assert [(i.kind, i.tried_bytes) for i in incidents] == [("cuda_oom", 896 * MIB), ("cuda_oom", None)]
    assert all(i.truncated for i in incidents)
    assert oom.analyze(["", "]]]", "\x00", "May 31", "[2026-"]) == []


def test_scanner_yields_incidents_as_they_complete():
    scanner = oom.OomScanner(EngineConfig(mem_fraction_static=0.94))
    first, second = _lines("seed_journal.log")
    assert scanner.feed(first) == [] and scanner.feed(second) == []
    [done] = scanner.feed("May 31 10:05:33 dflash-train python[10990]: [2026-05-31 10:05:33 TP0] next record")
    assert done.tried_bytes == 896 * MIB
    assert scanner.flush() == []


def test_read_journal_without_journalctl(monkeypatch):
    monkeypatch.setattr(oom.shutil, "which", lambda name: None)
    with pytest.raises(oom.JournalError, match="journalctl not found"):
        list(oom.read_journal("sglang.service"))


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_seed_file_exit_1_and_text():
    result = CliRunner().invoke(oom_command, ["--file", str(FIXTURES / "seed_journal.log"), "--mem-fraction-static", "0.94"],
                                terminal_width=200)
    assert result.exit_code == 1
    assert "tried 896.00 MiB, free 893.38 MiB of 94.97 GiB" in result.output
    assert "recommend --mem-fraction-static 0.93 + --chunked-prefill-size 4096 + expandable_segments:True" in result.output
    assert "or --mem-fraction-static 0.94 + --chunked-prefill-size 4096 + expandable_segments:True" in result.output


def test_cli_checks_its_advice_with_the_planner_when_the_log_holds_a_sized_start(tmp_path, monkeypatch):
    """The seed's node log (a start that logged its pool, then the 32k OOM): each advice shows its
    pool against the 200k target, as the seed's operator had to work out by hand (0.93 holds
    97.5% of it)."""
    monkeypatch.setenv("OPSCTL_CONFIG", str(tmp_path / "none.yml"))  # off the node: the defaults
    result = CliRunner().invoke(oom_command, ["--file", str(FIXTURES / "seed_node.log")], terminal_width=250)
    assert result.exit_code == 1
    assert "recommend --mem-fraction-static 0.93 + --chunked-prefill-size 4096 + expandable_segments:True -> 195,011 tokens, spike fits" in result.output
    assert "note: 0.93 holds 195,011 tokens, 97.5% of the 200,000 target" in result.output
    # without a sized start in view the advice stands unchecked
    plain = CliRunner().invoke(oom_command, ["--file", str(FIXTURES / "seed_journal.log"), "--mem-fraction-static",
                                             "0.94"], terminal_width=250)
    assert "recommend --mem-fraction-static 0.93" in plain.output and not re.search(r"-> [\d,]+ tokens", plain.output)


def test_a_no_kv_start_is_never_advised_to_raise_to_where_it_failed():
    line = ("[2026-05-31 10:00:00] ValueError: Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static=0.9. Raise --mem-fraction-static above 0.9 (minimum viable = 0.8996).")
    [incident] = oom.analyze([line], EngineConfig(mem_fraction_static=0.9))
    assert incident.kind == "startup_no_kv_memory"
    assert incident.recommendation.settings[0].fraction == 0.91


@pytest.mark.parametrize("prefix", ["[rank3]:", "[/rank3]"])
def test_journal_text_with_square_brackets_is_printed_as_it_is(prefix):
    """Journal text went through rich markup: PyTorch's "[rank3]:" prefix vanished from the
    output, and "[/rank3]" crashed `opsctl oom` with a MarkupError traceback (exit 1, "found")."""
    text = (FIXTURES / "nccl.log").read_text().replace("DistBackendError: NCCL", f"DistBackendError: {prefix} NCCL")
    result = CliRunner().invoke(oom_command, ["--file", "-"], input=text, terminal_width=250)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1 and f"{prefix} NCCL error in:" in result.output


def test_cli_json_from_stdin():
    import json

    result = CliRunner().invoke(oom_command, ["--file", "-", "--json"], input=(FIXTURES / "oom_old.log").read_text())
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["count"] == 1 and data["incidents"][0]["tried_bytes"] == 448 * MIB


def test_cli_nothing_found_exit_0():
    result = CliRunner().invoke(oom_command, ["--file", "-"], input="[2026-05-31 10:00:00] all good\n")
    assert result.exit_code == 0 and "No OOMs or crashes found." in result.output


def test_cli_usage_errors():
    runner = CliRunner()
    missing = runner.invoke(oom_command, ["--file", "/nonexistent/x.log"])
    assert missing.exit_code == 2 and "cannot read /nonexistent/x.log" in missing.output
    both = runner.invoke(oom_command, ["--file", "-", "--since", "1 hour ago"], input="")
    assert both.exit_code == 2 and "--since applies to the journal only" in both.output
    fraction = runner.invoke(oom_command, ["--file", "-", "--mem-fraction-static", "1.5"], input="")
    assert fraction.exit_code == 2
    chunk = runner.invoke(oom_command, ["--file", "-", "--chunked-prefill-size", "-7"], input="")
    assert chunk.exit_code == 2 and "use a positive chunk size, or -1" in chunk.output


def test_cli_journal_failure(monkeypatch):
    def fail(unit, since=None):
        raise oom.JournalError("journalctl not found; read a saved log with --file PATH (or - for stdin)")
        yield  # pragma: no cover

    monkeypatch.setattr(oom, "read_journal", fail)
    result = CliRunner().invoke(oom_command, [])
    assert result.exit_code == 3  # not 1, "found": a script must not take "could not look" for an OOM
    assert "Error: journalctl not found; read a saved log with --file PATH (or - for stdin)" in result.output


def test_a_journal_with_no_line_of_the_unit_is_not_reported_as_no_ooms(monkeypatch):
    """journalctl exits 0 for a unit that never logged (a mistyped --unit) and for a host with no
    journal files: "No OOMs or crashes found", exit 0, was a false all-clear."""
    def run(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 0, "-- No entries --\n", "")
    monkeypatch.setattr(oom.shutil, "which", lambda name: "/bin/journalctl")
    monkeypatch.setattr(oom.subprocess, "run", run)
    result = CliRunner().invoke(oom_command, ["--unit", "sglnag.service"])
    assert result.exit_code == 3 and "the journal holds no line of sglnag.service" in result.output
    later = CliRunner().invoke(oom_command, ["--unit", "sglang.service", "--since", "1 hour ago"])
    assert later.exit_code == 0 and "no journal line of sglang.service since 1 hour ago" in later.output

    monkeypatch.setattr(oom.subprocess, "run", lambda argv, **kwargs: subprocess.CompletedProcess(
        argv, 0, "", "No journal files were found.\n"))
    with pytest.raises(oom.JournalError, match="No journal files were found"):
        list(oom.read_journal("sglang.service"))


def test_a_later_kill_is_not_filed_under_a_retraction():
    """A kill a day after a KV-pool retraction is its own death (before: it was attached to the
    retraction, whose advice is to raise the fraction, and no 'killed' incident was reported)."""
    incidents = oom.analyze([
        "May 31 11:00:01 dflash-train python[20990]: [2026-05-31 11:00:01 TP0] KV cache pool is full. Retract "
        "requests. #retracted_reqs: 3, #new_tokens_gained: 41234, #new_token_ratio: 0.5012 -> 0.7000",
        "Jun 01 15:00:00 dflash-train systemd[1]: sglang.service: Main process exited, code=killed, status=9/KILL",
    ])
    assert [(i.kind, i.engine_killed) for i in incidents] == [("kv_pool_full", False), ("killed", False)]


def test_one_oom_crash_is_one_incident_with_systemds_kill_line():
    """SGLang's SIGQUIT handler kills the launcher too, so systemd logs a kill right after: the
    same death (before: a second 'killed' incident of unknown cause)."""
    incidents = oom.analyze([
        "May 31 10:05:32 dflash-train python[10990]: [2026-05-31 10:05:32 TP0] Scheduler hit an exception: "
        "Traceback (most recent call last):",
        "May 31 10:05:32 dflash-train python[10990]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "896.00 MiB. GPU 0 has a total capacity of 94.97 GiB of which 893.38 MiB is free.",
        "May 31 10:05:33 dflash-train python[10970]: [2026-05-31 10:05:33] Received sigquit from a child process. "
        "It usually means the child failed.",
        "May 31 10:05:34 dflash-train systemd[1]: sglang.service: Main process exited, code=killed, status=9/KILL",
    ])
    assert [(i.kind, i.engine_killed) for i in incidents] == [("cuda_oom", True)]
    assert "status=9/KILL" in incidents[0].lines[-1]


def test_two_failed_starts_are_two_incidents():
    lines = []
    for hour, fraction in ((0, "0.70"), (1, "0.75")):
        lines += [f"[2026-05-01 0{hour}:00:00] server_args=ServerArgs(mem_fraction_static={fraction}, "
                  "chunked_prefill_size=8192)",
                  f"[2026-05-01 0{hour}:00:09 TP0] Scheduler hit an exception: Traceback (most recent call last):",
                  f"ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static="
                  f"{float(fraction)}. Raise --mem-fraction-static above 0.796"]
    incidents = oom.analyze(lines)
    assert [(i.kind, i.config.mem_fraction_static) for i in incidents] == [
        ("startup_no_kv_memory", 0.70), ("startup_no_kv_memory", 0.75)]


def test_an_oom_in_a_serving_graph_replay_is_not_a_startup_failure():
    """With no engine start in view (a rotated journal, the guard's backlog), batch lines show the
    engine serving; 0.5.23 replays its prefill graphs from runner/prefill_cuda_graph_runner.py, so
    that frame is no sign of a start (before: 'lower the fraction: it does not fit at startup')."""
    incidents = oom.analyze([
        "[2026-05-31 10:05:30 TP0] Prefill batch, #new-seq: 1, #new-token: 4096, #cached-token: 0, token usage: 0.40",
        "[2026-05-31 10:05:32 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/model_executor/runner/prefill_cuda_graph_runner.py", line 412, in replay',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total capacity of "
        "94.97 GiB of which 893.38 MiB is free.",
    ])
    assert [(i.kind, i.phase, i.classification) for i in incidents] == [("cuda_oom", "serving", oom.ACTIVATION_SPIKE)]


def test_cli_on_the_node_reads_its_unit_and_env_files(tmp_path, monkeypatch, node_config):
    """On the node the journal of the configured unit is read, and the env files say what the
    log does not: with expandable_segments on there, the OOM is an activation spike, as the
    guard judges it (before: sglang.service whatever the config, and 'enable expandable_segments')."""
    env_file = tmp_path / "sglang.env"
    env_file.write_text("SGLANG_MEM_FRACTION_STATIC=0.93\nPYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n")
    node_config(unit="engine.service")
    monkeypatch.delenv("OPSCTL_UNIT", raising=False)
    read = []

    def journal(unit, since=None):
        read.append(unit)
        return iter(_lines("oom_current.log"))
    monkeypatch.setattr(oom, "read_journal", journal)
    assert oom.analyze(_lines("oom_current.log"))[0].classification == oom.FRAGMENTATION  # the log alone
    result = CliRunner().invoke(oom_command, ["--json"])
    assert result.exit_code == 1 and read == ["engine.service"]
    assert '"classification": "activation_spike"' in result.output
    flags = CliRunner().invoke(oom_command, ["--json", "--no-expandable-segments", "--unit", "other.service"])
    assert read[-1] == "other.service" and '"classification": "fragmentation"' in flags.output


def test_an_oom_while_the_weights_load_is_not_sent_to_the_fraction():
    """The fraction sizes the KV pool after the weights: an OOM in load_model (another process
    holds 12 GiB of the GPU) was classified a startup allocation, with the advice to lower the
    fraction, and the guard would have walked the fraction down for nothing."""
    [incident] = oom.analyze(_lines("weights_load.log"))
    assert (incident.kind, incident.classification) == ("cuda_oom", oom.WEIGHTS_LOAD)
    assert "--mem-fraction-static cannot help" in incident.recommendation.action
    assert incident.recommendation.settings == []
    assert any("Process N has" in note for note in incident.recommendation.notes)
    from opsctl.config import GuardConfig
    from opsctl.guard import policy
    from opsctl.guard.daemon import death_from
    from opsctl.overrides import TunedValues
    step = policy.decide(death_from([incident]), TunedValues(0.93, 4096, True), GuardConfig())
    assert (step.action, step.rung) == (policy.RESTART, policy.AS_IS)  # no fraction step


def test_an_oom_while_the_dflash_draft_loads_is_still_the_fractions():
    """The DFlash draft loads after the target's pool, into the headroom the fraction leaves: an
    OOM in its load_model is fixed by a lower fraction, unlike one in the target's."""
    incidents = oom.analyze([
        "[2026-05-31 10:20:01] server_args={'model_path': '/models/Kimi-K2.6', 'mem_fraction_static': 0.95, "
        "'chunked_prefill_size': 4096, 'tp_size': 8, 'page_size': 1, 'speculative_algorithm': 'DFLASH'}",
        "[2026-05-31 10:20:40 TP0] Load weight begin. avail mem=93.41 GB",
        "[2026-05-31 10:22:40 TP0] Load weight end. elapsed=120.00 s, type=DeepseekV3ForCausalLM, "
        "dtype=torch.bfloat16, avail mem=19.12 GB, mem usage=74.29 GB.",
        "[2026-05-31 10:22:45 TP0] KV Cache is allocated. #tokens: 210000, KV size: 14.00 GB",
        "[2026-05-31 10:22:45 TP0] Memory pool end. avail mem=4.10 GB",
        "[2026-05-31 10:22:46 TP0] Load weight begin. avail mem=4.10 GB",
        "[2026-05-31 10:22:50 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1290, in load_model',
        "    self.model = self.loader.load_model(",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "94.97 GiB of which 1.10 GiB is free.",
        "[2026-05-31 10:22:51] Received sigquit from a child process. It usually means the child failed.",
    ])
    oom_incident = next(i for i in incidents if i.kind == "cuda_oom")
    assert oom_incident.classification == oom.STARTUP
    assert oom_incident.recommendation.action.startswith("lower --mem-fraction-static")


def test_an_oom_of_a_run_not_in_view_calibrates_nothing_from_the_values_in_force(tmp_path, monkeypatch, node_config):
    """The seed's OOM at 0.94 / 8192, its server_args line cut off by --since, then the start at
    0.93 / 4096 with expandable segments now in force: the OOM's spike was taken as observed at
    the env files' 0.93 / 4096, and the advice said no fraction holds the target."""
    lines = _lines("seed_journal.log") + _lines("startup_093.log")
    [guessed] = oom.analyze(lines, EngineConfig(0.93, 4096, True))
    assert guessed.config_guessed and guessed.spike_observation() is None
    [stated] = oom.analyze(lines, EngineConfig(0.94, 8192, False), hint_stated=True)  # the operator's flags
    assert not stated.config_guessed and stated.spike_observation().fraction == 0.94
    (tmp_path / "sglang.env").write_text("SGLANG_MEM_FRACTION_STATIC=0.93\nSGLANG_CHUNKED_PREFILL_SIZE=4096\n"
                                         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n")
    node_config()
    monkeypatch.setattr(oom, "read_journal", lambda unit, since=None: iter(lines))
    result = CliRunner().invoke(oom_command, ["--since", "10:00"], terminal_width=250)
    assert result.exit_code == 1, result.output
    assert "--mem-fraction-static 0.934 + --chunked-prefill-size 8192 + expandable_segments:True -> 200,519 tokens, " \
           "spike fits" in result.output


def test_an_oom_of_a_rank_still_loading_weights_is_the_weights_load_though_another_rank_is_done():
    """Ranks load side by side: TP0 done, TP3 (beside another process's 12 GiB) fails in
    load_model. Judged for the start as a whole, it was a startup allocation (lower the fraction)."""
    incidents = oom.analyze([
        "[2026-05-31 10:20:01] server_args={'model_path': '/models/Kimi-K2.6', 'mem_fraction_static': 0.93, "
        "'chunked_prefill_size': 4096, 'tp_size': 8, 'page_size': 1, 'speculative_algorithm': 'DFLASH'}",
        "[2026-05-31 10:20:40 TP0] Load weight begin. avail mem=93.41 GB",
        "[2026-05-31 10:20:40 TP3] Load weight begin. avail mem=81.41 GB",
        "[2026-05-31 10:24:11 TP0] Load weight end. elapsed=210.55 s, type=DeepseekV3ForCausalLM, avail mem=19.12 GB, "
        "mem usage=74.29 GB.",
        "[2026-05-31 10:24:12 TP3] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1290, in load_model',
        "    self.model = self.loader.load_model(",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 94.97 "
        "GiB of which 1.10 GiB is free. Process 4242 has 12.00 GiB memory in use.",
        "[2026-05-31 10:24:13] Received sigquit from a child process. It usually means the child failed.",
    ])
    assert [(i.kind, i.classification, i.tp_rank) for i in incidents] == [("cuda_oom", oom.WEIGHTS_LOAD, 3)]


def test_an_oom_while_the_dflash_draft_loads_before_the_pool_is_the_weights_load():
    """SGLang 0.5.23 loads the target, then the DFlash draft, then sizes the KV pool
    (Scheduler.init_model_worker): an OOM in the draft's load comes before the fraction has sized
    anything, so lowering it cannot help (it was a startup allocation, and the guard walked the
    fraction down)."""
    incidents = oom.analyze([
        "[2026-05-31 10:20:01] server_args={'model_path': '/models/Kimi-K2.6', 'mem_fraction_static': 0.93, "
        "'chunked_prefill_size': 4096, 'tp_size': 8, 'page_size': 1, 'speculative_algorithm': 'DFLASH'}",
        "[2026-05-31 10:20:40 TP0] Load weight begin. avail mem=93.41 GB",
        "[2026-05-31 10:24:11 TP0] Load weight end. elapsed=210.55 s, type=DeepseekV3ForCausalLM, avail mem=19.12 GB, "
        "mem usage=74.29 GB.",
        "[2026-05-31 10:24:12 TP0] Load weight begin. avail mem=19.12 GB",
        "[2026-05-31 10:24:14 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl/python/sglang/srt/model_executor/model_runner.py", line 1290, in load_model',
        "    self.model = self.loader.load_model(",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 94.97 "
        "GiB of which 1.10 GiB is free. Process 4242 has 16.00 GiB memory in use.",
        "[2026-05-31 10:24:15] Received sigquit from a child process. It usually means the child failed.",
    ])
    assert [(i.kind, i.classification) for i in incidents] == [("cuda_oom", oom.WEIGHTS_LOAD)]


def test_one_retraction_logged_by_every_tp_rank_is_one_incident():
    """SGLang 0.5.23 logs "KV cache pool is full. Retract requests." on every TP rank: TP8 made 8
    incidents of one retraction, and filled the guard's window of incidents 8 times as fast."""
    lines = [f"[2026-05-31 11:00:0{second} TP{rank}] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
             "#new_tokens_gained: 8192" for second in (1, 5) for rank in range(8)]
    incidents = oom.analyze(lines)
    assert [(i.kind, i.time, len(i.lines)) for i in incidents] == [
        ("kv_pool_full", "2026-05-31 11:00:01", 8), ("kv_pool_full", "2026-05-31 11:00:05", 8)]
