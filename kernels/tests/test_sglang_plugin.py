"""CPU: the SGLang plugin's dispatch logic, against the real call site in SGLang 0.5.23's
triton_backend.py (read from the released wheel, not imported: SGLang's runtime cannot be
imported without its GPU dependencies) and against a stand-in backend class."""
import ast
import contextlib
import importlib
import inspect
import os
import re
import subprocess
import sys
import tempfile
import zipfile

import pytest
import torch
from dflash_kernels import sglang_plugin as plugin

va = importlib.import_module("dflash_kernels.verify_attention")

SGLANG_VERSION = "0.5.23"
BACKEND_PATH = "sglang/srt/layers/attention/triton_backend.py"


@pytest.fixture(scope="module")
def backend_source():
    """triton_backend.py of the pinned SGLang release: from SGLANG_TRITON_BACKEND_PY if set, else
    from the wheel SGLANG_WHEEL names (scripts/test.sh sets it), else from the wheel fetched with
    pip (no dependencies); skipped when none works."""
    path = os.environ.get("SGLANG_TRITON_BACKEND_PY")
    if path:
        with open(path) as f:
            return f.read()
    wheel = os.environ.get("SGLANG_WHEEL")
    if wheel:
        assert f"sglang-{SGLANG_VERSION}-" in os.path.basename(wheel), f"SGLANG_WHEEL is not sglang {SGLANG_VERSION}"
        with zipfile.ZipFile(wheel) as z:
            return z.read(BACKEND_PATH).decode()
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", d,
                            f"sglang=={SGLANG_VERSION}"], capture_output=True, text=True)
        wheels = [f for f in os.listdir(d) if f.endswith(".whl")]
        if r.returncode != 0 or not wheels:
            pytest.skip(f"could not fetch sglang {SGLANG_VERSION}: {r.stderr[-300:]}")
        with zipfile.ZipFile(os.path.join(d, wheels[0])) as z:
            return z.read(BACKEND_PATH).decode()


def _method(tree, cls_name, fn_name):
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == fn_name:
                    return item
    raise AssertionError(f"{cls_name}.{fn_name} not found")


def test_call_site_matches_plugin_signature(backend_source):
    tree = ast.parse(backend_source)
    fwd = _method(tree, "TritonAttnBackend", "forward_extend")
    calls = [n for n in ast.walk(fwd) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "verify_fwd"]
    assert len(calls) == 1, "the target-verify fast-path call moved"
    call = calls[0]
    pos = [ast.unparse(a) for a in call.args]
    kws = [k.arg for k in call.keywords]
    # our positional parameters line up with what SGLang passes, one by one
    expected = ["q", "k", "v", "o", "get_key_buffer", "get_value_buffer", "qo_indptr", "kv_indptr",
                "kv_indices", "custom_mask", "causal", "mask_indptr", "max_extend_len", "k_descale",
                "v_descale", "scaling"]
    assert len(pos) == len(expected), pos
    for src, token in zip(pos, expected, strict=True):
        assert token in src, (src, token)
    sig = inspect.signature(plugin.MlaVerify.__call__)
    names = list(sig.parameters)[1:]
    assert names[:len(expected)] == ["q", "k", "v", "o", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr",
                                     "kv_indices", "custom_mask", "causal", "mask_indptr", "max_extend_len",
                                     "k_descale", "v_descale", "sm_scale"]
    for kw in kws:
        assert kw in sig.parameters, f"SGLang passes {kw}=, which the plugin does not name"
    sig.bind(None, *range(len(pos)), **{k: None for k in kws})
    # the result decides: `if (... and verify_fwd(...)): return o`
    parent = next(n for n in ast.walk(fwd) if isinstance(n, ast.If) and any(c is call for c in ast.walk(n.test)))
    assert ast.unparse(parent.body[0]) == "return o"


def test_every_layer_gets_the_forwards_batch_tensors_and_its_own_pool(backend_source):
    """What ForwardPass relies on, read from SGLang's call site: the batch's tensors come from the
    backend's forward metadata (set once a forward, the same objects in every layer) and the
    pool from the layer's own id."""
    fwd = _method(ast.parse(backend_source), "TritonAttnBackend", "forward_extend")
    (call,) = [n for n in ast.walk(fwd) if isinstance(n, ast.Call)
               and isinstance(n.func, ast.Name) and n.func.id == "verify_fwd"]
    pos = [ast.unparse(a) for a in call.args]
    assert pos[4] == "self.token_to_kv_pool.get_key_buffer(layer.layer_id)"
    for i, name in ((6, "qo_indptr"), (9, "custom_mask"), (11, "mask_indptr"), (12, "max_extend_len")):
        assert pos[i] == f"self.forward_metadata.{name}", pos[i]
    # kv_indptr: a local set from the metadata (the window's for sliding-window layers, which
    # the plugin declines)
    assigned = {ast.unparse(n.value) for n in ast.walk(fwd) if isinstance(n, ast.Assign)
                and any(ast.unparse(t) == pos[7] for t in n.targets)}
    assert assigned == {"self.forward_metadata.kv_indptr", "self.forward_metadata.window_kv_indptr"}, assigned


def test_fast_path_slot_is_what_the_plugin_sets(backend_source):
    tree = ast.parse(backend_source)
    init = _method(tree, "TritonAttnBackend", "__init__")
    assigned = {ast.unparse(t) for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets}
    assert {"self.use_verify_shared_kv", "self.verify_shared_kv_fwd", "self.use_mla"} <= assigned
    fwd = ast.unparse(_method(tree, "TritonAttnBackend", "forward_extend"))
    assert re.search(r"if self\.use_verify_shared_kv:\s+verify_fwd = self\.verify_shared_kv_fwd", fwd)
    assert "forward_batch.forward_mode.is_target_verify()" in fwd


@pytest.fixture(autouse=True)
def _no_card_check(request, monkeypatch):
    """The on-card self-check needs a GPU: the dispatch tests run with it switched off (its own
    tests below, and tests/test_selfcheck.py, take it on)."""
    if "card_check" not in request.node.name:
        monkeypatch.setattr(plugin, "card_verdict", lambda backend, model_runner: None)


class FakeBackend:
    """Stands in for TritonAttnBackend: the attributes the plugin reads and writes."""

    def __init__(self, model_runner=None, use_mla=True, shared=False):
        self.use_mla = use_mla
        self.device = "cpu"
        self.num_head = 8
        self.num_draft_tokens = 16
        self.use_verify_splitkv = False
        self.use_verify_shared_kv = shared
        self.verify_shared_kv_fwd = (lambda *a, **k: "sglang's own fast path") if shared else None


def _fresh_fake():
    return type("TritonAttnBackend", (FakeBackend,), {})


def test_patch_is_opt_in(monkeypatch):
    cls = _fresh_fake()
    assert plugin.patch_backend_class(cls) and not plugin.patch_backend_class(cls)  # idempotent
    monkeypatch.delenv(plugin.ENV, raising=False)
    b = cls()
    assert b.use_verify_shared_kv is False and b.verify_shared_kv_fwd is None
    monkeypatch.setenv(plugin.ENV, "1")
    b = cls()
    assert b.use_verify_shared_kv is True and isinstance(b.dflash_verify, plugin.MlaVerify)
    b = cls(use_mla=False)  # not an MLA model: untouched
    assert b.use_verify_shared_kv is False
    monkeypatch.setenv(plugin.ENV, "0")
    assert cls().use_verify_shared_kv is False


def _verdict(passed, detail=""):
    from dflash_kernels import selfcheck
    return selfcheck.SelfCheck(passed=passed, device="NVIDIA RTX PRO 6000 (sm_120)", kernel="_verify_split_kernel_teams",
                               heads=8, kv_dtype="bf16", worst_row_err=3e-3 if passed else 0.4, seconds=0.2,
                               detail=detail)


@pytest.mark.parametrize("passed", [True, False])
def test_card_check_decides_whether_the_kernel_serves(monkeypatch, caplog, passed):
    """Each server process checks the kernel on its card once (per device, heads, pool dtype and
    draft length), before it serves: a failed check leaves SGLang's own fast path in place and
    says so in the log, once, however many backends the process builds."""
    from dflash_kernels import selfcheck
    runs = []

    def fake_run(device, heads, kv_dtype, draft_len):
        runs.append((str(device), heads, kv_dtype, draft_len))
        return _verdict(passed, "" if passed else "rows differ from the float32 reference")
    monkeypatch.setattr(selfcheck, "run", fake_run)
    monkeypatch.setattr(plugin, "_CARD_VERDICTS", {})
    monkeypatch.setenv(plugin.ENV, "1")
    monkeypatch.delenv(plugin.SELFCHECK_ENV, raising=False)
    cls = _fresh_fake()
    plugin.patch_backend_class(cls)
    runner = type("ModelRunner", (), {"kv_cache_dtype": torch.float8_e4m3fn})()
    with caplog.at_level("INFO"):
        backends = [cls(runner, shared=True), cls(runner, shared=True)]
    assert runs == [("cpu", 8, torch.float8_e4m3fn, 16)]
    for b in backends:
        assert b.dflash_selfcheck.passed is passed
        if passed:
            assert isinstance(b.dflash_verify, plugin.MlaVerify) and b.use_verify_shared_kv
        else:
            assert not hasattr(b, "dflash_verify") and b.verify_shared_kv_fwd() == "sglang's own fast path"
    (record,) = [r for r in caplog.records if r.name == plugin.__name__]
    assert record.levelname == ("INFO" if passed else "ERROR")
    assert ("passed" if passed else "FAILED") in record.getMessage()
    assert passed or "SGLang's own verify path serves instead" in record.getMessage()


def test_card_check_of_a_backend_it_cannot_read_fails_once_and_an_unread_pool_is_left_to_sglang(monkeypatch, caplog):
    from dflash_kernels import selfcheck
    runs = []
    monkeypatch.setattr(selfcheck, "run", lambda *args: runs.append(args) or _verdict(True))
    monkeypatch.setattr(plugin, "_CARD_VERDICTS", {})
    monkeypatch.setenv(plugin.ENV, "1")
    class NoHeads(FakeBackend):  # a backend without the attribute 0.5.23's has
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            del self.num_head
    cls = type("TritonAttnBackend", (NoHeads,), {})
    plugin.patch_backend_class(cls)
    with caplog.at_level("INFO"):
        backends = [cls(), cls()]
    assert runs == [] and all(not hasattr(b, "dflash_verify") for b in backends)
    (record,) = [r for r in caplog.records if r.name == plugin.__name__]
    assert record.levelname == "ERROR" and "the check could not start: AttributeError" in record.getMessage()
    caplog.clear()
    monkeypatch.setattr(plugin, "_CARD_VERDICTS", {})
    cls = _fresh_fake()
    plugin.patch_backend_class(cls)
    runner = type("ModelRunner", (), {"kv_cache_dtype": torch.float16})()
    with caplog.at_level("INFO"):
        b = cls(runner)
    # not checked; installed, and every call it gets goes to SGLang (unsupported pools decline)
    assert runs == [] and b.dflash_selfcheck is None and isinstance(b.dflash_verify, plugin.MlaVerify)
    assert "is not one the verify kernel reads" in caplog.text


def test_card_check_can_be_switched_off_and_a_check_that_breaks_keeps_sglangs_path(monkeypatch, caplog):
    from dflash_kernels import selfcheck
    monkeypatch.setattr(plugin, "_CARD_VERDICTS", {})
    monkeypatch.setenv(plugin.ENV, "1")
    cls = _fresh_fake()
    plugin.patch_backend_class(cls)

    def broken(*args):
        raise RuntimeError("CUDA error: out of memory")
    monkeypatch.setattr(selfcheck, "run", broken)
    monkeypatch.setenv(plugin.SELFCHECK_ENV, "0")
    b = cls()  # switched off: not run, the kernel serves
    assert b.dflash_selfcheck is None and isinstance(b.dflash_verify, plugin.MlaVerify)
    monkeypatch.setenv(plugin.SELFCHECK_ENV, "1")
    with caplog.at_level("ERROR"):
        b = cls()
    assert not hasattr(b, "dflash_verify") and b.use_verify_shared_kv is False
    assert "could not run" in caplog.text and "out of memory" in caplog.text


def _args(**over):
    q = torch.randn(4, 8, 576).bfloat16()
    kb = torch.randn(64, 1, 576).bfloat16()
    a = dict(q=q, k=torch.randn(4, 1, 576).bfloat16(), v=torch.randn(4, 1, 512).bfloat16(),
             o=torch.empty(4, 8, 512, dtype=torch.bfloat16), k_buffer=kb, v_buffer=kb[..., :512],
             qo_indptr=torch.tensor([0, 4], dtype=torch.int32), kv_indptr=torch.tensor([0, 10], dtype=torch.int32),
             kv_indices=torch.arange(10), custom_mask=None, causal=True, mask_indptr=None, max_extend_len=4,
             k_descale=1.0, v_descale=1.0, sm_scale=0.07)
    a.update(over)
    return a


def test_unsupported_calls_fall_back(monkeypatch):
    monkeypatch.setenv(plugin.ENV, "1")
    cls = _fresh_fake()
    plugin.patch_backend_class(cls)
    for shared, expect in ((False, False), (True, "sglang's own fast path")):
        b = cls(shared=shared)
        # CPU tensors: refused before any kernel; then SGLang's own choice decides
        assert b.dflash_verify(**_args()) == expect
        assert "CUDA" in b.dflash_verify.last_reason


def _fp8_pool(a):
    pool = torch.randn(64, 1, 576).to(torch.float8_e4m3fn)
    return dict(k_buffer=pool, v_buffer=pool[..., :512])


@pytest.mark.parametrize("change, reason", [
    (dict(logit_cap=30.0), "logit cap"),
    (dict(sliding_window_size=4096), "sliding window"),
    (dict(sinks=torch.zeros(8)), "attention sinks"),
    (dict(window_kv_offsets=torch.zeros(1, dtype=torch.int32)), "window offsets"),
    (dict(xai_temperature_len=1024), "xai temperature"),
    (lambda a: dict(v_buffer=a["k_buffer"].clone()[..., :512]), "v_buffer is not a view of k_buffer"),
    (lambda a: dict(q=a["q"][..., :192].contiguous()), "not MLA 576 bf16"),
    (lambda a: dict(q=a["q"].half()), "not MLA 576 bf16"),
    (lambda a: dict(o=torch.empty(4, 8, 128, dtype=torch.bfloat16)), "not 512 bf16"),
    (lambda a: dict(k_buffer=a["k_buffer"].half(), v_buffer=a["k_buffer"].half()[..., :512]),
     "not a bf16 or fp8 latent pool"),
    (lambda a: dict(k=a["k"].half()), "not bf16 latents"),
    ("old card", "fp8 pools need compute capability 8.9 or newer"),
], ids=["logit-cap", "window", "sinks", "window-offsets", "xai", "v-copy", "q-not-576", "q-fp16", "o-not-512",
        "pool-fp16", "k-fp16", "fp8-old-card"])
def test_each_unsupported_call_goes_back_to_sglang(monkeypatch, change, reason):
    """Every reason to decline, on a call that is otherwise servable (CPU tensors taken for CUDA
    ones, so the checks past the device's run): the plugin names the reason and returns what
    SGLang's own path returns, never running the kernel."""
    monkeypatch.setenv(plugin.ENV, "1")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(va, "_device_info", lambda device: (9, 0, 132))
    runs = []
    monkeypatch.setattr(va, "verify_attention", lambda *a, **kw: runs.append(a))
    cls = _fresh_fake()
    plugin.patch_backend_class(cls)
    b = cls(shared=True)
    a = _args()
    assert b.dflash_verify(**a) is True and b.dflash_verify.last_reason is None  # servable as it is
    assert len(runs) == 1
    if change == "old card":
        monkeypatch.setattr(va, "fp8_pool_supported", lambda device: False)
        a.update(_fp8_pool(a))
    elif callable(change):
        a.update(change(a))
    else:
        a.update(change)
    assert b.dflash_verify(**a) == "sglang's own fast path"
    assert reason in b.dflash_verify.last_reason
    assert len(runs) == 1  # the declined call did not reach the kernel


@pytest.mark.parametrize("pool_dtype, descale", [
    (torch.bfloat16, (1.0, 1.0)),  # SGLang passes 1.0 when the layer has no scales
    (torch.bfloat16, (None, None)),
    (torch.float8_e4m3fn, (0.37, 1.9)),
    (torch.bfloat16, (0.5, 1.0)),
])
def test_served_calls_pass_the_pool_and_its_scales(monkeypatch, pool_dtype, descale):
    """What the plugin hands the launcher for a call it serves (here on a pretend sm_90): SGLang's
    k/v descale as the pool's scales, and the config and workspace planned for it (the shipped
    kernel reads every pool: on sm_90 its loader widens an fp8 pool's rows)."""
    calls = []
    monkeypatch.setattr(va, "verify_attention", lambda *args, **kw: calls.append((args, kw)))
    monkeypatch.setattr(va, "_device_info", lambda device: (9, 0, 132))
    monkeypatch.setattr(plugin, "_DRAFT_BLOCKS", {})  # (another test's longer draft may have grown it)
    monkeypatch.setattr(plugin.MlaVerify, "unsupported", staticmethod(lambda *a, **kw: None))
    pool = torch.randn(64, 1, 576).to(pool_dtype)
    a = _args(k_buffer=pool, v_buffer=pool[..., :512], k_descale=descale[0], v_descale=descale[1])
    assert plugin.MlaVerify()(**a) is True
    (args, kw), = calls
    assert args[2] is pool
    assert (kw["k_scale"], kw["v_scale"]) == tuple(1.0 if d is None else d for d in descale)
    expected = va.CONFIGS["sm90"] if va.gluon_available() else va.SM90_TRITON
    assert kw["config"] == expected
    assert kw["workspace"][0].shape == va.workspace_shape(1, 8, 4, kw["num_splits"])[0]
    # no custom mask (DFlash's chains): the shared draft block, read from row 0 by every request
    assert kw["block_mask"] is True and torch.equal(args[6], va.draft_block_mask(64, causal=True))


def test_a_kernel_that_fails_hands_this_call_and_the_rest_to_sglang(monkeypatch, caplog):
    """An exception of ours (a runtime Triton that compiles the Gluon kernels differently)
    raised inside SGLang's forward_extend and took the scheduler down at warm-up. Now SGLang's
    path serves that call and every later one, and the log says why, once."""
    calls = []

    def broken(*args, **kw):
        calls.append(1)
        raise RuntimeError("Gluon: no such layout")
    monkeypatch.setattr(va, "verify_attention", broken)
    monkeypatch.setattr(va, "_device_info", lambda device: (12, 0, 188))
    monkeypatch.setattr(plugin.MlaVerify, "unsupported", staticmethod(lambda *a, **kw: None))
    verify = plugin.MlaVerify(fallback=lambda *a, **kw: "sglang's own fast path")
    with caplog.at_level("ERROR"):
        assert verify(**_args()) == "sglang's own fast path"
        assert verify(**_args()) == "sglang's own fast path"
    assert calls == [1] and "Gluon: no such layout" in verify.last_reason
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert plugin.MlaVerify()(**_args()) is False  # no fast path of SGLang's: its extend_attention_fwd


def test_a_call_that_finds_no_gpu_memory_goes_to_sglang_and_the_kernel_stays_on(monkeypatch, caplog):
    """An OutOfMemoryError (a larger batch's workspace at --mem-fraction-static 0.93) switched the
    kernel off for every later call of the process; it is about that call alone, and the next
    call plans its forward afresh."""
    runs = []

    def short_of_memory_once(*args, **kw):
        runs.append(1)
        if len(runs) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
    monkeypatch.setattr(va, "verify_attention", short_of_memory_once)
    monkeypatch.setattr(va, "_device_info", lambda device: (9, 0, 132))
    monkeypatch.setattr(plugin.MlaVerify, "unsupported", staticmethod(lambda *a, **kw: None))
    verify = plugin.MlaVerify(fallback=lambda *a, **kw: "sglang's own fast path")
    forwards = []
    monkeypatch.setattr(verify, "new_forward", lambda: forwards.append(1))
    with caplog.at_level("WARNING"):
        assert verify(**_args()) == "sglang's own fast path"
        assert verify(**_args()) is True
    assert runs == [1, 1] and verify.failed is None and forwards == [1]
    assert "no GPU memory for its buffers (OutOfMemoryError" in caplog.text


def test_a_call_the_launcher_refuses_goes_to_sglang_and_the_kernel_stays_on(monkeypatch, caplog):
    """A ValueError of the launcher's checks (raised before anything is launched) is about that
    call: SGLang's path serves it, the next call is served by the kernel, and the log says so once
    however many layers meet the same reason."""
    runs = []

    def refuses_long_drafts(q, *args, max_q_len=None, **kw):
        runs.append(max_q_len)
        if max_q_len > 16:
            raise ValueError(f"max_q_len={max_q_len}: too long")
    monkeypatch.setattr(va, "verify_attention", refuses_long_drafts)
    monkeypatch.setattr(va, "_device_info", lambda device: (9, 0, 132))
    monkeypatch.setattr(plugin.MlaVerify, "unsupported", staticmethod(lambda *a, **kw: None))
    verify = plugin.MlaVerify(fallback=lambda *a, **kw: "sglang's own fast path")
    with caplog.at_level("WARNING"):
        for _ in range(3):  # three layers
            assert verify(**_args(max_extend_len=20)) == "sglang's own fast path"
        assert verify(**_args()) is True
    assert verify.failed is None and runs == [20, 20, 20, 4]
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "the launcher refused it (ValueError: max_q_len=20: too long)" in caplog.text


def test_an_empty_call_is_declined_not_raised(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    a = _args(q=torch.empty(0, 8, 576, dtype=torch.bfloat16), k=torch.empty(0, 1, 576, dtype=torch.bfloat16),
              o=torch.empty(0, 8, 512, dtype=torch.bfloat16))
    verify = plugin.MlaVerify(fallback=lambda *a, **kw: "sglang's own fast path")
    assert verify(**a) == "sglang's own fast path" and verify.last_reason == "an empty call (no draft tokens)"


@contextlib.contextmanager
def _fake_sglang_backend(tmp_path, monkeypatch):
    """A stand-in sglang package with the backend module the import hook waits for."""
    pkg = tmp_path / "sglang" / "srt" / "layers" / "attention"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "sglang", tmp_path / "sglang" / "srt", tmp_path / "sglang" / "srt" / "layers", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "triton_backend.py").write_text(
        "class TritonAttnBackend:\n"
        "    def __init__(self):\n"
        "        self.use_mla = True\n"
        "        self.use_verify_shared_kv = False\n"
        "        self.use_verify_splitkv = False\n"
        "        self.verify_shared_kv_fwd = None\n")
    saved = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    for k in saved:
        del sys.modules[k]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugin.ENV, "1")
    try:
        plugin.install()
        yield
    finally:
        plugin.uninstall_hook()
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def test_import_hook_patches_on_import(tmp_path, monkeypatch):
    with _fake_sglang_backend(tmp_path, monkeypatch):
        mod = importlib.import_module(plugin.TARGET_MODULE)
        assert mod.TritonAttnBackend._dflash_verify_patched
        assert isinstance(mod.TritonAttnBackend().dflash_verify, plugin.MlaVerify)


def test_a_plugin_that_cannot_load_leaves_sglangs_import_and_backend_alone(tmp_path, monkeypatch, caplog):
    """The patch runs inside SGLang's own import of its backend: an error there (a kernel package
    built for another Triton) stopped the server, where switched off it would have served."""
    def broken(cls):
        raise ImportError("cannot import name 'gdc_wait' from 'triton.language.extra.cuda'")
    monkeypatch.setattr(plugin, "patch_backend_class", broken)
    with _fake_sglang_backend(tmp_path, monkeypatch):
        mod = importlib.import_module(plugin.TARGET_MODULE)  # no exception
        assert not getattr(mod.TritonAttnBackend, "_dflash_verify_patched", False)
    assert "the verify kernel could not be loaded (ImportError: cannot import name 'gdc_wait'" in caplog.text
    assert "SGLang's own verify path serves" in caplog.text


@pytest.mark.parametrize("value,on", [("1", True), ("True", True), ("yes", True), ("0", False), ("", False),
                                      ("2", False), ("enable", False)])
def test_pth_line(tmp_path, value, on):
    """The start-up line and enabled() read the switch alike (a YAML true renders as "True");
    neither way does it import torch: the line runs in every Python process of the container,
    the image's health check too."""
    path = plugin.write_pth(str(tmp_path))
    code = ("import site, sys; site.addsitedir(sys.argv[1]); "
            "print(any(type(f).__name__ == '_PatchAfterImport' for f in sys.meta_path), 'torch' in sys.modules)")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env[plugin.ENV] = value
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    hooked, torch_loaded = r.stdout.split()
    assert hooked == str(on)
    assert torch_loaded == "False"
    # a value that is neither on nor off (a typo) is off, and said: before, nothing told it from a
    # deliberate off while SGLang's far slower path served every verify
    typo = value not in ("1", "True", "yes", "0", "")
    assert (f"{plugin.ENV}={value!r} is neither on" in r.stderr) is typo, r.stderr
    os.environ[plugin.ENV], before = value, os.environ.get(plugin.ENV)
    try:
        assert plugin.enabled() is on
    finally:
        os.environ.pop(plugin.ENV) if before is None else os.environ.__setitem__(plugin.ENV, before)
    assert os.path.basename(path) == plugin.PTH_NAME


def test_one_workspace_per_shape_sized_for_the_largest_batch():
    """A workspace per batch size piled up outside SGLang's memory budget (each graph batch size
    kept its own). Now one per shape serves every batch up to the largest seen (to the next power
    of two, at most max_bs) through views of its first slots; a larger batch gets a larger one,
    and the old one stays alive for the graphs that captured it. Not max_bs itself: SGLang passes
    its request pool's size, 4,096 without --max-running-requests (4 GiB at t = 64)."""
    verify = plugin.MlaVerify()
    cpu = torch.device("cpu")
    first = verify._workspace(va, cpu, batch=40, heads=8, mq=16, ns=47, max_bs=4096)  # a graph's largest
    full = verify._workspaces[(cpu, 8, 16, 47)]
    assert full[0].shape[0] == 47 + 2 * 64 and all(x.is_contiguous() for x in first)
    small = verify._workspace(va, cpu, batch=2, heads=8, mq=16, ns=47, max_bs=4096)
    assert [tuple(x.shape) for x in small] == [tuple(s) for s in va.workspace_shape(2, 8, 16, 47)]
    assert small[0].data_ptr() == first[0].data_ptr() == full[0].data_ptr() and len(verify._workspaces) == 1
    larger = verify._workspace(va, cpu, batch=100, heads=8, mq=16, ns=47, max_bs=4096)
    assert larger[0].shape[0] == 47 + 2 * 100 and verify._replaced == [full]
    assert verify._workspaces[(cpu, 8, 16, 47)][0].shape[0] == 47 + 2 * 128
    capped = plugin.MlaVerify()
    capped._workspace(va, cpu, batch=40, heads=8, mq=16, ns=47, max_bs=48)  # production: 48 requests at most
    assert capped._workspaces[(cpu, 8, 16, 47)][0].shape[0] == 47 + 2 * 48


def test_draft_block_rows():
    """Row i of the shared draft block: draft token i sees 0..i (chains) or every token."""
    assert va.draft_block_mask(3, causal=True)[:, 0].tolist() == [1, 3, 7]
    assert va.draft_block_mask(3, causal=False)[:, 0].tolist() == [7, 7, 7]
    wide = va.draft_block_mask(40, causal=True)
    assert wide.shape == (40, 2) and wide[39].tolist() == [-1, 2**8 - 1] and wide[31].tolist() == [-1, 0]


def test_calls_without_a_custom_mask_share_one_draft_block_built_once(monkeypatch):
    """DFlash's chains: every batch, layer and step reads one draft block, whatever its draft
    lengths (uniform, ragged, or a padded ragged layout like DSpark's), built once per kind; a
    longer draft builds a larger one and keeps the first alive for graphs captured with it."""
    monkeypatch.setattr(plugin, "_DRAFT_BLOCKS", {})
    kv = torch.tensor([0, 5, 9, 9], dtype=torch.int32)
    first = None
    for qo, n_tok, mq in ((torch.arange(0, 49, 16, dtype=torch.int32), 48, 16),
                          (torch.tensor([0, 16, 17, 32], dtype=torch.int32), 32, 16),
                          (torch.tensor([0, 10, 22, 30], dtype=torch.int32), 48, 16)):
        mask, block = plugin.verify_mask(None, None, qo, kv, n_tok, mq, causal=True)
        assert block is True and torch.equal(mask, va.draft_block_mask(64, causal=True))
        first = first if first is not None else mask
        assert mask.data_ptr() == first.data_ptr()
    longer, _ = plugin.verify_mask(None, None, torch.tensor([0, 100], dtype=torch.int32), kv[:2], 100, 100, True)
    assert longer.shape[0] == 128 and torch.equal(longer, va.draft_block_mask(128, causal=True))
    assert plugin._DRAFT_BLOCKS[(torch.device("cpu"), True)] == [first, longer]
    full, block = plugin.verify_mask(None, None, kv, kv, 9, 5, causal=False)
    assert block and torch.equal(full, va.draft_block_mask(64, causal=False))


def test_a_custom_mask_is_packed_a_row_per_token():
    """DDTree's trees come as SGLang's custom mask: packed with a row per token, not shared."""
    from cases import random_custom_mask
    qo = torch.tensor([0, 3, 7], dtype=torch.int32)
    kv = torch.tensor([0, 20, 21], dtype=torch.int32)
    custom, mask_indptr = random_custom_mask(qo, kv)
    mask, block = plugin.verify_mask(custom, mask_indptr, qo, kv, 7, 4, causal=True)
    assert block is False and torch.equal(mask, va.pack_custom_mask(custom, mask_indptr, qo, kv, 4, num_tokens=7))


def test_a_draft_block_is_not_kept_from_a_graph_capture(monkeypatch):
    """A tensor filled during a capture holds nothing until the graph runs: a capture that has to
    build the block gets its own, by its captured ops, and nothing is kept for later calls."""
    monkeypatch.setattr(plugin, "_DRAFT_BLOCKS", {})
    monkeypatch.setattr(plugin, "_capturing", lambda device: True)
    got = plugin.shared_draft_block(16, True, torch.device("cpu"))
    assert torch.equal(got, va.draft_block_mask(16, causal=True))
    assert plugin._DRAFT_BLOCKS == {(torch.device("cpu"), True): []}


class _Forwards:
    """SGLang's verify forwards on a pretend sm_90, seen from the plugin: one backend's MlaVerify
    called once a layer, each layer with its own pool, every layer with the forward's batch
    tensors. Records what each call hands the launcher and how often the mask is packed."""

    def __init__(self, monkeypatch, layers=4):
        self.calls, self.packs = [], []
        monkeypatch.setattr(va, "verify_attention", lambda *args, **kw: self.calls.append((args, kw)))
        monkeypatch.setattr(va, "_device_info", lambda device: (9, 0, 132))
        monkeypatch.setattr(plugin.MlaVerify, "unsupported", staticmethod(lambda *a, **kw: None))
        pack = plugin.verify_mask

        def counting_pack(*args):
            self.packs.append(args)
            return pack(*args)
        monkeypatch.setattr(plugin, "verify_mask", counting_pack)
        self.pools = [torch.randn(64, 1, 576).bfloat16() for _ in range(layers)]
        self.verify = plugin.MlaVerify()

    @staticmethod
    def batch(lengths=(20, 5, 9), t=4):
        from cases import random_custom_mask
        qo = torch.arange(0, t * len(lengths) + 1, t, dtype=torch.int32)
        kv = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        custom, mask_indptr = random_custom_mask(qo, kv)
        return dict(qo_indptr=qo, kv_indptr=kv, kv_indices=torch.arange(int(kv[-1])), custom_mask=custom,
                    mask_indptr=mask_indptr, causal=False, max_extend_len=t,
                    q=torch.randn(int(qo[-1]), 8, 576).bfloat16(), k=torch.randn(int(qo[-1]), 1, 576).bfloat16(),
                    o=torch.empty(int(qo[-1]), 8, 512, dtype=torch.bfloat16))

    def forward(self, batch, layers=None):
        """One forward over the given layers; returns (plan_ready, mask) of each call."""
        first = len(self.calls)
        for i in range(len(self.pools)) if layers is None else layers:
            pool = self.pools[i]
            assert self.verify(**_args(k_buffer=pool, v_buffer=pool[..., :512], **batch)) is True
        return [(kw["plan_ready"], args[6]) for args, kw in self.calls[first:]]


def test_the_layers_of_a_forward_pack_the_mask_and_plan_once(monkeypatch):
    """SGLang calls the backend once a layer with the same batch: the first layer packs the mask
    and plans, the others reuse both (the plan kernel skipped); the next forward, on the same
    tensors (a graph's static buffers) or on new ones, packs and plans again at its first layer."""
    f = _Forwards(monkeypatch)
    batch = f.batch()
    first = f.forward(batch)
    assert [ready for ready, _ in first] == [False, True, True, True] and len(f.packs) == 1
    assert all(mask is first[0][1] for _, mask in first)
    assert torch.equal(first[0][1], va.pack_custom_mask(batch["custom_mask"], batch["mask_indptr"], batch["qo_indptr"],
                                                        batch["kv_indptr"], 4, num_tokens=12))
    again = f.forward(batch)  # the same tensors: a CUDA graph runner's buffers, new values in them
    assert [ready for ready, _ in again] == [False, True, True, True] and len(f.packs) == 2
    assert again[0][1] is not first[0][1]
    f.forward(f.batch(lengths=(3, 40, 7)))
    assert len(f.packs) == 3


def test_the_layers_of_a_forward_share_one_int32_copy_of_sglangs_int64_pointers(monkeypatch):
    """SGLang's qo_indptr is int64 (its Triton backend's buffer): the kernels take int32, copied
    by the forward's first layer and read by every layer, not copied again in each (a captured
    copy kernel per layer under CUDA graphs); the next forward copies again, as its values may
    be new in the same buffer."""
    f = _Forwards(monkeypatch)
    batch = f.batch()
    batch["qo_indptr"] = batch["qo_indptr"].to(torch.int64)
    for _ in range(2):
        first = len(f.calls)
        f.forward(batch)
        pointers = [(args[5], args[4]) for args, _ in f.calls[first:]]
        qo, kv = pointers[0]
        assert qo.dtype == torch.int32 and torch.equal(qo, batch["qo_indptr"].to(torch.int32))
        assert kv is batch["kv_indptr"]  # int32 already: no copy
        assert all(p[0] is qo and p[1] is kv for p in pointers)
    assert f.calls[0][0][5] is not f.calls[-1][0][5]


def test_a_graph_runners_warm_ups_and_capture_each_pack_and_plan(monkeypatch):
    """SGLang's CudaGraphRunner sets a batch size's metadata once and runs the forward three
    times (two warm-ups, then the capture) on the same tensors: each run packs and plans at its
    first layer, so the capture records both kernels instead of reading a warm-up's results.
    (Here the calls only; the GPU test captures and replays a real graph.)"""
    f = _Forwards(monkeypatch)
    batch = f.batch()
    runs = [f.forward(batch) for _ in range(3)]
    assert [[ready for ready, _ in run] for run in runs] == [[False, True, True, True]] * 3
    assert len(f.packs) == 3 and len({id(run[0][1]) for run in runs}) == 3


def _changed(batch, part):
    """The batch with one part of ForwardPass's key changed: same values in other tensors, or
    other lengths, flags, workspace or config."""
    if part in ("qo_indptr", "kv_indptr", "custom_mask", "mask_indptr"):
        return dict(batch, **{part: batch[part].clone()})
    if part == "num_tokens":  # (a padded layout: more token rows than qo_indptr's last entry)
        n = batch["q"].shape[0] + 4
        return dict(batch, q=torch.randn(n, 8, 576).bfloat16(), k=torch.randn(n, 1, 576).bfloat16(),
                    o=torch.empty(n, 8, 512, dtype=torch.bfloat16))
    return dict(batch, **{"max_extend_len": dict(max_extend_len=5), "causal": dict(causal=True)}[part])


@pytest.mark.parametrize("part", ["qo_indptr", "kv_indptr", "custom_mask", "mask_indptr", "num_tokens",
                                  "max_extend_len", "causal", "workspace"])
def test_a_forward_whose_batch_changes_midway_packs_and_plans_again(monkeypatch, part):
    """Never a reuse across batches: a call whose batch tensors (another tensor with the same
    values counts as another batch), token count, draft length, causal flag or workspace differ
    from its forward's packs and plans anew, and the layers after it reuse that."""
    f = _Forwards(monkeypatch)
    batch = f.batch()
    assert [r for r, _ in f.forward(batch, layers=[0, 1])] == [False, True]
    if part == "workspace":  # (another workspace: the next call allocates a new one)
        f.verify._workspaces.clear()
    else:
        batch = _changed(batch, part)
    assert [r for r, _ in f.forward(batch, layers=[2, 3])] == [False, True]
    assert len(f.packs) == 2


def test_a_pool_of_another_config_plans_again(monkeypatch):
    """The plan's tile sizes come from the config, which may follow the pool's dtype (sm_120
    without Gluon: one Triton config for bf16 pools, another for fp8 ones)."""
    f = _Forwards(monkeypatch)
    monkeypatch.setattr(va, "_device_info", lambda device: (12, 0, 188))
    monkeypatch.setattr(va, "gluon_available", lambda: False)
    f.pools[2] = f.pools[2].to(torch.float8_e4m3fn)
    assert [r for r, _ in f.forward(f.batch())] == [False, True, False, False]
    assert [kw["config"] for _, kw in f.calls] == [va.SM120_TRITON] * 2 + [va.SM120_TRITON_FP8, va.SM120_TRITON]


def test_a_forward_after_one_whose_last_pass_began_midway_starts_afresh(monkeypatch):
    """A layer in the middle of a forward with another key (another config for its fp8 pool)
    made the forward's last pass begin after it; the next forward's first layer, not in that
    pass's layers, "continued" it and took the previous forward's plan, int32 pointers and mask
    (under a CUDA graph, baked into the capture). A layer seen anywhere in the forward now
    starts the next."""
    f = _Forwards(monkeypatch)
    monkeypatch.setattr(va, "_device_info", lambda device: (12, 0, 188))
    monkeypatch.setattr(va, "gluon_available", lambda: False)
    f.pools[1] = f.pools[1].to(torch.float8_e4m3fn)
    batch = f.batch()
    batch["qo_indptr"] = batch["qo_indptr"].to(torch.int64)
    assert [r for r, _ in f.forward(batch)] == [False, False, False, True]
    first = len(f.calls)
    assert [r for r, _ in f.forward(batch)] == [False, False, False, True]
    assert f.calls[first][0][5] is not f.calls[first - 1][0][5]  # its own int32 copy
    assert len(f.packs) == 6


def test_a_forward_cut_short_or_of_chains_shares_the_same_way(monkeypatch):
    """A forward cut short and restarted packs again at its first layer; DFlash's chains have
    nothing to pack (the shared draft block) but share the plan the same way; new_forward()
    forgets the forward (a caller with new pools)."""
    f = _Forwards(monkeypatch)
    batch = f.batch()
    assert [r for r, _ in f.forward(batch, layers=[0, 1])] == [False, True]
    assert [r for r, _ in f.forward(batch, layers=[0, 1, 2, 3])] == [False, True, True, True]
    chains = dict(batch, custom_mask=None, mask_indptr=None, causal=True)
    assert [r for r, _ in f.forward(chains)] == [False, True, True, True]
    assert len(f.packs) == 3
    f.forward(chains, layers=[0])
    f.verify.new_forward()
    assert [r for r, _ in f.forward(chains, layers=[1, 2])] == [False, True]


def test_the_benchmark_takes_an_installed_sglangs_kernel_without_the_peer_folder(tmp_path, monkeypatch):
    """In the engine image there is no peer folder, but SGLang itself: bench_verify.py then times
    the image's own extend_attention_fwd beside ours."""
    import types

    import cases
    monkeypatch.setenv("PEER_DIR", str(tmp_path / "none"))
    # no SGLang anywhere: none imported, none on the path (a GPU test may have loaded the peer's)
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "sglang"))])
    assert cases.load_peer() is None
    fake = types.ModuleType("sglang.kernels.ops.attention.extend_attention")
    fake.extend_attention_fwd = lambda *args, **kw: None
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    assert cases.load_peer() is fake.extend_attention_fwd
