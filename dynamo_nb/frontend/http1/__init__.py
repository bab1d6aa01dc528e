"""The frontend's HTTP/1.1 server: requests read strictly (``parser.py``), handlers given an
`HttpRequest` and answering with an `HttpResponse` or a `StreamedResponse` (``messages.py``),
connections with timeouts, a cap, pipelining and flow control (``http_server.py``: `HttpServer`).

Lean on purpose: a request costs a fraction of what a general web framework spends on it
(`benchmarks/frontend_overhead.py` part 4 measures it against bare aiohttp).

Example::

    async def live(request: HttpRequest) -> HttpResponse:
        return json_response({"status": "live"})

    server = HttpServer({"/live": {"GET": live}}, ConnectionGuard())
    await server.start("127.0.0.1", 0)
"""

from __future__ import annotations

from .http_server import Handler, HttpServer
from .messages import HttpRequest, HttpResponse, StreamedResponse, json_response
from .parser import HttpError

__all__ = [
    "Handler",
    "HttpError",
    "HttpRequest",
    "HttpResponse",
    "HttpServer",
    "StreamedResponse",
    "json_response",
]
