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

from ..frontend.error_envelope import error_body
from ..http import (
    ConnectionGuard,
    Handler,
    HttpRequest,
    HttpResponse,
    HttpServer,
    StreamedResponse,
    json_response,
)
from ..llm.protocol import completion_usage
from ..runtime.program import announce_ready

__all__ = ["StubServer"]

_WORKER_BASE = 0x5EED0000
_EVENTS = {"Content-Type": "text/event-stream"}


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _error(status: int, message: str, param: str | None = None) -> HttpResponse:
    """OpenAI's error envelope, the frontend's own (`dynamo_nb.frontend.error_envelope`)."""
    return json_response(error_body(status, message, param), status=status)


class _Answer:
    """The events of one streamed answer."""

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
        self.last += b"data: [DONE]\n\n"
        self.tokens = tokens


class StubServer:
    """See the module docstring. Start it with `StubServer.start`, stop it with `stop`."""

    def __init__(self, model: str, ttft: float, itl: float, workers: int, slots: int | None = None) -> None:
        """Use `StubServer.start`."""
        self.model = model
        self.ttft = ttft
        self.itl = itl
        self.slots = asyncio.Semaphore(slots) if slots else None
        self.requests = 0
        self._workers = itertools.cycle(range(_WORKER_BASE, _WORKER_BASE + workers)) if workers else None
        self._server: HttpServer | None = None
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
        routes: dict[str, dict[str, Handler]] = {
            "/v1/models": {"GET": stub._models},
            "/v1/chat/completions": {"POST": stub._chat},
            "/v1/completions": {"POST": stub._completions},
        }
        server = HttpServer(routes, ConnectionGuard(), error_body=error_body, name="the stub")
        await server.start(host, port)
        stub._server = server
        stub.url = f"http://{host}:{server.port}"
        return stub

    async def _models(self, request: HttpRequest) -> HttpResponse:
        return json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "stub"}]}
        )

    async def _chat(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        return await self._complete(request, chat=True)

    async def _completions(self, request: HttpRequest) -> HttpResponse | StreamedResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: HttpRequest, chat: bool) -> HttpResponse | StreamedResponse:
        answer_or_error = self.answer_for(request.body, chat)
        if isinstance(answer_or_error, HttpResponse):
            return answer_or_error
        answer, stream = answer_or_error
        if not stream:
            text = " tok" * answer.tokens
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text}
            )
            return json_response({"choices": [choice], "usage": {"completion_tokens": answer.tokens}})
        if self.ttft == 0 and self.itl == 0 and self.slots is None:  # the whole answer in one write
            return HttpResponse(answer.first + answer.token * answer.tokens + answer.last, headers=_EVENTS)
        response = request.stream(_EVENTS)
        await response.write(answer.first)
        async with self.slots if self.slots is not None else contextlib.nullcontext():
            await asyncio.sleep(self.ttft)
            for i in range(answer.tokens):
                if i:
                    await asyncio.sleep(self.itl)
                await response.write(answer.token)
        await response.write_eof(answer.last)
        return response

    def answer_for(self, body: bytes, chat: bool) -> tuple[_Answer, bool] | HttpResponse:
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
            await self._server.stop(grace=0)
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
