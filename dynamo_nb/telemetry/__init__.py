"""What a request leaves behind as it crosses processes: its id on every log line
(``request_ids.py``) and, when turned on, its timeline as OpenTelemetry spans (``tracing.py``)."""

from .request_ids import RequestIdFilter, current_request_id, request_id_scope
from .tracing import (
    TRACE_ENV,
    JsonlSpanExporter,
    disable_tracing,
    enable_tracing,
    enable_tracing_from_env,
    finished_spans,
    flush_tracing,
    inject_trace,
    span,
    tracing_enabled,
)

__all__ = [
    "TRACE_ENV",
    "JsonlSpanExporter",
    "RequestIdFilter",
    "current_request_id",
    "disable_tracing",
    "enable_tracing",
    "enable_tracing_from_env",
    "finished_spans",
    "flush_tracing",
    "inject_trace",
    "request_id_scope",
    "span",
    "tracing_enabled",
]
