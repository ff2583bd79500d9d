"""HTTP layer: SGLang's endpoints on aiohttp, plus the lab-only POST /_sim/faults."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import time
import uuid

from aiohttp import web

from . import logs
from .engine import HEALTH_CHECK_RID_PREFIX, Engine, RequestError

# Seconds SGLang's health check waits for the scheduler (scaled by the time factor).
HEALTH_CHECK_TIMEOUT = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", 20))
# SIGTERM: how long in-flight requests may take before the process exits anyway (real seconds).
GRACEFUL_EXIT_TIMEOUT = 60.0
PUBLIC_PREFIXES = ("/health", "/ready", "/metrics")


def _health_generation_enabled() -> bool:
    raw = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").strip().lower()
    return raw in ("1", "true", "yes", "on")


def _error(message: str, status: int = 400) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _event_stream() -> web.StreamResponse:
    return web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})


async def _stream_outputs(request, resp: web.StreamResponse, first, gen, payload) -> web.StreamResponse:
    """SGLang's SSE framing, shared by /generate and /v1/completions: one event per engine output
    (``payload(out)`` builds it; the last output has done set), then ``data: [DONE]``.
    A client that goes away mid-stream aborts its request, as SGLang does: the request leaves
    the running set and gives its slot back (left open, it wedged the engine's health check)."""
    try:
        await resp.prepare(request)
        out = first
        while True:
            await resp.write(_event(payload(out)))
            if out[2]:  # (text, meta, done)
                break
            out = await gen.__anext__()
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    finally:
        await gen.aclose()


def _openai_error(exc: Exception) -> web.Response:
    """The OpenAI-style 400 body SGLang's /v1 endpoints answer a bad request with."""
    body = {"object": "error", "message": str(exc), "type": "BadRequestError", "param": None, "code": 400}
    return web.json_response(body, status=400)


def build_app(engine: Engine) -> web.Application:
    cfg = engine.cfg
    api_key = cfg.args.api_key

    @web.middleware
    async def auth(request: web.Request, handler):
        path = request.path
        if request.method == "OPTIONS" or not api_key or path.startswith(PUBLIC_PREFIXES):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and secrets.compare_digest(token, api_key):
            return await handler(request)
        return web.json_response({"error": "Unauthorized"}, status=401)

    @web.middleware
    async def shutting_down(request: web.Request, handler):
        if engine.status == "exiting" and not request.path.startswith("/health"):
            return web.json_response({"error": {"message": "The server is shutting down."}}, status=503)
        return await handler(request)

    app = web.Application(middlewares=[auth, shutting_down], client_max_size=256 * 1024 * 1024)
    inflight: set[asyncio.Task] = set()
    app["inflight"] = inflight

    def track(coro_fn):
        async def wrapper(request):
            task = asyncio.current_task()
            inflight.add(task)
            try:
                return await coro_fn(request)
            finally:
                inflight.discard(task)

        return wrapper

    # -------------------------------------------------------------- health
    async def health(request: web.Request) -> web.Response:
        if engine.status != "ready":
            if engine.status == "exiting":
                logs.emit("Health check request received during shutdown. Returning 503.")
            return web.Response(status=503)
        if request.path == "/health" and not _health_generation_enabled():
            return web.Response(status=200)
        # Drill fault: /health_generate stops answering at all while /health still says 200.
        # (Without this, any other request's output would pass the check below, as in SGLang.)
        while request.path == "/health_generate" and engine.faults.get("hang_health_generate"):
            await asyncio.sleep(0.05)
        obj = {
            "rid": f"{HEALTH_CHECK_RID_PREFIX}_{uuid.uuid4().hex}",
            "input_ids": [0],
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        }

        async def gen():
            if engine.busy():
                # SGLang's scheduler does not run a health check while it prefills or decodes:
                # it answers it when its next forward pass ends, so a long prefill is healthy.
                engine.health_checks_due += 1
                return
            async for _ in engine.generate(obj, health_path=request.path):
                break

        tic = time.monotonic()
        task = asyncio.create_task(gen())
        deadline = tic + engine.scaled(HEALTH_CHECK_TIMEOUT)
        poll = max(engine.scaled(1.0), 0.005)
        while time.monotonic() < deadline:
            await asyncio.sleep(poll)
            if engine.last_receive > tic:
                task.cancel()
                return web.Response(status=200)
        task.cancel()
        logs.emit(
            "Health check failed. Server couldn't get a response from detokenizer for last "
            f"{int(HEALTH_CHECK_TIMEOUT)} seconds. tic start time: {time.strftime('%H:%M:%S')}. "
            f"last_heartbeat time: {time.strftime('%H:%M:%S')}"
        )
        return web.Response(status=503)

    async def ready(request):
        return web.Response(status=200 if engine.status == "ready" else 503)

    def need_ready():
        if engine.status != "ready":
            raise web.HTTPServiceUnavailable(
                text=json.dumps({"error": {"message": "The server is not ready yet."}}),
                content_type="application/json",
            )

    # -------------------------------------------------------------- info
    async def server_info(request):
        if request.path == "/get_server_info":
            logs.emit(
                "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                "Please use '/server_info' instead."
            )
        need_ready()
        return web.json_response(engine.server_info())

    async def model_info(request):
        return web.json_response(
            {
                "model_path": cfg.args.model_path,
                "served_model_name": cfg.served_model_name,
                "tokenizer_path": cfg.args.tokenizer_path or cfg.args.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "kimi_k2",
                "architectures": ["DeepseekV3ForCausalLM"],
            }
        )

    async def flush_cache(request):
        need_ready()
        if engine.flush_cache():
            return web.Response(
                text="Cache flushed.\nPlease check backend logs for more details. "
                "(When there are running or waiting requests, the operation will not be performed.)\n"
            )
        return web.Response(text="Flush cache failed.\n", status=400)

    async def metrics(request):
        if engine.metrics is None:
            raise web.HTTPNotFound()
        engine.metrics.update_gauges(engine)
        return web.Response(
            body=engine.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    # -------------------------------------------------------------- generate
    async def _json(request):
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise web.HTTPBadRequest(
                text=json.dumps({"error": {"message": "Invalid JSON body"}}), content_type="application/json"
            ) from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(
                text=json.dumps({"error": {"message": "Body must be a JSON object"}}),
                content_type="application/json",
            )
        return body

    async def generate(request):
        arrival = time.monotonic()
        need_ready()
        obj = await _json(request)
        stream = bool(obj.get("stream"))
        obj.setdefault("rid", uuid.uuid4().hex)
        if engine.metrics:
            engine.metrics.mark_streaming(obj["rid"], stream)
        gen = engine.generate(obj, arrival=arrival)
        if not stream:
            try:
                last = None
                async for out in gen:
                    last = out
            except RequestError as exc:
                logs.emit(f"[http_server] Error: {exc}")
                return _error(str(exc))
            text, meta, _ = last
            return web.json_response({"text": text, "output_ids": [], "meta_info": meta})
        resp = _event_stream()
        try:
            first = await gen.__anext__()
        except RequestError as exc:
            logs.emit(f"[http_server] Error: {exc}")
            await resp.prepare(request)
            err = {
                "error": {
                    "message": str(exc),
                    "type": "invalid_request_error",
                    "code": 400,
                    "retryable": False,
                }
            }
            await resp.write(_event(err))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        return await _stream_outputs(
            request, resp, first, gen, lambda out: {"text": out[0], "output_ids": [], "meta_info": out[1]}
        )

    async def completions(request):
        arrival = time.monotonic()
        need_ready()
        body = await _json(request)
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            if prompt and isinstance(prompt[0], int):
                obj = {"input_ids": prompt}
            else:
                obj = {"text": " ".join(str(p) for p in prompt)}
        else:
            obj = {"text": str(prompt)}
        max_tokens = body.get("max_tokens")
        obj["sampling_params"] = {
            "max_new_tokens": 16 if max_tokens is None else int(max_tokens),
            "temperature": body.get("temperature", 1.0),
        }
        rid = "cmpl-" + uuid.uuid4().hex
        obj["rid"] = rid
        stream = bool(body.get("stream"))
        model = body.get("model") or cfg.served_model_name
        created = int(time.time())
        gen = engine.generate(obj, arrival=arrival)
        if engine.metrics:
            engine.metrics.mark_streaming(rid, stream)
        if not stream:
            try:
                last = None
                async for out in gen:
                    last = out
            except RequestError as exc:
                return _openai_error(exc)
            text, meta, _ = last
            return web.json_response(
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "text": text,
                            "logprobs": None,
                            "finish_reason": "length",
                            "matched_stop": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": meta["prompt_tokens"],
                        "completion_tokens": meta["completion_tokens"],
                        "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
                        "prompt_tokens_details": {"cached_tokens": meta["cached_tokens"]},
                    },
                }
            )
        try:
            first = await gen.__anext__()
        except RequestError as exc:
            return _openai_error(exc)
        sent = ""

        def chunk(out) -> dict:
            """An OpenAI completion chunk carries the new text only."""
            nonlocal sent
            text, _, done = out
            delta, sent = text[len(sent) :], text
            return {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "text": delta,
                        "logprobs": None,
                        "finish_reason": "length" if done else None,
                        "matched_stop": None,
                    }
                ],
            }

        return await _stream_outputs(request, _event_stream(), first, gen, chunk)

    async def models(request):
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": cfg.served_model_name,
                        "object": "model",
                        "created": int(engine.startup_time),
                        "owned_by": "sglang",
                        "root": cfg.served_model_name,
                        "max_model_len": cfg.context_length,
                    }
                ],
            }
        )

    # -------------------------------------------------------------- lab only
    async def sim_faults(request):
        """Lab-only control endpoint of the simulator (SGLang has no such route)."""
        if request.method == "GET":
            return web.json_response(engine.faults.current())
        try:
            body = await request.json()
            current = engine.faults.merge(body)
        except (json.JSONDecodeError, ValueError) as exc:
            return _error(f"bad faults: {exc}")
        logs.emit(f"WARNING: lab faults set: {json.dumps(body, sort_keys=True)}")
        return web.json_response(current)

    r = app.router
    r.add_get("/health", track(health))
    r.add_get("/health_generate", track(health))
    r.add_get("/ready", ready)
    r.add_get("/server_info", server_info)
    r.add_get("/get_server_info", server_info)
    r.add_get("/model_info", model_info)
    r.add_get("/get_model_info", model_info)
    r.add_route("GET", "/flush_cache", flush_cache)
    r.add_route("POST", "/flush_cache", flush_cache)
    r.add_get("/metrics", metrics)
    r.add_post("/generate", track(generate))
    r.add_put("/generate", track(generate))
    r.add_post("/v1/completions", track(completions))
    r.add_get("/v1/models", models)
    r.add_get("/_sim/faults", sim_faults)
    r.add_post("/_sim/faults", sim_faults)
    return app


async def serve(engine: Engine) -> int:
    """Listen at once (503 while starting), start the engine, run until SIGTERM."""
    cfg = engine.cfg
    app = build_app(engine)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, cfg.args.host, cfg.args.port)
    await site.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_sigterm():
        logs.emit("Received SIGTERM. Stopping the server gracefully.")
        engine.status = "exiting"
        stop.set()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    loop.add_signal_handler(signal.SIGINT, on_sigterm)
    watcher = loop.create_task(engine.watch_faults())
    starter = loop.create_task(engine.start())
    await stop.wait()
    starter.cancel()
    deadline = time.monotonic() + GRACEFUL_EXIT_TIMEOUT
    inflight = app["inflight"]
    while inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    watcher.cancel()
    await runner.cleanup()
    logs.emit("Gracefully exiting.")
    return 0
