"""The simulated engine: startup sequence, scheduler (radix cache, chunked prefill, decode), crashes."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid

from . import crash, logs, memory, timing
from .faults import Faults

VERSION = "0.5.23"
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"
# Kimi K2.6's config.json max_position_embeddings (used when --context-length is absent).
MODEL_CONTEXT_LENGTH = 262144
MODEL_ARCHITECTURE = "DeepseekV3ForCausalLM"
DECODE_LOG_INTERVAL = 40
# The words the simulated model generates, cycled (deterministic output).
OUTPUT_WORDS = ("The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog.")


class RequestError(ValueError):
    """A request SGLang refuses with HTTP 400."""


def env_float(name: str, default: float) -> float:
    return memory.env_float(name, default)


@dataclasses.dataclass
class Config:
    """The server args in force, resolved as SGLang resolves the ones the simulator uses."""

    args: object
    gpu: memory.GPUConfig
    tp_size: int
    mem_fraction_static: float
    chunked_prefill_size: int
    context_length: int
    page_size: int
    max_running_requests: int
    speculative_algorithm: str | None
    speculative_num_draft_tokens: int | None
    served_model_name: str
    expandable_segments: bool
    time_factor: float
    load_seconds: float
    accept_length: float
    cuda_graph: bool

    @classmethod
    def resolve(cls, args) -> Config:
        gpu = memory.GPUConfig.from_env()
        tp = args.tp_size
        chunk = args.chunked_prefill_size
        if chunk is None:
            chunk = memory.default_chunked_prefill_size(gpu.total_gib)
        fraction = args.mem_fraction_static
        if fraction is None:
            fraction = memory.default_mem_fraction_static(gpu.total_gib, chunk, tp)
        spec = args.speculative_algorithm.upper() if args.speculative_algorithm else None
        num_draft = args.speculative_num_draft_tokens
        if spec == "DFLASH":
            num_draft = num_draft or getattr(args, "speculative_dflash_block_size", None) or 16
            max_running = 48  # DFLASH forces 48 running requests.
        else:
            max_running = args.max_running_requests or 2048
        cuda_graph = not getattr(args, "disable_cuda_graph", False)
        if getattr(args, "cuda_graph_backend_decode", None) == "disabled":
            cuda_graph = False
        accept = env_float("SGLANG_SIM_ACCEPT_LENGTH", 1.0) if spec else 1.0
        return cls(
            args=args,
            gpu=gpu,
            tp_size=tp,
            mem_fraction_static=fraction,
            chunked_prefill_size=chunk,
            context_length=args.context_length or MODEL_CONTEXT_LENGTH,
            page_size=args.page_size or 1,
            max_running_requests=max_running,
            speculative_algorithm=spec,
            speculative_num_draft_tokens=num_draft,
            served_model_name=args.served_model_name or args.model_path,
            expandable_segments=memory.expandable_segments_enabled(),
            time_factor=max(0.0, env_float("SGLANG_SIM_TIME_FACTOR", 1.0)),
            load_seconds=env_float("SGLANG_SIM_LOAD_SECONDS", timing.DEFAULT_LOAD_SECONDS),
            accept_length=max(1.0, accept),
            cuda_graph=cuda_graph,
        )

    def server_args(self) -> dict:
        """All parsed args with the resolved values; the API key is never shown."""
        out = dict(vars(self.args))
        out.update(
            tp_size=self.tp_size,
            mem_fraction_static=self.mem_fraction_static,
            chunked_prefill_size=self.chunked_prefill_size,
            context_length=self.context_length,
            page_size=self.page_size,
            max_running_requests=self.max_running_requests,
            speculative_algorithm=self.speculative_algorithm,
            speculative_num_draft_tokens=self.speculative_num_draft_tokens,
            served_model_name=self.served_model_name,
            tokenizer_path=self.args.tokenizer_path or self.args.model_path,
        )
        # (secrets in clear, as SGLang 0.5.23's resolved server_args: its log line and /server_info
        # carry the API key; the tools that copy them must hide it)
        return out


def tokenize(obj: dict) -> list:
    """One token per whitespace-separated word of ``text``; ``input_ids`` as given."""
    if obj.get("input_ids") is not None:
        ids = obj["input_ids"]
        if not isinstance(ids, list):
            raise RequestError("input_ids must be a list of token ids")
        return list(ids)
    text = obj.get("text")
    if text is None:
        raise RequestError("Either text or input_ids should be provided.")
    if not isinstance(text, str):
        raise RequestError("text must be a string")
    return text.split()


def output_text(n: int) -> str:
    return " ".join(OUTPUT_WORDS[i % len(OUTPUT_WORDS)] for i in range(n))


class RadixCache:
    """Prompts' token sequences; a match is the longest common prefix with any of them."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.seqs: list[tuple] = []

    def match(self, tokens: list) -> int:
        if not self.enabled:
            return 0
        best = 0
        limit = len(tokens) - 1  # SGLang always computes at least the last token.
        for seq in self.seqs:
            n = min(len(seq), limit)
            i = 0
            while i < n and seq[i] == tokens[i]:
                i += 1
            best = max(best, i)
        return max(0, best)

    def insert(self, tokens: list, capacity: int) -> None:
        """Keep this prompt; evict the oldest ones beyond the pool's capacity (LRU-ish)."""
        if not self.enabled or not tokens:
            return
        seq = tuple(tokens)
        if seq in self.seqs:
            self.seqs.remove(seq)
        self.seqs.append(seq)
        while len(self.seqs) > 1 and self.total_tokens() > capacity:
            self.seqs.pop(0)

    def total_tokens(self) -> int:
        return sum(len(s) for s in self.seqs)

    def clear(self) -> None:
        self.seqs.clear()


class Engine:
    """One SGLang server: the HTTP layer calls generate(), the rest happens here."""

    def __init__(self, cfg: Config, metrics=None):
        self.cfg = cfg
        self.metrics = metrics
        self.faults = Faults(os.environ.get("SGLANG_SIM_FAULTS_FILE") or None, self._warn)
        self.status = "starting"  # starting, ready, exiting
        self.plan: memory.KVPlan | None = None
        self.mem: memory.MemoryState | None = None
        self.radix = RadixCache(not cfg.args.disable_radix_cache)
        self.prefill_lock = asyncio.Lock()
        self.slots = asyncio.Semaphore(cfg.max_running_requests)
        self.running: dict[str, dict] = {}
        self.waiting = 0
        self.last_receive = 0.0
        # Health checks answered at the next forward pass instead of being run: SGLang's scheduler
        # does so while it has a chunked prefill or a running batch (return_health_check_ct).
        self.health_checks_due = 0
        self.last_gen_throughput = 0.0
        self.decode_ct = 0
        self.gen_tokens_since_log = 0
        self.last_decode_log = time.monotonic()
        self.last_prefill_log = time.monotonic()
        self.spec_accept_tokens = 0
        self.spec_verify_ct = 0
        self.cache_hit_tokens = 0
        self.prompt_token_total = 0
        self.startup_available_gb = 0.0
        self.startup_time = time.time()
        self.crashed = False

    # ------------------------------------------------------------------ utilities
    def _warn(self, message: str) -> None:
        logs.emit(f"WARNING: {message}")

    def scaled(self, seconds: float) -> float:
        return seconds * self.cfg.time_factor

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(self.scaled(seconds))

    @property
    def max_total_num_tokens(self) -> int:
        return self.plan.max_total_num_tokens if self.plan else 0

    @property
    def max_req_input_len(self) -> int:
        max_req_len = min(self.cfg.context_length - 1, self.max_total_num_tokens - 1)
        return max_req_len - 5

    def used_tokens(self) -> int:
        return sum(r["context"] for r in self.running.values())

    def token_usage(self) -> float:
        total = self.max_total_num_tokens
        return self.used_tokens() / total if total else 0.0

    def num_running(self) -> int:
        """SGLang's running batch: requests past their prefill. A request whose prefill is being
        chunked is neither running nor queued there (scheduler.chunked_req), so SGLang 0.5.23's
        gauges read 0 and 0 through a lone long prefill."""
        return sum(1 for r in self.running.values() if r["phase"] == "decode")

    def num_queued(self) -> int:
        """SGLang's waiting queue: requests not yet taken into a prefill."""
        return self.waiting + sum(1 for r in self.running.values() if r["phase"] == "queued")

    def busy(self) -> bool:
        """A real request (not a health check) is being prefilled or decoded."""
        return any(not str(rid).startswith(HEALTH_CHECK_RID_PREFIX) for rid in self.running)

    def _forward_done(self) -> None:
        """A prefill chunk or a decode step finished: the deferred health checks get their answer."""
        if self.health_checks_due:
            self.health_checks_due = 0
            self.last_receive = time.monotonic()

    def avg_spec_accept_length(self) -> float:
        if not self.spec_verify_ct:
            return 1.0
        return self.spec_accept_tokens / self.spec_verify_ct

    # ------------------------------------------------------------------ startup
    async def start(self) -> None:
        """SGLang's startup: weights, KV pool, CUDA graphs, warm-up, ready."""
        cfg = self.cfg
        # SGLang 0.5.23 logs the resolved settings as a dict (entrypoints/engine.py); unlike SGLang,
        # which prints the API key in clear there, the simulator masks it.
        logs.emit(f"server_args={cfg.server_args()!r}")
        from .args import DEPRECATION_WARNINGS

        for warning in DEPRECATION_WARNINGS:
            logs.emit(warning)
        if self.faults.get("crash_at_start"):
            await self.sleep(5.0)
            self.crash(self.faults.get("crash_kind") or "illegal_memory_access", serving=False)
            return
        slow = self.faults.get("slow_start_seconds") or 0.0
        if slow:
            await self.sleep(slow)
        card_gib = self.faults.get("gpu_mem_gib")
        if card_gib:
            cfg.gpu = dataclasses.replace(cfg.gpu, total_gib=card_gib)

        gpu = cfg.gpu
        tp = cfg.tp_size
        try:
            plan = memory.plan_kv(
                gpu,
                cfg.mem_fraction_static,
                tp_size=tp,
                page_size=cfg.page_size,
                speculative_algorithm=cfg.speculative_algorithm,
                kv_cache_dtype=cfg.args.kv_cache_dtype,
                cuda_graph=cfg.cuda_graph,
            )
            no_kv = None
        except memory.NoKVMemoryError as exc:
            plan, no_kv = None, str(exc)

        pre = gpu.total_gib - gpu.non_torch_gib
        weights = gpu.weights()
        logs.ranks(lambda r: f"Load weight begin. avail mem={pre:.2f} GB", tp)
        tic = time.monotonic()
        await self.sleep(cfg.load_seconds)
        elapsed = time.monotonic() - tic
        logs.ranks(
            lambda r: (
                f"Load weight end. elapsed={elapsed:.2f} s, type={MODEL_ARCHITECTURE}, "
                f"avail mem={pre - weights:.2f} GB, mem usage={weights:.2f} GB."
            ),
            tp,
        )
        if no_kv:
            crash.die(crash.kv_no_memory_traceback(no_kv), serving=False)
            return
        self.plan = plan
        self.mem = memory.MemoryState(gpu, plan, cfg.expandable_segments)
        await self.sleep(timing.MEMORY_POOL_SECONDS)
        kv_dtype = "torch.float8_e4m3fn" if cfg.args.kv_cache_dtype.startswith("fp8") else "torch.bfloat16"
        tokens = plan.max_total_num_tokens
        logs.ranks(
            lambda r: (
                f"KV Cache is allocated. dtype: {kv_dtype}, #tokens: {tokens}, "
                f"KV size: {plan.target_kv_bytes / memory.GIB:.2f} GB"
            ),
            tp,
        )
        if plan.draft_kv_bytes:
            half = plan.draft_kv_bytes / 2 / memory.GIB
            logs.ranks(
                lambda r: (
                    f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {tokens}, "
                    f"K size: {half:.2f} GB, V size: {half:.2f} GB"
                ),
                tp,
            )
        logs.ranks(lambda r: f"Memory pool end. avail mem={plan.avail_after_pool_gib:.2f} GB", tp)

        if cfg.cuda_graph:
            verify = cfg.speculative_algorithm is not None
            name = "target verify" if verify else "target decode"
            per_req = (cfg.speculative_num_draft_tokens or 1) if verify else 1
            logs.ranks(
                lambda r: (
                    f"Capture {name} CUDA graph begin. backend=full, num_tokens_per_req={per_req}, "
                    f"avail mem={plan.avail_after_pool_gib:.2f} GB"
                ),
                tp,
            )
            oom = memory.startup_oom(gpu, plan, "graph")
            if oom:
                await self.sleep(timing.CUDA_GRAPH_CAPTURE_SECONDS / 4)
                line = memory.oom_message(oom, other_pid=self._other_pid())
                crash.die(crash.graph_oom_traceback(line), serving=False)
                return
            tic = time.monotonic()
            await self.sleep(timing.CUDA_GRAPH_CAPTURE_SECONDS)
            elapsed = time.monotonic() - tic
            bs = [b for b in (1, 2, 4, 8, 12, 16, 24, 32, 40, 48) if b <= cfg.max_running_requests]
            logs.ranks(
                lambda r: (
                    f"Capture {name} CUDA graph end. bs={bs}, elapsed={elapsed:.2f} s, "
                    f"mem usage={plan.graph_gib:.2f} GB, avail mem={plan.avail_after_graph_gib:.2f} GB."
                ),
                tp,
            )
        self.startup_available_gb = plan.avail_after_graph_gib
        logs.emit(
            f"max_total_num_tokens={tokens}, chunked_prefill_size={cfg.chunked_prefill_size}, "
            f"max_prefill_tokens={cfg.args.max_prefill_tokens}, "
            f"max_running_requests={cfg.max_running_requests}, context_len={cfg.context_length}, "
            f"available_gpu_mem={plan.avail_after_graph_gib:.2f} GB",
            rank=0,
        )
        # Warm-up forward: lazily created NCCL/cuBLAS state and persistent buffers.
        await self.sleep(timing.WARMUP_SECONDS)
        oom = memory.startup_oom(gpu, plan, "warmup")
        if oom:
            line = memory.oom_message(oom, other_pid=self._other_pid())
            crash.die(crash.prefill_oom_traceback(line), serving=False)
            return
        if self.metrics:
            self.metrics.set_constants(self)
        self.status = "ready"
        logs.emit("The server is fired up and ready to roll!")
        asyncio.get_running_loop().create_task(self._crash_after())

    def _other_pid(self) -> int:
        """PID shown for the other process on the GPU (the launcher's, as on the seed's node)."""
        ppid = os.getppid()
        return ppid if ppid > 1 else max(2, os.getpid() - 17)

    async def _crash_after(self) -> None:
        while self.status == "ready":
            after = self.faults.get("crash_after_seconds")
            if after is not None:
                await self.sleep(after)
                if self.status == "ready" and self.faults.get("crash_after_seconds") is not None:
                    self.crash(self.faults.get("crash_kind") or "illegal_memory_access", serving=True)
                return
            await asyncio.sleep(0.1)

    def crash(self, kind: str, serving: bool) -> None:
        """A drill crash of the named kind (oom, illegal_memory_access, nccl)."""
        self.crashed = True
        if kind == "oom" and self.mem is not None:
            info = self.mem.oom_info(memory.activation_bytes(max(1, self.cfg.chunked_prefill_size)))
            text = crash.prefill_oom_traceback(memory.oom_message(info, other_pid=self._other_pid()))
        else:
            text = crash.unknown_crash_traceback(kind, self.cfg.tp_size)
        crash.die(text, serving=serving)

    async def watch_faults(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.faults.reload()

    # ------------------------------------------------------------------ requests
    def validate(self, tokens: list) -> None:
        n = len(tokens)
        if n >= self.cfg.context_length:
            raise RequestError(
                f"The input ({n} tokens) is longer than the model's context length "
                f"({self.cfg.context_length} tokens)."
            )
        if n >= self.max_req_input_len:
            raise RequestError(
                f"Input length ({n} tokens) exceeds the maximum allowed length "
                f"({self.max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate."
            )

    async def generate(self, obj: dict, *, health_path: str | None = None, arrival: float | None = None):
        """Run one request; yield (text, meta_info, finished) after each committed step.

        Simulated work is paced against a clock that starts at ``arrival`` (when the
        HTTP layer got the request), so request parsing and streaming writes are
        absorbed as on a GPU server, where they overlap the forward passes.
        """
        clock = time.monotonic() if arrival is None else arrival
        tokens = tokenize(obj)
        params = obj.get("sampling_params") or {}
        max_new = params.get("max_new_tokens")
        max_new = 128 if max_new is None else int(max_new)
        rid = obj.get("rid") or uuid.uuid4().hex
        self.validate(tokens)
        is_health = str(rid).startswith(HEALTH_CHECK_RID_PREFIX)
        created = clock

        self.waiting += 1
        try:
            await self.slots.acquire()
        finally:
            self.waiting -= 1
        try:
            while self.faults.get("hang_scheduler") or (
                health_path == "/health_generate" and self.faults.get("hang_health_generate")
            ):
                await asyncio.sleep(0.05)
            req = {"rid": rid, "context": 0, "phase": "queued"}
            self.running[rid] = req
            if self.metrics:
                self.metrics.update_gauges(self)
            async with self.prefill_lock:
                req["phase"] = "prefill"
                if self.metrics:
                    self.metrics.update_gauges(self)
                clock = max(clock, time.monotonic())
                cached = self.radix.match(tokens)
                new = len(tokens) - cached
                req["context"] = cached
                prefix = cached
                largest = 0
                for i, c in enumerate(timing.chunks(new, self.cfg.chunked_prefill_size)):
                    oom = self.mem.check_chunk(c)
                    if oom:
                        self.crashed = True
                        line = memory.oom_message(oom, other_pid=self._other_pid())
                        crash.die(crash.prefill_oom_traceback(line), serving=True)
                        return
                    req["context"] = prefix + c
                    dt = timing.prefill_chunk_seconds(c, prefix)
                    clock += self.scaled(dt)
                    await asyncio.sleep(max(0.0, clock - time.monotonic()))
                    # (as SGLang 0.5.23, which logs a prefill batch from its result, after the forward:
                    # a single long forward, an unchunked 185k prefill, logs nothing for minutes)
                    self._log_prefill(c, prefix if i else cached, dt)
                    self._forward_done()
                    prefix += c
                    largest = max(largest, c)
                self.mem.finish_request(largest)
                # (past its prefill: it joins the running batch below only with more tokens to decode; a
                # request whose one token came from its prefill, a health check's, never does)
                req["phase"] = "done"
                if not is_health:
                    self.radix.insert(tokens, self.max_total_num_tokens)
            ttft = time.monotonic() - created
            if not is_health:
                self.cache_hit_tokens += cached
                self.prompt_token_total += len(tokens)
            context = len(tokens) + 1
            req["context"] = context
            completion = 1 if max_new > 0 else 0
            verify_ct = 0
            meta = {
                "id": rid,
                "finish_reason": None,
                "prompt_tokens": len(tokens),
                "weight_version": "default",
                "completion_tokens": completion,
                "cached_tokens": cached,
            }
            self.last_receive = time.monotonic()
            if self.metrics and not is_health:
                self.metrics.observe_ttft(ttft, bool(obj.get("stream")))
            if completion >= max_new:
                yield self._final(meta, completion, verify_ct, created, ttft)
                return
            req["phase"] = "decode"
            yield output_text(completion), dict(meta), False
            pending = 0.0
            while completion < max_new:
                step = timing.decode_step_seconds(context)
                t0 = time.monotonic()
                clock += self.scaled(step)
                await asyncio.sleep(max(0.0, clock - time.monotonic()))
                self._forward_done()
                pending += self.cfg.accept_length
                take = min(max_new - completion, int(pending))
                pending -= take
                completion += take
                context += take
                verify_ct += 1
                req["context"] = context
                self._count_decode(take, step)
                if self.metrics and not is_health:
                    self.metrics.observe_itl(time.monotonic() - t0, take)
                self.last_receive = time.monotonic()
                meta["completion_tokens"] = completion
                if completion >= max_new:
                    break
                yield output_text(completion), dict(meta), False
            yield self._final(meta, completion, verify_ct, created, ttft)
        finally:
            self.running.pop(rid, None)
            self.slots.release()
            if self.metrics:
                self.metrics.update_gauges(self)

    def _final(self, meta, completion, verify_ct, created, ttft):
        meta = dict(meta)
        meta["completion_tokens"] = completion
        meta["finish_reason"] = {"type": "length", "length": completion}
        e2e = time.monotonic() - created
        meta["e2e_latency"] = round(e2e, 6)
        if self.cfg.speculative_algorithm:
            # The first token comes from the prefill; each verify step commits the rest.
            meta["spec_verify_ct"] = verify_ct
            meta["spec_accept_length"] = (completion / verify_ct) if verify_ct else 1.0
            self.spec_verify_ct += verify_ct
            self.spec_accept_tokens += max(0, completion - 1)
        if self.metrics:
            self.metrics.observe_e2e(e2e, meta.get("id", ""))
        return output_text(completion), meta, True

    def _log_prefill(self, chunk: int, hit: int, seconds: float) -> None:
        now = time.monotonic()
        gap = max(now - self.last_prefill_log, 1e-9)
        self.last_prefill_log = now
        throughput = chunk / seconds if seconds > 0 else chunk / gap  # model seconds, not scaled ones
        logs.emit(
            f"Prefill batch, #new-seq: 1, #new-token: {chunk}, #cached-token: {hit}, "
            f"token usage: {self.token_usage():.2f}, #running-req: {self.num_running()}, "
            f"#queue-req: {self.num_queued()}, #pending-token: 0, cuda graph: False, "
            f"input throughput (token/s): {throughput:.2f}",
            rank=0,
        )

    def _count_decode(self, tokens: int, step_seconds: float) -> None:
        self.decode_ct += 1
        self.gen_tokens_since_log += tokens
        if self.decode_ct % DECODE_LOG_INTERVAL:
            return
        now = time.monotonic()
        gap = max(now - self.last_decode_log, 1e-9)
        self.last_decode_log = now
        if self.cfg.time_factor > 0:
            gap /= self.cfg.time_factor  # report model time, not the scaled wall time
        self.last_gen_throughput = self.gen_tokens_since_log / gap
        self.gen_tokens_since_log = 0
        msg = (
            f"Decode batch, #running-req: {self.num_running()}, #token: {self.used_tokens()}, "
            f"token usage: {self.token_usage():.2f}, "
        )
        if self.cfg.speculative_algorithm:
            acc = self.cfg.accept_length
            drafts = max(1, (self.cfg.speculative_num_draft_tokens or 2) - 1)
            msg += f"accept len: {acc:.2f}, accept rate: {(acc - 1) / drafts:.2f}, "
        msg += (
            f"cuda graph: {self.cfg.cuda_graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {self.num_queued()}"
        )
        logs.emit(msg, rank=0)
        if self.metrics:
            self.metrics.update_gauges(self)

    # ------------------------------------------------------------------ control
    def flush_cache(self) -> bool:
        if self.running or self.waiting:
            logs.emit(
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {self.num_queued()}, #running-req: {self.num_running()}",
                rank=0,
            )
            return False
        self.radix.clear()
        logs.emit("Cache flushed successfully!", rank=0)
        return True

    def server_info(self) -> dict:
        cfg = self.cfg
        info = cfg.server_args()
        plan = self.plan
        state = dict(info)
        state.update(
            last_gen_throughput=self.last_gen_throughput,
            memory_usage={
                "weight": round(cfg.gpu.weights(), 3),
                "kvcache": round((plan.target_kv_bytes + plan.draft_kv_bytes) / memory.GIB, 3)
                if plan
                else 0.0,
                "startup_available": round(self.startup_available_gb, 3),
                "token_capacity": self.max_total_num_tokens,
                "token_capacity_swa": None,
                "graph": {"decode": round(plan.graph_gib, 3)} if plan and plan.graph_gib else {},
            },
        )
        if cfg.speculative_algorithm:
            state["avg_spec_accept_length"] = self.avg_spec_accept_length()
        info.update(
            max_total_num_tokens=self.max_total_num_tokens,
            max_req_input_len=self.max_req_input_len,
            startup_time=self.startup_time,
            internal_states=[state],
            version=VERSION,
            frontend="python",
        )
        return info
