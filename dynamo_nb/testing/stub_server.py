"""A stub OpenAI-compatible server with injected delays, for calibrating the load generator.

It answers ``POST /v1/chat/completions`` and ``/v1/completions`` (streamed or not) with
``max_tokens`` tokens: the first after ``ttft`` seconds, the next ones ``itl`` seconds
apart. With both at 0 it is a zero-cost server (the whole answer in one write), so a load
test against it measures the load generator alone. With ``slots=N`` it streams at most N
answers at once and the others wait their turn (a server of known capacity: N / the time of
one answer), so its latency under load is known in advance. It checks what it is sent (model,
messages or prompt, max_tokens) and answers mistakes with OpenAI error envelopes. With
``workers=N`` it reports ``nvext.worker_id`` round-robin over N ids, like our frontend.

    python -m dynamo_nb.testing.stub_server --ttft 0.05 --itl 0.01    # prints READY stub url=http://…

Example::

    async with await StubServer.start(ttft=0.05, itl=0.01) as stub:
        df = await bench.run(stub.url, "stub", concurrency=[1, 4])
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import signal
import sys
from typing import Any

from ..llm.protocol import completion_usage
from ..runtime.program import announce_ready

__all__ = ["StubServer"]

_STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_WORKER_BASE = 0x5EED0000


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: Any) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _json_response(status: int, body: Any) -> bytes:
    data = json.dumps(body).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def _error(status: int, message: str, param: str | None = None) -> bytes:
    kind = "invalid_request_error" if status < 500 else "internal_error"
    return _json_response(
        status, {"error": {"message": message, "type": kind, "param": param, "code": status}}
    )


class _Answer:
    """The pieces of one streamed answer."""

    def __init__(self, chat: bool, model: str, tokens: int, usage: bool, worker: int | None) -> None:
        head = {
            "id": "stub",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "model": model,
        }
        self.first = (
            _event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            if chat
            else b""
        )
        token = {"index": 0, "delta": {"content": " tok"}} if chat else {"index": 0, "text": " tok"}
        self.token = _event({**head, "choices": [{**token, "finish_reason": None}]})
        finish: dict[str, Any] = {**head, "choices": [{"index": 0, "finish_reason": "length"}]}
        if worker is not None:
            finish["nvext"] = {"worker_id": {"prefill_worker_id": None, "decode_worker_id": worker}}
        self.last = _event(finish)
        if usage:
            counts = completion_usage(8, tokens)
            self.last += _event({**head, "choices": [], "usage": counts})
        self.last += _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        self.tokens = tokens


class _Connection(asyncio.Protocol):
    """HTTP/1.1 keep-alive, one request at a time (no pipelining needed by clients)."""

    def __init__(self, server: StubServer) -> None:
        self.server = server
        self.buffer = b""
        self.busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream connection's transport is an asyncio.Transport
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next()

    def _next(self) -> None:
        while not self.busy and self.transport is not None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buffer[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
            method, path = ([*lines[0].split(" "), "", ""])[:2]
            self._handle(method, path, body)

    def _handle(self, method: str, path: str, body: bytes) -> None:
        server, transport = self.server, self.transport
        assert transport is not None
        if path == "/v1/models" and method == "GET":
            models = {"object": "list", "data": [{"id": server.model, "object": "model", "owned_by": "stub"}]}
            transport.write(_json_response(200, models))
            return
        if path not in ("/v1/chat/completions", "/v1/completions"):
            transport.write(_error(404, f"no route {path}"))
            return
        if method != "POST":
            transport.write(_error(405, f"{path} takes POST"))
            return
        chat = path.endswith("chat/completions")
        answer_or_error = server.answer_for(body, chat)
        if isinstance(answer_or_error, bytes):
            transport.write(answer_or_error)
            return
        answer, stream = answer_or_error
        if not stream:
            text = " tok" * answer.tokens
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text}
            )
            transport.write(
                _json_response(200, {"choices": [choice], "usage": {"completion_tokens": answer.tokens}})
            )
            return
        if server.ttft == 0 and server.itl == 0 and server.slots is None:
            transport.write(_STREAM_HEAD + answer.first + answer.token * answer.tokens + answer.last)
            return
        self.busy = True
        asyncio.get_running_loop().create_task(self._stream(answer))

    async def _stream(self, answer: _Answer) -> None:
        server = self.server
        try:
            self._write(_STREAM_HEAD + answer.first)
            async with server.slots if server.slots is not None else contextlib.nullcontext():
                await asyncio.sleep(server.ttft)
                for i in range(answer.tokens):
                    if i:
                        await asyncio.sleep(server.itl)
                    self._write(answer.token)
            self._write(answer.last)
        finally:
            self.busy = False
        self._next()

    def _write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)


class StubServer:
    """See the module docstring. Start it with `StubServer.start`, stop it with `stop`."""

    def __init__(self, model: str, ttft: float, itl: float, workers: int, slots: int | None = None) -> None:
        """Use `StubServer.start`."""
        self.model = model
        self.ttft = ttft
        self.itl = itl
        self.slots = asyncio.Semaphore(slots) if slots else None
        self.requests = 0
        self.connections: set[_Connection] = set()
        self._workers = itertools.cycle(range(_WORKER_BASE, _WORKER_BASE + workers)) if workers else None
        self._server: asyncio.base_events.Server | None = None
        self.url = ""

    @classmethod
    async def start(
        cls,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "stub",
        ttft: float = 0.0,
        itl: float = 0.0,
        workers: int = 1,
        slots: int | None = None,
    ) -> StubServer:
        """Listen on ``host:port`` (0: a free port); ``url`` says where. ``slots``: answers
        streamed at once (None: no limit)."""
        stub = cls(model, ttft, itl, workers, slots)
        stub._server = await asyncio.get_running_loop().create_server(lambda: _Connection(stub), host, port)
        bound = stub._server.sockets[0].getsockname()
        stub.url = f"http://{bound[0]}:{bound[1]}"
        return stub

    def answer_for(self, body: bytes, chat: bool) -> tuple[_Answer, bool] | bytes:
        """The answer to a request body, or an encoded 4xx error that says what to change."""
        try:
            request = json.loads(body)
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(request, dict):
            return _error(400, "the body must be a JSON object")
        if request.get("model") != self.model:
            return _error(
                404, f"model {request.get('model')!r} not found: this stub serves {self.model!r}", "model"
            )
        field = "messages" if chat else "prompt"
        if not request.get(field):
            return _error(400, f"{field} is required", field)
        tokens = request.get("max_tokens", 16)
        if not isinstance(tokens, int) or tokens < 1:
            return _error(400, f"max_tokens must be a positive integer, got {tokens!r}", "max_tokens")
        self.requests += 1
        asked = (request.get("nvext") or {}).get("extra_fields") or ()
        worker = next(self._workers) if self._workers is not None and "worker_id" in asked else None
        usage = bool((request.get("stream_options") or {}).get("include_usage"))
        return _Answer(chat, self.model, tokens, usage, worker), bool(request.get("stream"))

    async def stop(self) -> None:
        """Stop listening and close the connections."""
        if self._server is not None:
            self._server.close()
            for connection in list(self.connections):
                if connection.transport is not None:
                    connection.transport.close()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> StubServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_nb.testing.stub_server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=0, help="port (default: 0, a free one)")
    parser.add_argument("--model", default="stub", help="the model name it serves (default: %(default)s)")
    parser.add_argument(
        "--ttft", type=float, default=0.0, help="seconds before the first token (default: %(default)s)"
    )
    parser.add_argument(
        "--itl", type=float, default=0.0, help="seconds between tokens (default: %(default)s)"
    )
    parser.add_argument("--workers", type=int, default=1, help="worker ids to report (default: %(default)s)")
    args = parser.parse_args(argv)
    stub = await StubServer.start(
        host=args.host, port=args.port, model=args.model, ttft=args.ttft, itl=args.itl, workers=args.workers
    )
    announce_ready("stub", url=stub.url, model=stub.model)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await stub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main()))
