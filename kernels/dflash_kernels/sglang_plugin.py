"""Make SGLang's Triton attention backend use ``verify_attention`` for target-verify on MLA models.

Opt-in: nothing changes unless the environment variable DFLASH_VERIFY_KERNEL=1 (or true, yes,
on) is set in the server's processes; unset it (or set 0) to go back to SGLang's own kernels.

How it hooks in (SGLang 0.5.23, ``sglang/srt/layers/attention/triton_backend.py``):
``TritonAttnBackend.forward_extend`` already has a fast-path slot for target-verify. When
``self.use_verify_shared_kv`` is true it calls ``self.verify_shared_kv_fwd(q, k, v, o, k_buffer,
v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, causal, mask_indptr, max_extend_len,
k_descale, v_descale, sm_scale, logit_cap=, sliding_window_size=, sinks=, window_kv_offsets=,
xai_temperature_len=, max_bs=)`` and, if that returns True, uses ``o``; if it returns False it
falls through to ``extend_attention_fwd``. This module wraps ``TritonAttnBackend.__init__`` so
that, on MLA models, that slot holds ``MlaVerify``: it serves the cases it computes exactly and
returns False (or defers to the fast path SGLang had chosen, if any) for everything else.

Loading it in every server process (SGLang spawns its scheduler/TP workers, so a patch made in
the launching process alone would be lost): write a one-line ``.pth`` file into site-packages,

    python -m dflash_kernels.sglang_plugin --write-pth

which imports ``dflash_kernels_startup`` (standard library only) at interpreter start-up; with the
variable set, that installs an import hook that imports this module and patches the backend
class right after SGLang imports it. Without the variable, the hook is not installed and nothing
of this module runs.

Before it takes over, each server process checks the kernel on its own card (``selfcheck``: the
same entry, SGLang's calling convention, every output row against the float32 reference); on a
failure SGLang's own verify path stays and the log says why. DFLASH_VERIFY_SELFCHECK=0 skips
the check (not advised on a card the kernel has not run on before).
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import sysconfig

# the switch and the import hook live in a standard-library module outside this package (see
# there); this module is their public face
from dflash_kernels_startup import ENV, TARGET_MODULE, enabled, install, uninstall_hook

__all__ = ["ENV", "SELFCHECK_ENV", "TARGET_MODULE", "ForwardPass", "MlaVerify", "card_verdict", "enabled",
           "install", "packed_custom_mask", "patch_backend_class", "shared_draft_block", "uninstall_hook", "verify_mask",
           "write_pth"]

PTH_NAME = "dflash_kernels_sglang.pth"
SELFCHECK_ENV = "DFLASH_VERIFY_SELFCHECK"
OFF_VALUES = ("0", "false", "no", "off")
# One self-check per process and (device, heads, pool dtype, draft length): SGLang builds several
# backends in one process (target and draft models, graph runners).
_CARD_VERDICTS: dict = {}


def _out_of_memory(error: BaseException) -> bool:
    import torch
    return isinstance(error, torch.OutOfMemoryError)


class MlaVerify:
    """Callable with the signature of SGLang's verify fast paths. Returns True when it wrote ``o``,
    else whatever ``fallback`` returns (False when there is none: SGLang then runs
    ``extend_attention_fwd``)."""

    def __init__(self, fallback=None):
        self.fallback = fallback
        # one workspace per (device, heads, draft length, splits), sized for the largest batch
        # seen (to the next power of two, at most max_bs); a smaller batch uses its first slots.
        # Not for max_bs itself: SGLang passes its request pool's size (2,048-4,096 without
        # --max-running-requests), gigabytes at t = 64 taken from the activations' headroom.
        # SGLang's graph runner captures its largest batch first, after warm-ups that allocate.
        # A workspace that a larger batch replaces stays alive: a CUDA graph captured with it
        # still writes there.
        self._workspaces: dict = {}
        self._replaced: list = []
        self._pass = ForwardPass()  # what this forward's layers share (the mask, the plan)
        self.last_reason = None  # why the last call was not served (for logs and tests)
        self.failed: str | None = None  # the kernel's first failure: SGLang's path serves after it
        self._declined_kinds: set[str] = set()  # the reasons to decline already logged

    # -- which calls this kernel serves --
    @staticmethod
    def unsupported(q, k, v, o, k_buffer, v_buffer, custom_mask, logit_cap, sliding_window_size, sinks,
                    window_kv_offsets, xai_temperature_len):
        import importlib

        import torch
        va = importlib.import_module(".verify_attention", __package__)
        if not q.is_cuda:
            return "not on a CUDA device"
        if q.shape[0] == 0:
            return "an empty call (no draft tokens)"
        if q.dim() != 3 or q.shape[-1] != 576 or q.dtype != torch.bfloat16:
            return f"q {tuple(q.shape)} {q.dtype}: not MLA 576 bf16"
        if o.shape[-1] != 512 or o.dtype != torch.bfloat16:
            return f"o {tuple(o.shape)} {o.dtype}: not 512 bf16"
        kb = k_buffer
        if kb.dim() == 3 and kb.shape[1] == 1:
            kb = kb[:, 0]
        if kb.dim() != 2 or kb.shape[-1] != 576 or kb.dtype not in va.KV_DTYPES:
            return f"k_buffer {tuple(k_buffer.shape)} {k_buffer.dtype}: not a bf16 or fp8 latent pool"
        if kb.dtype != torch.bfloat16 and not va.fp8_pool_supported(q.device):
            return f"k_buffer {kb.dtype}: fp8 pools need compute capability 8.9 or newer"
        # V must be the first 512 latent values: MLA's pool hands out a view of the same rows
        if v_buffer.data_ptr() != k_buffer.data_ptr() or v_buffer.stride(0) != k_buffer.stride(0):
            return "v_buffer is not a view of k_buffer"
        if k.reshape(k.shape[0], -1).shape[-1] != 576 or k.dtype != torch.bfloat16:
            return f"k {tuple(k.shape)} {k.dtype}: not bf16 latents"
        if logit_cap not in (None, 0, 0.0):
            return "logit cap"
        if sliding_window_size is not None and sliding_window_size > 0:
            return "sliding window"
        if sinks is not None:
            return "attention sinks"
        if window_kv_offsets is not None:
            return "window offsets"
        if xai_temperature_len is not None and xai_temperature_len > 0:
            return "xai temperature"
        return None

    def __call__(self, q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
                 custom_mask, causal, mask_indptr, max_extend_len, k_descale=1.0, v_descale=1.0,
                 sm_scale=None, logit_cap=0.0, sliding_window_size=-1, sinks=None,
                 window_kv_offsets=None, xai_temperature_len=-1, max_bs=None, **unknown):
        def decline():
            if self.fallback is None:
                return False
            return self.fallback(q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices,
                                 custom_mask, causal, mask_indptr, max_extend_len, k_descale, v_descale,
                                 sm_scale, logit_cap=logit_cap, sliding_window_size=sliding_window_size,
                                 sinks=sinks, window_kv_offsets=window_kv_offsets,
                                 xai_temperature_len=xai_temperature_len, max_bs=max_bs, **unknown)

        if self.failed is not None:
            reason = f"it failed before: {self.failed}"
        elif unknown:
            reason = "unknown keyword arguments " + ", ".join(sorted(unknown))
        else:
            try:
                reason = self.unsupported(q, k, v, o, k_buffer, v_buffer, custom_mask, logit_cap,
                                          sliding_window_size, sinks, window_kv_offsets, xai_temperature_len)
            except Exception as error:  # noqa: BLE001 - an argument our checks did not foresee
                reason = f"its checks could not read the call ({type(error).__name__}: {error})"
        self.last_reason = reason
        if reason is not None:
            self._say_declined(reason)
            return decline()
        try:
            # (SGLang passes the layer's k/v scales, or 1.0 when the pool is not scaled)
            self._run(q, k, o, k_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, causal,
                      mask_indptr, int(max_extend_len), sm_scale, float(k_descale or 1.0), float(v_descale or 1.0),
                      int(max_bs or 0))
        except (ValueError, TypeError) as error:
            # the launcher refused this call's arguments before launching anything: SGLang's path
            # serves this call; the kernel stays on for the others
            self.last_reason = f"the launcher refused it ({type(error).__name__}: {error})"
            self._say_declined(self.last_reason)
            return decline()
        except Exception as error:  # noqa: BLE001 - a failure of ours must not take the scheduler down
            if _out_of_memory(error):
                # a larger workspace, mask or pointer copy found no memory this time: SGLang's path
                # serves this call (its own buffers are allocated already); the kernel stays on, and
                # the forward's plan is made again, as a layer may have stopped halfway through it
                self.new_forward()
                self.last_reason = f"no GPU memory for its buffers ({type(error).__name__}: {error})"
                self._say_declined(self.last_reason)
                return decline()
            # (e.g. a runtime Triton whose Gluon compiles these kernels differently): SGLang's own
            # path serves this call and every later one, and the log says why, once
            self.failed = f"{type(error).__name__}: {error}"
            self.last_reason = f"it failed: {self.failed}"
            logging.getLogger(__name__).exception("%s: the verify kernel failed; SGLang's own verify path "
                                                  "serves from now on (unset %s to silence this)", __name__, ENV)
            return decline()
        return True

    def _say_declined(self, reason: str) -> None:
        """Log a reason to leave a call to SGLang once per backend (the same reason with other
        shapes counts as the same): an operator who reads "self-check passed" must also learn
        when the kernel serves nothing, without a line per layer."""
        if reason.startswith("it failed"):  # (logged with its traceback when it happened)
            return
        kind = re.sub(r"\([^)]*\)|\d+", "", reason)
        if kind in self._declined_kinds:
            return
        self._declined_kinds.add(kind)
        logging.getLogger(__name__).warning("%s: SGLang's own verify path serves a call the verify kernel does not: %s "
                                            "(logged once for this reason)", __name__, reason)

    def new_forward(self):
        """Forget the current forward: the next call packs the mask and plans (see ForwardPass)."""
        self._pass = ForwardPass()

    def _workspace(self, va, device, batch: int, heads: int, mq: int, ns: int, max_bs: int):
        """Views of the first slots of the shape's workspace, as verify_attention expects them."""
        shapes = va.workspace_shape(batch, heads, mq, ns)
        key = (device, heads, mq, ns)
        ws = self._workspaces.get(key)
        if ws is None or ws[0].shape[0] < shapes[0][0]:
            if ws is not None:
                self._replaced.append(ws)
            slots = max(batch, min(1 << max(0, batch - 1).bit_length(), max_bs or 1 << 30))
            ws = self._workspaces[key] = va.alloc_workspace(slots, heads, mq, ns, device)
        return tuple(buffer[:shape[0]] for buffer, shape in zip(ws, shapes, strict=True))

    def _run(self, q, k, o, k_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, causal,
             mask_indptr, max_q_len, sm_scale, k_scale, v_scale, max_bs=0):
        import importlib

        import torch
        # (the package re-exports the function verify_attention, which hides the module's name)
        va = importlib.import_module(".verify_attention", __package__)
        n_tok, h = q.shape[0], q.shape[1]
        batch = qo_indptr.shape[0] - 1
        cfg, ns, mq = va.plan(q, batch, max_q_len, kv_dtype=k_buffer.dtype)
        ws = self._workspace(va, q.device, batch, h, mq, ns, max_bs)
        batch_key = (ForwardPass.tensors_key(qo_indptr, kv_indptr, custom_mask, mask_indptr),
                     n_tok, max_q_len, bool(causal), cfg, ns, ws[2].data_ptr())
        layer = k_buffer.data_ptr()
        reuse = self._pass.continues(layer, batch_key)
        if not reuse:
            # SGLang's qo_indptr is int64: the kernels take int32 copies, made by the forward's
            # first layer and read by all (one copy kernel a forward, not one a layer)
            qo_indptr = qo_indptr if qo_indptr.dtype == torch.int32 else qo_indptr.to(torch.int32)
            kv_indptr = kv_indptr if kv_indptr.dtype == torch.int32 else kv_indptr.to(torch.int32)
            mask_and_block = verify_mask(custom_mask, mask_indptr, qo_indptr, kv_indptr, n_tok, max_q_len, causal)
            self._pass = self._pass.next(layer, batch_key, mask_and_block, (qo_indptr, kv_indptr))
        qo_indptr, kv_indptr = self._pass.indptrs
        mask, block = self._pass.mask_and_block
        scale = sm_scale if sm_scale is not None else 576 ** -0.5  # SGLang's default: 1/sqrt(Lq)
        va.verify_attention(q, k.reshape(n_tok, 576), k_buffer, kv_indices, kv_indptr, qo_indptr, mask,
                            float(scale), out=o.view(n_tok, h, 512), workspace=ws, max_q_len=mq,
                            num_splits=ns, config=cfg, k_scale=k_scale, v_scale=v_scale, block_mask=block,
                            plan_ready=reuse)


class ForwardPass:
    """What the layers of one verify forward share: the packed draft mask, the int32 copies of
    the batch's index pointers and the workspace's plan, all functions of the batch alone. SGLang
    calls the backend once a layer (61 in Kimi K2.6) with the same batch tensors, so the first
    layer of a forward packs the mask, copies the pointers and plans (the plan kernel, for
    batches), and the others reuse them (RESULTS.md sessions 26 and 35).

    Where a forward starts is read from the layers, not from SGLang's metadata calls: a CUDA
    graph runner sets the metadata once and then runs the forward three times (two warm-ups and
    the capture), so a cache reset there would leave the captured graph without its mask and
    plan kernels, on a warm-up's values. Each layer has its own KV pool; a pool seen again starts
    a new forward. A call whose batch tensors (by address, shape and dtype), token count, draft
    length, causal flag, config or workspace differ from the forward's starts one too
    (addresses, not contents: SGLang rewrites a graph's buffers in place between replays).
    What this assumes: a forward calls each layer once, in order, with
    its metadata's tensors and the same pools as the forward before it (SGLang's call site,
    checked in tests/test_sglang_plugin.py), so a new batch reaches the backend at a layer already
    seen. A caller that runs new pools through the same MlaVerify must call ``new_forward()``
    first."""

    def __init__(self, layers=(), batch_key=None, mask_and_block=None, indptrs=None):
        # every layer of the forward so far, this pass's and those of passes before it in the
        # same forward (a key that changed midway): a layer seen again starts the next forward
        self.layers = set(layers)
        self.batch_key = batch_key
        self.mask_and_block = mask_and_block
        self.indptrs = indptrs  # (qo_indptr, kv_indptr) as int32

    @staticmethod
    def tensors_key(*tensors):
        return tuple(None if x is None else (x.data_ptr(), tuple(x.shape), x.dtype) for x in tensors)

    def continues(self, layer: int, batch_key) -> bool:
        """True (and the layer recorded) when this call is a later layer of the same forward and batch."""
        if layer in self.layers or batch_key != self.batch_key:
            return False
        self.layers.add(layer)
        return True

    def next(self, layer: int, batch_key, mask_and_block, indptrs) -> ForwardPass:
        """The pass this call starts: of a new forward when its layer was seen in this one, else
        a new batch within the same forward (whose layers it keeps)."""
        layers = {layer} if layer in self.layers else self.layers | {layer}
        return ForwardPass(layers, batch_key, mask_and_block, indptrs)


def packed_custom_mask(custom_mask, mask_indptr, qo_indptr, kv_indptr, num_tokens: int, max_q_len: int):
    """SGLang's custom mask (DDTree's trees) packed for the kernel: on a GPU by one small kernel
    (the first layer of every verify forward packs it, `ForwardPass`), elsewhere by
    `pack_custom_mask`'s torch ops."""
    if not qo_indptr.is_cuda:
        from .verify_attention import pack_custom_mask
        return pack_custom_mask(custom_mask, mask_indptr, qo_indptr, kv_indptr, max_q_len, num_tokens=num_tokens)
    from ._draft_mask import tree_mask
    return tree_mask(custom_mask, mask_indptr, qo_indptr, kv_indptr, num_tokens, max_q_len)


def verify_mask(custom_mask, mask_indptr, qo_indptr, kv_indptr, num_tokens: int, max_q_len: int, causal: bool):
    """(packed mask, block_mask) for verify_attention as SGLang's call asks: its custom mask
    (DDTree's trees) packed with a row per token, or without one (DFlash's chains, causal; or all
    visible) one draft block's rows that every request shares (`shared_draft_block`)."""
    if custom_mask is not None:
        return packed_custom_mask(custom_mask, mask_indptr, qo_indptr, kv_indptr, num_tokens, max_q_len), False
    return shared_draft_block(max_q_len, causal, qo_indptr.device), True


# (device, causal) -> the shared draft blocks built for it, the largest last. A smaller one stays
# alive when a larger one replaces it: a CUDA graph captured with it still reads it.
_DRAFT_BLOCKS: dict = {}


def shared_draft_block(max_q_len: int, causal: bool, device):
    """The chain (or all-visible) draft block of verify_attention's block_mask: the same for
    every request, batch, layer and step, so it is built once per device and kind, at least 64
    rows (grown for a longer draft), and no kernel runs for the mask in a verify step (one cost
    1.0-1.7 us a layer, RESULTS.md session 16). A request reads its own rows 0..t_b - 1 of it,
    so draft lengths may differ within a batch and between graph replays.
    Inside a CUDA graph capture that would have to build it, the capture gets a copy of its own,
    built by captured ops: a tensor filled there holds nothing until the graph runs, so it is
    not kept for other calls."""
    import torch

    from .verify_attention import draft_block_mask
    built = _DRAFT_BLOCKS.setdefault((device, bool(causal)), [])
    if built and built[-1].shape[0] >= max_q_len:
        return built[-1]
    if _capturing(device):
        return draft_block_mask(max_q_len, causal, device)
    built.append(draft_block_mask(max(max_q_len, 64, 2 * built[-1].shape[0] if built else 0), causal, device))
    if device.type == "cuda":
        # built on this stream; the first call that reads it may run on another
        torch.cuda.current_stream(device).synchronize()
    return built[-1]


def _capturing(device) -> bool:
    import torch
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def card_verdict(backend, model_runner):
    """The on-card self-check (``selfcheck.run``) for this backend's device, heads, pool dtype and
    draft length; run once per process and key, logged, and cached (a failure too). None when
    switched off, or for a pool the kernel does not read (every call then goes to SGLang)."""
    if os.environ.get(SELFCHECK_ENV, "1").strip().lower() in OFF_VALUES:
        return None
    import importlib

    import torch

    from . import selfcheck
    va = importlib.import_module(".verify_attention", __package__)
    log = logging.getLogger(__name__)
    try:
        device = selfcheck.resolve_device(getattr(backend, "device", None) or "cuda")
        heads = int(backend.num_head)
        kv_dtype = getattr(model_runner, "kv_cache_dtype", None) or torch.bfloat16
        draft_len = int(getattr(backend, "num_draft_tokens", None) or 16)
    except Exception as error:  # noqa: BLE001 - a backend unlike 0.5.23's: no check, no kernel
        key, args = ("unknown backend",), None
        reason = f"the check could not start: {type(error).__name__}: {error}"
    else:
        key, args = (str(device), heads, kv_dtype, draft_len), (device, heads, kv_dtype, draft_len)
        if kv_dtype not in va.KV_DTYPES:
            if key not in _CARD_VERDICTS:
                _CARD_VERDICTS[key] = None
                log.info("%s: a %s pool is not one the verify kernel reads; SGLang's own verify path serves",
                         __name__, kv_dtype)
            return None
    if key not in _CARD_VERDICTS:
        if args is None:
            verdict = selfcheck.SelfCheck(False, "?", "?", 0, "?", float("nan"), 0.0, reason)
        else:
            verdict = selfcheck.run(*args)
        _CARD_VERDICTS[key] = verdict
        if verdict.passed:
            log.info("%s: %s; it serves target-verify", __name__, verdict.line())
        else:
            log.error("%s: %s; SGLang's own verify path serves instead (unset %s to silence this)",
                      __name__, verdict.line(), ENV)
    return _CARD_VERDICTS[key]


def patch_backend_class(cls) -> bool:
    """Wrap ``cls.__init__`` (SGLang's TritonAttnBackend) so that MLA backends route target-verify
    through ``MlaVerify``. Idempotent. Returns True if it patched now."""
    if getattr(cls, "_dflash_verify_patched", False):
        return False
    orig_init = cls.__init__

    def __init__(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        if not (enabled() and getattr(self, "use_mla", False)):
            return
        model_runner = args[0] if args else kwargs.get("model_runner")
        try:
            verdict = card_verdict(self, model_runner)
        except Exception:  # noqa: BLE001 - no check, no kernel; the server starts on SGLang's path
            logging.getLogger(__name__).exception("%s: the verify kernel's self-check could not run; SGLang's "
                                                  "own verify path serves", __name__)
            return
        self.dflash_selfcheck = verdict
        if verdict is not None and not verdict.passed:
            return
        prev = None  # the fast path SGLang itself chose, kept as our fallback
        if getattr(self, "use_verify_shared_kv", False):
            prev = getattr(self, "verify_shared_kv_fwd", None)
        elif getattr(self, "use_verify_splitkv", False):
            prev = getattr(self, "verify_splitkv_fwd", None)
        fn = MlaVerify(fallback=prev)
        try:  # the backend wraps its own verify kernels the same way
            import torch
            fn_wrapped = torch.compiler.disable(fn)
        except Exception:  # pragma: no cover - older torch
            fn_wrapped = fn
        self.dflash_verify = fn
        self.verify_shared_kv_fwd = fn_wrapped
        self.use_verify_shared_kv = True

    __init__.__wrapped__ = orig_init
    cls.__init__ = __init__
    cls._dflash_verify_patched = True
    return True


# One line, run by site.py at every interpreter start: a standard-library module that reads the
# switch; off, it installs nothing, and on, nothing heavy is imported before SGLang's backend.
PTH_LINE = "import dflash_kernels_startup; dflash_kernels_startup.autoload()\n"


def write_pth(site_dir: str | None = None) -> str:
    site_dir = site_dir or sysconfig.get_paths()["purelib"]
    path = os.path.join(site_dir, PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="SGLang target-verify plugin for dflash_kernels")
    ap.add_argument("--write-pth", action="store_true", help="write the start-up .pth into site-packages")
    ap.add_argument("--site-dir", help="site-packages folder (default: this interpreter's purelib)")
    a = ap.parse_args(argv)
    if a.write_pth:
        print(write_pth(a.site_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
