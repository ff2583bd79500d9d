"""Prometheus metrics with SGLang's names and labels (only with --enable-metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = [
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
]
ITL_BUCKETS = [
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.000,
    2.000,
    4.000,
    6.000,
    8.000,
]


class Metrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry(auto_describe=True)
        sched = {
            "model_name": model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        tok = {"model_name": model_name, "engine_type": "unified"}
        self.sched_labels, self.tok_labels = sched, tok

        def gauge(name, doc):
            return Gauge(name, doc, labelnames=list(sched), registry=self.registry)

        self.num_running_reqs = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.num_used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.max_total_num_tokens = gauge(
            "sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."
        )
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.spec_accept_length = gauge(
            "sglang:spec_accept_length", "The average acceptance length of speculative decoding."
        )
        self.num_retracted_reqs = gauge("sglang:num_retracted_reqs", "The number of retracted requests.")
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labelnames=[*tok, "is_streaming"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labelnames=list(tok),
            buckets=ITL_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            labelnames=[*tok, "is_streaming"],
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )
        for g in (
            self.num_running_reqs,
            self.num_queue_reqs,
            self.token_usage,
            self.num_used_tokens,
            self.max_total_num_tokens,
            self.gen_throughput,
            self.cache_hit_rate,
            self.spec_accept_length,
            self.num_retracted_reqs,
        ):
            g.labels(**sched).set(0)
        self._streaming: dict[str, bool] = {}

    def set_constants(self, engine) -> None:
        self.max_total_num_tokens.labels(**self.sched_labels).set(engine.max_total_num_tokens)

    def update_gauges(self, engine) -> None:
        s = self.sched_labels
        self.num_running_reqs.labels(**s).set(engine.num_running())
        self.num_queue_reqs.labels(**s).set(engine.num_queued())
        self.token_usage.labels(**s).set(round(engine.token_usage(), 2))
        self.num_used_tokens.labels(**s).set(engine.used_tokens())
        self.gen_throughput.labels(**s).set(engine.last_gen_throughput)
        total = engine.prompt_token_total
        self.cache_hit_rate.labels(**s).set(engine.cache_hit_tokens / total if total else 0.0)
        self.spec_accept_length.labels(**s).set(
            engine.avg_spec_accept_length() if engine.cfg.speculative_algorithm else 0.0
        )

    def observe_ttft(self, seconds: float, streaming: bool) -> None:
        self.ttft.labels(**self.tok_labels, is_streaming=str(streaming).lower()).observe(seconds)

    def observe_itl(self, seconds: float, tokens: int) -> None:
        if tokens > 0:
            per = seconds / tokens
            for _ in range(tokens):
                self.itl.labels(**self.tok_labels).observe(per)

    def observe_e2e(self, seconds: float, rid: str) -> None:
        streaming = self._streaming.pop(rid, False)
        self.e2e.labels(**self.tok_labels, is_streaming=str(streaming).lower()).observe(seconds)

    def mark_streaming(self, rid: str, streaming: bool) -> None:
        self._streaming[rid] = streaming

    def render(self) -> bytes:
        return generate_latest(self.registry)
