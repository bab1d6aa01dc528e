"""The HTTP server alone, in one process: CPU per request, with no sockets and no scheduler.

A connection is fed whole requests by hand (a stand-in transport takes the answers), so what is
timed is the server's own work: reading the request, routing it, answering. Three shapes:
``keep_alive`` (a JSON request and answer on one connection), ``new_connection`` (a connection
made, one request with ``Connection: close``, the connection lost), ``stream_64`` (an answer of
64 events). Prints one JSON line: microseconds of CPU per request, the median of 5 repeats.
`frontend_ab.py` runs it with each tree's code.

    python benchmarks/_http_layer.py
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

try:
    from dynamo_nb.http import ConnectionGuard, HttpServer, json_response
    from dynamo_nb.http.http_server import HttpConnection
except ImportError:  # a revision from before the server moved to dynamo_nb.http
    from dynamo_nb.frontend.connections import ConnectionGuard  # type: ignore[no-redef]
    from dynamo_nb.frontend.http1 import HttpServer, json_response  # type: ignore[no-redef]
    from dynamo_nb.frontend.http1.http_server import HttpConnection  # type: ignore[no-redef]

BODY = json.dumps(
    {"model": "tiny-llama", "messages": [{"role": "user", "content": "Tell me a story."}], "stream": True}
).encode()
HEAD = (
    "POST /{path} HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: Python/3.11 aiohttp/3.14.5\r\nAccept: */*\r\n"
    "Accept-Encoding: gzip, deflate\r\n{extra}Content-Length: {length}\r\nContent-Type: application/json\r\n\r\n"
)


def request(path: str, extra: str = "") -> bytes:
    return HEAD.format(path=path, extra=extra, length=len(BODY)).encode() + BODY


class Transport:
    """Takes what the server writes."""

    def __init__(self) -> None:
        self.closing = False

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    abort = close

    def pause_reading(self) -> None:
        pass

    resume_reading = pause_reading

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def get_extra_info(self, *args: Any) -> None:
        return None


async def answer(_request: Any) -> Any:
    return json_response({"ok": 1})


async def stream(request: Any) -> Any:
    response = request.stream({"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    for _ in range(64):
        await response.write(b'data: {"x": 1}\n\n')
    await response.write_eof(b"data: [DONE]\n\n")
    return response


async def per_request(server: HttpServer, raw: bytes, fresh: bool, n: int) -> float:
    connection = None
    started = time.process_time()
    for _ in range(n):
        if connection is None or fresh:
            connection = HttpConnection(server)
            connection.connection_made(Transport())
        connection.data_received(raw)
        if connection.task is not None:
            await connection.task
        if fresh:
            connection.connection_lost(None)
    return (time.process_time() - started) / n * 1e6


async def main() -> dict[str, float]:
    server = HttpServer({"/x": {"POST": answer}, "/s": {"POST": stream}}, ConnectionGuard())
    shapes = {
        "keep_alive": (request("x"), False, 20_000),
        "new_connection": (request("x", "Connection: close\r\n"), True, 20_000),
        "stream_64": (request("s"), False, 3_000),
    }
    result = {}
    for name, (raw, fresh, n) in shapes.items():
        await per_request(server, raw, fresh, n // 4)  # warm
        result[name] = statistics.median([await per_request(server, raw, fresh, n) for _ in range(5)])
    return result


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
