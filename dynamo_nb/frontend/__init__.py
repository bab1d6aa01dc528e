"""The OpenAI-compatible frontend: HTTP in, routed to the workers that registered a model.

- ``app.py``: `Frontend`, its routes (chat, completions, models, health, live, metrics) and
  the error envelope (handed to the HTTP/1.1 server under it, `dynamo_nb.http`);
- ``pipeline.py``: a generate request's steps (preprocess, admit, plan, open with retries,
  relay, write); ``relay.py``: tokens to text, what a stream ended with; ``migration.py``:
  a request carried on by another worker; ``watchdog.py``: workers that hang (silent longer than
  expected) found, their streams moved, canaries until they answer; ``writers.py``: SSE chunks or
  one JSON body; ``admission.py``: the queue in front of full workers;
- ``openai.py``: request bodies checked field by field (`parse_request`);
- ``anthropic.py``, ``responses.py``: Anthropic's Messages API (``/v1/messages``) and OpenAI's
  Responses API (``/v1/responses``, stateless), read into the same pipeline and written in their shapes;
- ``admin.py``: `AdminAuth`, who may use the admin routes (``GET``/``PATCH /router_policy``);
- ``served_models.py``: the served models, from model cards in discovery (or given in static mode),
  each with its tokenizer, client and router;
- ``config.py``: `FrontendConfig`, the frontend's settings, each field declared with its flag
  (`Frontend.start(runtime, config)` starts one), and `check_frontend_args` for a program's flags;
- ``policy_sync.py``: `PolicySync`, router policy changes shared by the processes of one group;
- ``replicas.py``: ``--http-workers N``, more frontend processes sharing the port (``SO_REUSEPORT``);
- ``request_trace.py``: ``--request-trace``, a JSON line per finished request, for replay and planning;
- ``metrics.py``: Prometheus metrics (``dynamo_frontend_*``), with ``loop_histogram.py`` (a lock-free
  histogram observed from the event loop only); ``error_envelope.py``: errors as OpenAI
  error envelopes.

Example::

    frontend = await Frontend.start(runtime, port=0)
    frontend.url                                    # 'http://127.0.0.1:41233'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .config import DEFAULT_HTTP_PORT, FrontendConfig, check_frontend_args

if TYPE_CHECKING:
    from .app import Frontend
    from .error_envelope import error_body, http_error
    from .metrics import FrontendMetrics
    from .openai import OpenAIRequest, parse_request
    from .served_models import ModelManager, ServedModel

__all__ = [
    "DEFAULT_HTTP_PORT",
    "Frontend",
    "FrontendConfig",
    "FrontendMetrics",
    "ModelManager",
    "OpenAIRequest",
    "ServedModel",
    "check_frontend_args",
    "error_body",
    "http_error",
    "parse_request",
]

# The HTTP app and what it serves load when first asked for: a worker's flags read this package's
# settings (its defaults) without loading the frontend itself.
_LAZY = {
    "Frontend": ".app",
    "FrontendMetrics": ".metrics",
    "ModelManager": ".served_models",
    "OpenAIRequest": ".openai",
    "ServedModel": ".served_models",
    "error_body": ".error_envelope",
    "http_error": ".error_envelope",
    "parse_request": ".openai",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
