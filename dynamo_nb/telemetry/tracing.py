"""A request's timeline across processes, as OpenTelemetry spans (off by default).

When tracing is on, the frontend opens a ``request`` span for each HTTP request, with child
spans for its admission wait, its routing, its prefill plan and its stream (events mark the
first and the last token); the trace context (W3C ``traceparent``) travels with the request
over the request plane in its context metadata, so each worker's ``handle`` span — and the
prefill worker's, and the decode worker's KV handoff — joins the frontend's trace.

Turn it on in a process with `enable_tracing`, or for a component with the environment
variable ``DYN_NB_TRACE`` (`TRACE_ENV`), read at start:

- ``jsonl:DIR``: spans as JSON lines in ``DIR/<service>-<pid>.jsonl`` (one file per process);
- ``otlp``: to an OpenTelemetry collector (``OTEL_EXPORTER_OTLP_ENDPOINT``; needs
  ``opentelemetry-exporter-otlp``);
- ``memory``: kept in this process (`finished_spans`), for a notebook.

Off, each instrumented step costs one check of a module variable.

Example:
    >>> enable_tracing("demo", memory=True)
    >>> with span("request", {"model": "tiny"}):
    ...     metadata = inject_trace({})
    >>> [s.name for s in finished_spans()], "traceparent" in metadata
    (['request'], True)
    >>> disable_tracing()
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MissingExtraError

__all__ = [
    "TRACE_ENV",
    "JsonlSpanExporter",
    "disable_tracing",
    "enable_tracing",
    "enable_tracing_from_env",
    "finished_spans",
    "flush_tracing",
    "inject_trace",
    "span",
    "tracing_enabled",
]

TRACE_ENV = "DYN_NB_TRACE"

_tracer: Any = None  # the OpenTelemetry tracer while tracing is on
_provider: Any = None
_memory: Any = None  # the in-memory exporter, when spans are kept in this process
_propagator: Any = None


def tracing_enabled() -> bool:
    """Whether spans are recorded in this process."""
    return _tracer is not None


def _require_sdk() -> None:
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise MissingExtraError(
            "tracing needs OpenTelemetry's SDK: pip install 'dynamo-nb[tracing]' "
            "(opentelemetry-api and opentelemetry-sdk)"
        ) from None


def enable_tracing(
    service_name: str = "dynamo_nb",
    *,
    jsonl_dir: str | Path | None = None,
    otlp: bool = False,
    memory: bool = False,
) -> None:
    """Record spans in this process from now on, exported to each destination asked for
    (JSON lines in ``jsonl_dir``, an OTLP collector, memory). Calling it again replaces the setup."""
    global _tracer, _provider, _memory, _propagator
    _require_sdk()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not (jsonl_dir or otlp or memory):
        raise ConfigError("enable_tracing: name a destination: jsonl_dir=..., otlp=True or memory=True")
    disable_tracing()
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name, "process.pid": os.getpid()})
    )
    if jsonl_dir is not None:
        exporter = JsonlSpanExporter(jsonl_dir, service_name)
        # JsonlSpanExporter has SpanExporter's methods without subclassing it (which would import
        # opentelemetry with this module, an optional extra)
        processor = BatchSpanProcessor(exporter, schedule_delay_millis=500)  # type: ignore[arg-type]  # it duck-types SpanExporter (above)
        provider.add_span_processor(processor)
    if otlp:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise MissingExtraError(
                "DYN_NB_TRACE=otlp needs the OTLP exporter: pip install opentelemetry-exporter-otlp-proto-http"
            ) from None
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if memory:
        _memory = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_memory))
    _provider = provider
    _propagator = TraceContextTextMapPropagator()
    _tracer = provider.get_tracer("dynamo_nb")


def enable_tracing_from_env(service_name: str) -> bool:
    """Turn tracing on as ``DYN_NB_TRACE`` says (see the module docstring); False when it is unset."""
    value = os.environ.get(TRACE_ENV, "").strip()
    if not value or value in ("0", "off"):
        return False
    kind, _, where = value.partition(":")
    if kind == "jsonl" and where:
        enable_tracing(service_name, jsonl_dir=where)
    elif kind == "otlp":
        enable_tracing(service_name, otlp=True)
    elif kind == "memory":
        enable_tracing(service_name, memory=True)
    else:
        raise ConfigError(f"{TRACE_ENV}={value!r}: use jsonl:DIR, otlp or memory (or leave it unset)")
    return True


def disable_tracing() -> None:
    """Stop recording spans (those recorded are flushed to their exporters first)."""
    global _tracer, _provider, _memory
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None
    _memory = None


def flush_tracing() -> None:
    """Export the spans recorded so far (a process that exits calls it)."""
    if _provider is not None:
        _provider.force_flush()


def finished_spans() -> Sequence[Any]:
    """The spans kept in memory (``memory=True``), oldest first."""
    return tuple(_memory.get_finished_spans()) if _memory is not None else ()


_NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()  # stateless: shared


def span(
    name: str, attributes: Mapping[str, Any] | None = None, *, parent: Mapping[str, Any] | None = None
) -> contextlib.AbstractContextManager[Any]:
    """A span around the block (None when tracing is off, at the cost of a shared no-op).
    ``parent``: a request's context metadata carrying the caller's ``traceparent`` (the span
    joins that trace); else the current span is its parent.

    Example::

        with span("route", {"model": name}) as current:  # current is None when tracing is off
            ...
    """
    tracer = _tracer
    if tracer is None:
        return _NO_SPAN
    return _span(tracer, name, attributes, parent)


@contextlib.contextmanager
def _span(
    tracer: Any, name: str, attributes: Mapping[str, Any] | None, parent: Mapping[str, Any] | None
) -> Iterator[Any]:
    context = _propagator.extract(parent) if parent else None
    with tracer.start_as_current_span(name, context=context, attributes=dict(attributes or {})) as current:
        yield current


def inject_trace(metadata: dict[str, Any]) -> dict[str, Any]:
    """``metadata`` with the current span's ``traceparent`` added (unchanged when tracing is off)."""
    if _tracer is not None:
        _propagator.inject(metadata)
    return metadata


class JsonlSpanExporter:
    """Writes finished spans as JSON lines to ``DIR/<service>-<pid>.jsonl``: name, trace and span
    ids (hex), parent span id, service, start and end (ns since the epoch), attributes, events.

    Example::

        enable_tracing("frontend", jsonl_dir="traces/")
    """

    def __init__(self, folder: str | Path, service_name: str) -> None:
        self.path = Path(folder) / f"{service_name}-{os.getpid()}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.service_name = service_name

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = [json.dumps(self._record(s), separators=(",", ":")) for s in spans]
        with self.path.open("a") as out:
            out.write("".join(line + "\n" for line in lines))
        return SpanExportResult.SUCCESS

    def _record(self, finished: Any) -> dict[str, Any]:
        context = finished.get_span_context()
        parent = finished.parent
        return {
            "name": finished.name,
            "trace_id": f"{context.trace_id:032x}",
            "span_id": f"{context.span_id:016x}",
            "parent_span_id": f"{parent.span_id:016x}" if parent is not None else None,
            "service": self.service_name,
            "pid": os.getpid(),
            "start_ns": finished.start_time,
            "end_ns": finished.end_time,
            "attributes": dict(finished.attributes or {}),
            "events": [{"name": e.name, "time_ns": e.timestamp} for e in finished.events],
        }

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
