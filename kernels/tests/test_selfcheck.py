"""The on-card self-check (dflash_kernels.selfcheck): that it passes a correct kernel and fails
the wrong ones it exists to catch. On the CPU through the plugin's real launch path with a torch
stand-in for the kernel (fast), and with the real kernels through Triton's interpreter; on a
GPU with every shipped config."""
import importlib
import os
import subprocess
import sys

import pytest
import torch
from dflash_kernels import selfcheck

va = importlib.import_module("dflash_kernels.verify_attention")
HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = (0, 37, 300)  # prefixes small enough for the CPU


def _unpack_blocks(tree_mask, qo_indptr, block_mask=False):
    """Per-request bool blocks from the packed mask the launcher receives (a row per token, or
    with block_mask one draft block's rows that every request reads from row 0)."""
    qo = qo_indptr.tolist()
    blocks = []
    for b in range(len(qo) - 1):
        t = qo[b + 1] - qo[b]
        j = torch.arange(t)
        words = (tree_mask[:t] if block_mask else tree_mask[qo[b]:qo[b + 1]]).to(torch.int64)
        blocks.append(((words[:, j // 32] >> (j % 32)) & 1).bool())
    return blocks


def _torch_kernel(mutate=None, use_mask=True, use_k_scale=True):
    """verify_attention's signature, computed by the float32 reference (so the check must pass it),
    then changed the way a kernel bug would change it."""
    def kernel(q, k_ext, kv, kv_indices, kv_indptr, qo_indptr, tree_mask, sm_scale, out=None, k_scale=1.0,
               v_scale=1.0, block_mask=False, **_):
        blocks = _unpack_blocks(tree_mask, qo_indptr, block_mask)
        if not use_mask:
            blocks = [torch.ones_like(b) for b in blocks]
        ref, _ = va.reference_verify_attention(q, k_ext, kv, kv_indices, kv_indptr, qo_indptr, blocks, sm_scale,
                                               k_scale if use_k_scale else 1.0, v_scale)
        out.copy_(ref.view_as(out))
        if mutate:
            mutate(out)
    return kernel


def _row_off_by_5_percent(out):
    if out.shape[0] > 20:  # (in the whole batch's call; the smaller batches checked after it have fewer rows)
        out[20, 3] *= 1.05


def _row_unwritten(out):
    if out.shape[0] > 33:
        out[33, 0] = float("nan")


def test_a_kernel_wrong_only_for_a_lone_request_fails(monkeypatch):
    """A lone request runs its own path (no plan kernel, the merge counting its own slices): the
    check runs one too, not only a batch."""
    right = _torch_kernel()

    def wrong_alone(q, k_ext, kv, kv_indices, kv_indptr, qo_indptr, tree_mask, sm_scale, out=None, **kw):
        right(q, k_ext, kv, kv_indices, kv_indptr, qo_indptr, tree_mask, sm_scale, out=out, **kw)
        if qo_indptr.shape[0] == 2:
            out[-1, 0] *= 1.05
    monkeypatch.setattr(va, "verify_attention", wrong_alone)
    r = selfcheck.run("cpu", 8, torch.bfloat16, draft_len=16, prefixes=SMALL)
    assert not r.passed and "rows differ" in r.detail, r.line()


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_a_correct_kernel_passes(monkeypatch, kv_dtype):
    monkeypatch.setattr(va, "verify_attention", _torch_kernel())
    r = selfcheck.run("cpu", 8, kv_dtype, draft_len=16, prefixes=SMALL)
    assert r.passed, r.line()
    assert r.worst_row_err < 5e-3  # bf16 rounding of the output only
    assert "passed" in r.line() and r.kernel == "_verify_split_kernel"


def test_kernels_compiled_for_the_check_are_said_in_its_line(monkeypatch):
    """The image's prebuilt binaries serve only their card and Triton: on another (an sm_121
    card, a Triton upgraded in the image) Triton compiles at first use, safely but slowly, and
    the journal said nothing of it. A listener already in place still hears every compile."""
    from types import SimpleNamespace

    from triton import knobs
    heard = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: heard.append(kw["src"].name))
    kernel = _torch_kernel()

    def compiling_kernel(*args, **kw):
        for name, hit in (("_verify_split_kernel", False), ("_verify_merge_kernel", False), ("_plan", True)):
            knobs.compilation.listener(src=SimpleNamespace(name=name), cache_hit=hit)
        return kernel(*args, **kw)
    monkeypatch.setattr(va, "verify_attention", compiling_kernel)
    r = selfcheck.run("cpu", 8, draft_len=16, prefixes=SMALL)
    assert r.passed and r.compiled > 0 and r.compiled % 2 == 0, r.line()
    assert r.line().endswith(f"; {r.compiled} kernel(s) compiled at first use, not prebuilt for this card and Triton")
    assert heard.count("_plan") == r.compiled // 2  # (one hit per call, each call compiled two)
    monkeypatch.setattr(va, "verify_attention", kernel)
    assert "compiled" not in selfcheck.run("cpu", 8, draft_len=16, prefixes=SMALL).line()


@pytest.mark.parametrize("kernel, kv_dtype, detail", [
    (_torch_kernel(_row_off_by_5_percent), torch.bfloat16, "rows differ"),
    (_torch_kernel(_row_unwritten), torch.bfloat16, "unwritten"),
    (_torch_kernel(use_mask=False), torch.bfloat16, "rows differ"),  # the tree mask ignored
    (_torch_kernel(use_k_scale=False), torch.float8_e4m3fn, "rows differ"),  # the pool's key scale ignored
], ids=["one-row-5-percent-off", "one-row-unwritten", "mask-ignored", "k-scale-ignored"])
def test_a_wrong_kernel_fails(monkeypatch, kernel, kv_dtype, detail):
    monkeypatch.setattr(va, "verify_attention", kernel)
    r = selfcheck.run("cpu", 8, kv_dtype, draft_len=16, prefixes=SMALL)
    assert not r.passed and detail in r.detail, r.line()
    assert "FAILED" in r.line()


def test_nan_in_one_of_the_two_calls_fails(monkeypatch):
    """The chains' call on the whole batch (the second of eight: the tree's, then the chains', for
    the batch, its last two requests, its last one, and the wide batch of 12) leaves a row
    unwritten, the others do not: max() over the calls' errors would have dropped the NaN."""
    correct, calls = _torch_kernel(), []

    def kernel(*args, **kw):
        calls.append(1)
        correct(*args, **kw)
        if len(calls) == 2:
            _row_unwritten(kw["out"])
    monkeypatch.setattr(va, "verify_attention", kernel)
    r = selfcheck.run("cpu", 8, draft_len=16, prefixes=SMALL)
    assert len(calls) == 8 and not r.passed and "unwritten" in r.detail, r.line()


def test_the_check_runs_a_wide_batch_with_sglangs_graph_dtypes(monkeypatch):
    """Batches of 9 and more run other plan and tree-mask binaries (padded for 16), and SGLang's
    graph runner passes qo_indptr as int64 and the mask as uint8: the check covers both, and a
    kernel wrong only there fails it."""
    from dflash_kernels import sglang_plugin

    correct, batches, dtypes = _torch_kernel(), [], []

    def kernel(*args, **kw):
        correct(*args, **kw)
        batches.append(args[5].numel() - 1)
        if batches[-1] == len(selfcheck.WIDE_PREFIXES):
            _row_unwritten(kw["out"])
    run = sglang_plugin.MlaVerify._run

    def spy(self, q, k, o, k_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, *rest, **kw):
        dtypes.append((qo_indptr.dtype, None if custom_mask is None else custom_mask.dtype))
        return run(self, q, k, o, k_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, *rest, **kw)
    monkeypatch.setattr(va, "verify_attention", kernel)
    monkeypatch.setattr(sglang_plugin.MlaVerify, "_run", spy)
    r = selfcheck.run("cpu", 8, draft_len=16, prefixes=SMALL)
    assert batches.count(12) == 2 and not r.passed and "unwritten" in r.detail, r.line()
    assert dtypes[-2:] == [(torch.int64, torch.uint8), (torch.int64, None)]


def test_a_launch_that_blocks_is_reported_within_the_checks_time_limit():
    """A hung kernel can also block a launch (loading the next kernel's module may wait for the
    device), where the GPU deadline never runs: the check runs in a thread and gives up on it."""
    import threading
    import time
    release = threading.Event()
    start = time.monotonic()
    try:
        r = selfcheck.run("cpu", 8, draft_len=16, prefixes=SMALL, serve=lambda *args: release.wait(60),
                          check_timeout_s=0.5)
    finally:
        release.set()
    assert time.monotonic() - start < 10
    assert not r.passed and r.detail.startswith("TimeoutError: the check did not finish within 0.5 s"), r.line()


def test_a_check_given_up_on_launches_nothing_more():
    """Slow compiles, not a hung kernel: the check's thread, given up on at its time limit, went on
    allocating and launching beside the server's start (CUDA graph capture among it)."""
    import threading
    import time
    release, calls = threading.Event(), []

    def slow(*args):
        calls.append(1)
        release.wait(60)
    r = selfcheck.run("cpu", 8, draft_len=16, prefixes=SMALL, serve=slow, check_timeout_s=0.3)
    assert not r.passed and calls == [1]
    release.set()
    time.sleep(0.5)  # the thread wakes up and would make its next call now
    assert calls == [1]


def test_a_kernel_that_raises_fails_with_its_error(monkeypatch):
    def broken(*args, **kw):
        raise RuntimeError("PTX .version 9.0 does not support .target sm_120a")
    monkeypatch.setattr(va, "verify_attention", broken)
    r = selfcheck.run("cpu", 8, draft_len=16, prefixes=SMALL)
    assert not r.passed and r.detail == "RuntimeError: PTX .version 9.0 does not support .target sm_120a"


def test_the_real_kernels_pass_in_the_interpreter():
    """The check around the real kernels (Triton's interpreter, so a fresh process), bf16 and a
    scaled fp8 pool."""
    code = ("import sys; sys.path[:0] = sys.argv[1:3]\n"
            "import interpreter_shim; interpreter_shim.install()\n"
            "import torch\n"
            "from dflash_kernels import selfcheck\n"
            "for dt in (torch.bfloat16, torch.float8_e4m3fn):\n"
            "    r = selfcheck.run('cpu', 4, dt, draft_len=5, prefixes=(0, 37, 300))\n"
            "    print(r.passed, r.line())\n")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code, HERE, os.path.dirname(HERE)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("True ") for line in lines), r.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["device", "sm120", "sm120-188"])
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("heads", [8, 16])
def test_every_shipped_kernel_passes_on_the_gpu(monkeypatch, arch, kv_dtype, heads):
    """On this GPU with its own config, and with sm_120's (its mma.sync code runs on an H200),
    planned for this GPU's SM count and for the RTX PRO 6000's 188 (more slices, other merge
    tiles)."""
    if arch.startswith("sm120"):
        sms = 188 if arch == "sm120-188" else torch.cuda.get_device_properties(0).multi_processor_count
        monkeypatch.setattr(va, "_device_info", lambda device: (12, 0, sms))
    r = selfcheck.run("cuda", heads, kv_dtype)
    print(r.line())
    assert r.passed, r.line()


@pytest.mark.gpu
def test_the_command_checks_every_gpu(capsys):
    assert selfcheck.main(["--all-devices"]) == 0
    out = capsys.readouterr().out
    assert out.count("self-check passed") == torch.cuda.device_count()


@pytest.mark.gpu
def test_a_kernel_that_hangs_is_reported_before_the_start_hangs_behind_it():
    """A kernel that never finishes (a barrier protocol an untried card runs differently) cannot
    be stopped; the check says so after its time limit instead of waiting with the server's
    start. Here a kernel that spins for several seconds stands in for it."""
    import time

    import triton
    import triton.language as tl

    @triton.jit
    def spin(x_ptr, n):
        x = tl.load(x_ptr)
        for _ in range(n):  # n is a run-time value: the loop is not folded away
            x = x * 1.0000001 + 1e-7
        tl.store(x_ptr, x)

    x = torch.ones(1, device="cuda")

    def hanging_kernel(*args):
        spin[(1,)](x, 2_000_000_000)

    spin[(1,)](x, 1)  # compiled before the clock starts
    torch.cuda.synchronize()
    start = time.monotonic()
    r = selfcheck.run("cuda", 8, serve=hanging_kernel, timeout_s=1.0)
    waited = time.monotonic() - start
    torch.cuda.synchronize()  # (the spin ends on its own)
    assert not r.passed and r.detail.startswith("TimeoutError: the kernel did not finish within 1 s"), r.line()
    assert "DFLASH_VERIFY_KERNEL=0" in r.detail and waited < 5, waited
