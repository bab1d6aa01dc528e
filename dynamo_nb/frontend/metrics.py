"""The frontend's Prometheus metrics (``prometheus-client``), served at ``/metrics``.

Names follow Dynamo's frontend (``dynamo_frontend_*``), so existing dashboards read them. Each
frontend has its own registry, so several frontends can live in one process (a notebook).

Example:
    >>> metrics = FrontendMetrics()
    >>> metrics.count_request("tiny", "chat_completions", "stream", "success")
    >>> metrics.of("tiny").ttft.observe(0.012)
    >>> text = metrics.render().decode()
    >>> 'status="success"} 1.0' in text
    True
    >>> 'dynamo_frontend_time_to_first_token_seconds_count{model="tiny"} 1.0' in text
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily

from .loop_histogram import LoopHistogram

if TYPE_CHECKING:
    from ..router.decision import RoutingDecision
    from ..router.policy import RouterPolicy
    from .admission import Admission

__all__ = ["FrontendMetrics", "ModelMetrics"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)
CACHED_TOKEN_BUCKETS = (0, 100, 210, 430, 870, 1800, 3600, 7400, 15000, 31000, 63000, 130000)  # Dynamo's
OVERHEAD_MS_BUCKETS = tuple(0.01 * 3**k for k in range(17))  # Dynamo's: 0.01 ms to 430 s
ROUTING_PHASES = ("block_hashing", "indexer_find_matches", "scheduling", "total")


@dataclass
class ModelMetrics:
    """One model's series, looked up once per request (`FrontendMetrics.of`)."""

    inflight: Any
    ttft: Any
    itl: Any
    duration: Any
    input_tokens: Any
    output_tokens: Any


class FrontendMetrics:
    """Requests, in-flight, TTFT, inter-token latency, duration, token counts and the
    disaggregated paths, per model.

    Attributes:
        content_type: the ``Content-Type`` of `render`'s text.
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter(
            "dynamo_frontend_requests",
            "HTTP requests by model, endpoint, stream or unary, and outcome",
            ("model", "endpoint", "request_type", "status"),
            registry=registry,
        )
        self.inflight = Gauge(
            "dynamo_frontend_inflight_requests", "requests running now", ("model",), registry=registry
        )
        self.ttft = LoopHistogram(
            "dynamo_frontend_time_to_first_token_seconds",
            "time to the first token",
            ("model",),
            LATENCY_BUCKETS,
            registry,
        )
        self.itl = LoopHistogram(  # observed per token (these histograms: no lock per value)
            "dynamo_frontend_inter_token_latency_seconds",
            "time between tokens",
            ("model",),
            LATENCY_BUCKETS,
            registry,
        )
        self.duration = LoopHistogram(
            "dynamo_frontend_request_duration_seconds",
            "time of a whole request",
            ("model",),
            LATENCY_BUCKETS,
            registry,
        )
        self.input_tokens = LoopHistogram(
            "dynamo_frontend_input_sequence_tokens",
            "prompt tokens per request",
            ("model",),
            TOKEN_BUCKETS,
            registry,
        )
        self.output_tokens = LoopHistogram(
            "dynamo_frontend_output_sequence_tokens",
            "generated tokens per request",
            ("model",),
            TOKEN_BUCKETS,
            registry,
        )
        self.disagg_requests = Counter(
            "dynamo_frontend_disagg_requests",
            "requests of models with prefill workers, by the path they took (fast, fallback, aggregated)",
            ("model", "path"),
            registry=registry,
        )
        self.prefill_errors = Counter(
            "dynamo_frontend_prefill_errors",
            "prefills that failed or whose handoff failed",
            ("model",),
            registry=registry,
        )
        self.migrations = Counter(
            "dynamo_frontend_migrations",
            "requests carried on by another worker after theirs went down mid-stream",
            ("model",),
            registry=registry,
        )
        self.hung_instances = Counter(
            "dynamo_frontend_hung_instances",
            "times a worker instance with streams in flight sent nothing for longer than expected and was "
            "suspected of hanging",
            ("model",),
            registry=registry,
        )
        self.suspect_instances = Gauge(
            "dynamo_frontend_suspect_instances",
            "worker instances suspected of hanging now (routed around until a canary answers)",
            ("model",),
            registry=registry,
        )
        self.silence_peak = Gauge(
            "dynamo_frontend_worker_silence_peak",
            "the longest silence of a worker with streams in flight that was not found hung, as a share of the "
            "silence that would have counted as a hang (how close a healthy worker came to being suspected)",
            ("model",),
            registry=registry,
        )
        self.canaries = Counter(
            "dynamo_frontend_canaries",
            "one-token requests sent to worker instances suspected of hanging, by whether they answered in time",
            ("model", "result"),
            registry=registry,
        )
        self.queued = Gauge(
            "dynamo_frontend_queued_requests",
            "requests waiting at the frontend for a slot while the model's workers are full",
            ("model",),
            registry=registry,
        )
        self.rejections = Counter(
            "dynamo_frontend_model_rejection",
            "requests refused because a limit was hit, by model and reason (queue_full, queue_timeout)",
            ("model", "reason"),
            registry=registry,
        )
        self.cached_tokens = LoopHistogram(  # observed per request, from the event loop
            "dynamo_frontend_cached_tokens",
            "prompt tokens the engine found cached, per request (usage.prompt_tokens_details.cached_tokens)",
            ("model",),
            CACHED_TOKEN_BUCKETS,
            registry,
        )
        self.routing_overhead = {
            phase: LoopHistogram(  # observed per routing decision
                f"dynamo_router_overhead_{phase}_ms",
                f"time the router spent in {phase.replace('_', ' ')}, in milliseconds",
                ("model", "worker_type"),
                OVERHEAD_MS_BUCKETS,
                registry,
            )
            for phase in ROUTING_PHASES
        }
        self.reuse = Counter(
            "dynamo_frontend_kv_reuse_tokens",
            "the KV reuse funnel, in prompt tokens: input, the leading blocks routed before (seen_before), "
            "the best cached prefix on any worker, the chosen worker's cached prefix (these three as the "
            "router saw them), reused (as the engine reported)",
            ("model", "stage"),
            registry=registry,
        )
        self.queue_wait = LoopHistogram(  # observed per request let in, from the event loop
            "dynamo_frontend_queue_wait_seconds",
            "time a request waited for a slot while the model's workers were full, by strict_priority tier "
            "(8+ for tiers from 8)",
            ("model", "strict_priority"),
            LATENCY_BUCKETS,
            registry,
        )
        self.router_policy = Gauge(
            "dynamo_frontend_router_policy",
            "the KV routers' policy: overlap_score_credit, prefill_load_scale, temperature",
            ("knob",),
            registry=registry,
        )
        self.router_policy_changes = Counter(
            "dynamo_frontend_router_policy_changes",
            "changes of the KV routers' policy, by who made them (the admin token, the cluster secret, this process)",
            ("by",),
            registry=registry,
        )
        self._queues_watched: set[str] = set()
        self._models: dict[str, ModelMetrics] = {}
        self._request_counters: dict[tuple[str, str, str, str], Any] = {}  # labels() costs µs a call

    def observe_queue_wait(self, model: str, strict_priority: int, seconds: float) -> None:
        """A request let in after ``seconds`` in the queue (0: at once), by its tier."""
        tier = str(strict_priority) if strict_priority < 8 else "8+"
        self.queue_wait.labels(model, tier).observe(seconds)

    def show_router_policy(self, policy: RouterPolicy) -> None:
        """Set ``dynamo_frontend_router_policy{knob}`` to ``policy``'s knobs."""
        for knob, value in policy.to_dict().items():
            self.router_policy.labels(knob).set(value)

    def router_policy_changed(self, by: str, policy: RouterPolicy) -> None:
        """Count a policy change made by ``by`` and show the new knobs."""
        self.router_policy_changes.labels(by).inc()
        self.show_router_policy(policy)

    def of(self, model: str) -> ModelMetrics:
        """The series of ``model`` (made on first use, then cached)."""
        found = self._models.get(model)
        if found is None:
            found = self._models[model] = ModelMetrics(
                self.inflight.labels(model),
                self.ttft.labels(model),
                self.itl.labels(model),
                self.duration.labels(model),
                self.input_tokens.labels(model),
                self.output_tokens.labels(model),
            )
        return found

    def watch_queue(self, model: str, admission: Admission) -> None:
        """Report ``admission.waiting`` as ``model``'s queued requests (set up once per model)."""
        if model not in self._queues_watched:
            self._queues_watched.add(model)
            self.queued.labels(model).set_function(lambda: admission.waiting)

    def observe_routing(self, decision: RoutingDecision) -> None:
        """A router's time per phase (the KV router's, under Dynamo's names)."""
        for phase, ms in decision.overhead_ms.items():
            histogram = self.routing_overhead.get(phase)
            if histogram is not None:
                histogram.labels(decision.model, decision.hop).observe(ms)

    def observe_reuse(
        self, model: str, prompt_tokens: int, decision: RoutingDecision | None, cached_tokens: int | None
    ) -> None:
        """One request's KV reuse: the funnel's stages (predicted by a KV router's ``decision``,
        reported by the engine as ``cached_tokens``)."""
        if cached_tokens is not None:
            self.cached_tokens.labels(model).observe(cached_tokens)
        if decision is None:
            return
        prefixes = {
            c.instance_id: tokens
            for c in decision.candidates
            if (tokens := c.parts.get("prefix_tokens")) is not None
        }
        if not prefixes or len(prefixes) < len(decision.candidates):
            return  # only a KV router predicts reuse
        self.reuse.labels(model, "input").inc(prompt_tokens)
        self.reuse.labels(model, "seen_before").inc(decision.seen_before_tokens or 0)
        self.reuse.labels(model, "best_prefix").inc(max(prefixes.values()))
        self.reuse.labels(model, "chosen_prefix").inc(prefixes.get(decision.chosen) or 0)
        if cached_tokens is not None:
            self.reuse.labels(model, "reused").inc(cached_tokens)

    def count_request(self, model: str, endpoint: str, request_type: str, status: str) -> None:
        """One finished HTTP request (``status``: success, error or cancelled)."""
        key = (model, endpoint, request_type, status)
        counter = self._request_counters.get(key)
        if counter is None:
            counter = self._request_counters[key] = self.requests.labels(*key)
        counter.inc()

    def follow_kv_indexes(self, blocks: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
        """Report ``blocks()`` — (model, worker instance id, blocks) for each worker a KV router
        knows cached blocks of, from KV events or its own predictions — as
        ``dynamo_frontend_kv_router_blocks{model, worker}``, read at each scrape."""
        self.registry.register(_KvIndexCollector(blocks))

    def render(self) -> bytes:
        """Every series in the Prometheus text format."""
        return generate_latest(self.registry)


class _KvIndexCollector:
    """``dynamo_frontend_kv_router_blocks``: the blocks each worker holds in its KV router's index."""

    def __init__(self, blocks: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
        self._blocks = blocks

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "dynamo_frontend_kv_router_blocks",
            "KV blocks the model's KV router holds cached on each worker (from its KV events, or predicted)",
            labels=("model", "worker"),
        )
        for model, worker, count in self._blocks():
            family.add_metric((model, f"{worker:x}"), count)
        yield family
