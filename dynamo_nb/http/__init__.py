"""HTTP/1.1 for the kit, in one home: the server the frontend, the status server and the test
stub listen with, and the small client the load generator sends with.

- ``parser.py``: requests (and answers) read strictly from bytes: each malformed one its 4xx
  (`HttpError`).
- ``messages.py``: what a route handler gets and gives back: `HttpRequest`, `HttpResponse`,
  `StreamedResponse`, `json_response`.
- ``http_server.py``: `HttpServer`: routes by path and method over asyncio protocols; a connection's
  requests in order, each in a task cancelled when its client leaves; timeouts, flow control, a
  connection cap; the errors it answers itself in the envelope its app hands it.
- ``connections.py``: `ConnectionGuard`: the header timeout and connection cap a server applies,
  and their counters.
- ``lean_client.py``: `LeanHttpClient`: a small HTTP/1.1 client (kept-alive connections, bodies
  handed over as they arrive), and `fetch`, one request read whole within a timeout (the kit's
  metrics scrapes and readiness waits).

It imports nothing of the kit but `dynamo_nb.errors`. Lean on purpose: a request costs a
fraction of what a general web framework spends on it (`benchmarks/frontend_overhead.py` part 4
measures it against bare aiohttp).

Example::

    async def live(request: HttpRequest) -> HttpResponse:
        return json_response({"status": "live"})

    server = HttpServer({"/live": {"GET": live}}, ConnectionGuard())
    await server.start("127.0.0.1", 0)
    async with LeanHttpClient() as client:
        answer = await client.request("GET", f"http://127.0.0.1:{server.port}/live")
"""

from __future__ import annotations

from .connections import ConnectionGuard
from .http_server import ErrorBody, Handler, HttpServer, plain_error_body
from .lean_client import HttpAnswer, LeanHttpClient, ServerAnswerError, fetch
from .messages import HttpRequest, HttpResponse, StreamedResponse, json_response
from .parser import HttpError

__all__ = [
    "ConnectionGuard",
    "ErrorBody",
    "Handler",
    "HttpAnswer",
    "HttpError",
    "HttpRequest",
    "HttpResponse",
    "HttpServer",
    "LeanHttpClient",
    "ServerAnswerError",
    "StreamedResponse",
    "fetch",
    "json_response",
    "plain_error_body",
]
