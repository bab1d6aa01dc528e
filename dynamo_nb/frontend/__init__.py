"""The OpenAI-compatible frontend: HTTP in, model cards and routers to the workers.

Example:
    >>> from dynamo_nb.frontend import Frontend
    >>> frontend = await Frontend.start(runtime, port=0)      # doctest: +SKIP
    >>> frontend.url                                           # doctest: +SKIP
    'http://127.0.0.1:41233'
"""

from __future__ import annotations

from .errors import HTTPError
from .metrics import FrontendMetrics
from .models import ROUTER_MODES, ModelManager, ServedModel
from .openai import OpenAIRequest, parse_request
from .server import DEFAULT_HTTP_PORT, Frontend

__all__ = [
    "DEFAULT_HTTP_PORT",
    "ROUTER_MODES",
    "Frontend",
    "FrontendMetrics",
    "HTTPError",
    "ModelManager",
    "OpenAIRequest",
    "ServedModel",
    "parse_request",
]
