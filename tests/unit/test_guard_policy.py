"""The guard's pure decisions: the activation ladder, startup moves, unknown causes, budget, backoff, hangs."""

from opsctl import oom
from opsctl.config import GuardConfig
from opsctl.guard import policy
from opsctl.overrides import TunedValues

LIMITS = GuardConfig(budget_per_hour=4, backoff_initial_s=5, backoff_max_s=60, max_blind_restarts=3, chunk_floor=2048)
SEED = TunedValues(0.94, 8192, False)
OOM = policy.Death(oom.FRAGMENTATION, "cuda_oom")


def test_activation_ladder_order_from_the_seed_config():
    steps, current = [], SEED
    while (step := policy.decide(OOM, current, LIMITS, lowest_fraction=lambda: 0.926)).action == policy.TUNE:
        steps.append((step.rung, step.to))
        current = step.to
    assert steps == [
        ("expandable_segments", TunedValues(0.94, 8192, True)),
        ("halve_chunk", TunedValues(0.94, 4096, True)),
        ("halve_chunk", TunedValues(0.94, 2048, True)),
        ("lower_fraction", TunedValues(0.93, 2048, True)),
    ]
    assert step.action == policy.STOP and "exhausted" in step.why and "0.926" in step.why


def test_no_fraction_rung_without_the_planner():
    step = policy.decide(policy.Death(oom.ACTIVATION_SPIKE, "cuda_oom"), TunedValues(0.94, 2048, True), LIMITS)
    assert step.action == policy.STOP and "cannot say" in step.why


def test_failed_configs_are_passed_over():
    step = policy.decide(OOM, SEED, LIMITS, failed=[TunedValues(0.94, 8192, True)])
    assert (step.rung, step.to) == ("halve_chunk", TunedValues(0.94, 4096, True))


def test_with_chunking_off_the_ladder_turns_it_on_then_halves_it():
    """--chunked-prefill-size -1: an unchunked prefill's spike is the whole prompt's. The ladder
    went from expandable segments straight to the fraction, then stopped "exhausted at chunk -1"."""
    steps, current = [], TunedValues(0.95, -1, False)
    while (step := policy.decide(OOM, current, LIMITS, lowest_fraction=lambda: 0.94)).action == policy.TUNE:
        steps.append((step.rung, step.to))
        current = step.to
    assert steps == [
        ("expandable_segments", TunedValues(0.95, -1, True)),
        ("enable_chunking", TunedValues(0.95, 8192, True)),
        ("halve_chunk", TunedValues(0.95, 4096, True)),
        ("halve_chunk", TunedValues(0.95, 2048, True)),
        ("lower_fraction", TunedValues(0.94, 2048, True)),
    ]
    # no room to lower the fraction: chunking is still a rung, not "exhausted"
    step = policy.decide(OOM, TunedValues(0.95, -1, True), LIMITS, lowest_fraction=lambda: 0.95)
    assert (step.action, step.rung, step.to) == (policy.TUNE, "enable_chunking", TunedValues(0.95, 8192, True))


def test_startup_no_kv_raises_the_fraction_and_oom_lowers_it():
    no_kv = policy.Death(oom.STARTUP, "startup_no_kv_memory", raise_to=0.789)
    step = policy.decide(no_kv, TunedValues(0.7, 8192, True), LIMITS)
    assert (step.rung, step.to.mem_fraction_static) == ("raise_fraction", 0.789)
    assert policy.decide(no_kv, TunedValues(0.95, 8192, True), LIMITS).action == policy.STOP
    warmup = policy.Death(oom.STARTUP, "cuda_oom")
    step = policy.decide(warmup, TunedValues(0.97, 8192, True), LIMITS, lowest_fraction=lambda: 0.926)
    assert (step.rung, step.to.mem_fraction_static) == ("lower_fraction", 0.96)


def test_a_startup_without_room_for_the_pool_raises_the_fraction_to_the_value_sglang_names():
    """SGLang names the minimum already rounded up to 0.001 ("Raise --mem-fraction-static above
    0.942"): the guard raised it to the next 0.01 above (0.95), taking headroom for nothing, and
    a named 0.950, the guard's maximum, became 0.96 and stopped the guard."""
    def named(value):
        return policy.Death(oom.STARTUP, "startup_no_kv_memory", raise_to=value)
    for fraction in (0.93, 0.935):
        step = policy.decide(named(0.942), TunedValues(fraction, 4096, True), LIMITS)
        assert (step.action, step.rung, step.to.mem_fraction_static) == (policy.TUNE, "raise_fraction", 0.942)
    step = policy.decide(named(0.95), TunedValues(0.93, 4096, True), LIMITS)
    assert (step.action, step.to.mem_fraction_static) == (policy.TUNE, 0.95)
    step = policy.decide(named(0.951), TunedValues(0.93, 4096, True), LIMITS)
    assert step.action == policy.STOP and "0.951" in step.why
    # none named: one step up
    step = policy.decide(named(None), TunedValues(0.93, 4096, True), LIMITS)
    assert (step.action, step.to.mem_fraction_static) == (policy.TUNE, 0.94)


def test_unknown_causes_restart_as_is_then_stop():
    nccl = policy.Death(oom.NOT_MEMORY, "nccl_error")
    for done in range(3):
        step = policy.decide(nccl, SEED, LIMITS, blind_restarts_last_hour=done)
        assert (step.action, step.rung, step.to) == (policy.RESTART, "as_is", SEED)
    step = policy.decide(nccl, SEED, LIMITS, blind_restarts_last_hour=3)
    assert step.action == policy.STOP and "restarted as-is 3 time(s)" in step.why
    hang = policy.decide(policy.Death(policy.HANG, "hang"), SEED, LIMITS)
    assert hang.rung == "as_is" and "hung" in hang.why


def test_budget_is_a_sliding_hour():
    now = 10_000.0
    assert policy.budget_left([now - 4000, now - 10, now - 5], now, LIMITS) == 2
    assert policy.budget_left([now - i for i in range(4)], now, LIMITS) == 0


def test_backoff_first_immediate_then_doubling_capped():
    now = 10_000.0
    assert policy.backoff_s([], now, LIMITS) == 0
    assert policy.backoff_s([now], now, LIMITS) == 5
    assert policy.backoff_s([now - 1, now], now, LIMITS) == 10
    assert policy.backoff_s([now - 3, now - 2, now - 1, now - 0.5, now], now, LIMITS) == 60
    assert policy.backoff_s([now - 100], now, LIMITS) == 0  # waited long enough already


def test_one_slow_probe_is_not_a_hang():
    detector = policy.HangDetector(hang_timeout_s=10)
    detector.record(False, 0.0, "no answer within 30 s")
    assert not detector.hung(100.0)  # one failure, however old
    detector.record(True, 101.0)
    for t in (102.0, 105.0, 108.0):
        detector.record(False, t)
    assert not detector.hung(110.0)  # three failures but only 8 s
    assert detector.hung(112.0)


def test_a_scheduler_that_logs_batches_is_busy_not_hung():
    detector = policy.HangDetector(hang_timeout_s=10)
    for t in (0.0, 4.0, 8.0, 12.0):
        detector.record(False, t)
    detector.progress(5.0)
    assert detector.failing(12.0) and detector.busy(12.0) and not detector.hung(12.0)
    assert detector.hung(15.0)  # no batch for 10 s
    detector.progress(15.0)
    assert not detector.hung(15.0)


def test_batches_hold_a_hang_off_for_a_while_only():
    """Probes failing for three hang timeouts while batches go on: the answers are lost on their
    way out (a stuck detokenizer), not waiting for a long forward pass."""
    detector = policy.HangDetector(hang_timeout_s=10)
    for t in range(0, 31, 5):
        detector.record(False, float(t))
        detector.progress(float(t))
    assert not detector.hung(29.0)
    assert detector.hung(30.0)
