"""Check an engine against the `Engine` contract from a notebook cell, before serving it.

`check_engine` runs the contract's checks on a built engine — the stream's shape and usage,
``max_tokens``, repeatable greedy output, a stopped context, a closed stream, interleaving,
the context limit, what it declares — and returns a `ConformanceReport`: one row per check,
passed, failed (with what went wrong) or skipped (with why). The full suite every engine of
the kit passes is ``tests/test_engine_conformance.py``; these are its checks that any engine can
run on its own, with no test runner.

Example:
    >>> import asyncio
    >>> from dynamo_nb.engines import EchoEngine
    >>> report = asyncio.run(check_engine(EchoEngine(context_length=256)))
    >>> report.passed, len(report.results) > 5
    (True, True)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequestError
from ..llm.protocol import (
    LLMEngineOutput,
    PreprocessedRequest,
    SamplingOptions,
    StopConditions,
    completion_usage,
)
from ..runtime.context import Context
from ..runtime.streams import close_stream, closing
from .base import Engine

__all__ = ["CheckResult", "ConformanceReport", "check_engine"]

DEFAULT_PROMPT = tuple(range(10, 50))  # 40 tokens: more than one KV block at the usual block sizes


class _Skip(Exception):
    """A check that does not apply to this engine (the message says why)."""


@dataclass(frozen=True)
class CheckResult:
    """One check: its name, ``passed`` / ``failed`` / ``skipped``, and what went wrong or why it was skipped."""

    name: str
    status: str
    detail: str = ""


@dataclass
class ConformanceReport:
    """The results of `check_engine`, one per check; shown as a table (in a notebook, too)."""

    engine: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when no check failed."""
        return all(result.status != "failed" for result in self.results)

    @property
    def failed(self) -> list[CheckResult]:
        return [result for result in self.results if result.status == "failed"]

    def __str__(self) -> str:
        width = max(len(result.name) for result in self.results)
        lines = [f"{self.engine}: {'conforms' if self.passed else f'{len(self.failed)} check(s) failed'}"]
        for result in self.results:
            detail = f"  ({result.detail})" if result.detail else ""
            lines.append(f"  {result.status:<7} {result.name:<{width}}{detail}".rstrip())
        return "\n".join(lines)

    __repr__ = __str__


async def check_engine(
    engine: Engine, *, prompt: list[int] | tuple[int, ...] = DEFAULT_PROMPT, timeout: float = 60.0
) -> ConformanceReport:
    """Run the contract's checks on ``engine`` (built, not served) with ``prompt`` (token ids in
    its vocabulary); each check has ``timeout`` seconds. Nothing raises for a failed check: read
    `ConformanceReport.passed` and its rows."""
    checks = _Checks(engine, list(prompt))
    report = ConformanceReport(type(engine).__name__)
    for name, check in checks.all():
        try:
            await asyncio.wait_for(check(), timeout)
        except _Skip as skip:
            report.results.append(CheckResult(name, "skipped", str(skip)))
        except asyncio.TimeoutError:
            report.results.append(CheckResult(name, "failed", f"no answer within {timeout:g} s"))
        except Exception as exc:
            detail = str(exc) or type(exc).__name__
            report.results.append(CheckResult(name, "failed", f"{type(exc).__name__}: {detail}"))
        else:
            report.results.append(CheckResult(name, "passed"))
    return report


class _Checks:
    """The checks, each a coroutine that raises when the engine breaks the contract."""

    def __init__(self, engine: Engine, prompt: list[int]) -> None:
        self.engine = engine
        self.prompt = prompt

    def all(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        return [
            ("declares max_num_seqs, block_size, context_length, active", self.declares),
            ("streams tokens, then one final item with usage", self.final_item),
            ("max_tokens ends the stream with length", self.max_tokens),
            ("greedy sampling repeats itself", self.greedy),
            ("a request without sampling options streams (temperature None is 1)", self.defaults),
            ("a stopped context ends the stream with cancelled", self.stopped),
            ("closing a stream frees its request", self.closed),
            ("concurrent requests interleave", self.interleave),
            ("a prompt past the context is refused", self.context),
            ("stats() is a dict, kv_snapshot() a list", self.counters),
        ]

    def request(
        self,
        max_tokens: int,
        *,
        prompt: list[int] | None = None,
        sampling: SamplingOptions | None = None,  # None: greedy
    ) -> PreprocessedRequest:
        return PreprocessedRequest(
            token_ids=list(self.prompt if prompt is None else prompt),
            stop_conditions=StopConditions(max_tokens=max_tokens, ignore_eos=True),
            sampling_options=sampling or SamplingOptions(temperature=0.0),
        )

    async def run(self, request: PreprocessedRequest, context: Context | None = None) -> list[Any]:
        async with closing(self.engine.generate(request, context)) as stream:
            items = [item async for item in stream]
        for item in items:
            if not isinstance(item, LLMEngineOutput):
                raise AssertionError(
                    f"generate yielded a {type(item).__name__} ({item!r:.80}): yield LLMEngineOutput(token_ids=[...]) "
                    "(from dynamo_nb.llm) for each new token, and LLMEngineOutput.final(...) last"
                )
        return items

    async def idle(self, timeout: float = 10.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.engine.active:
            if loop.time() > deadline:
                raise AssertionError(f"it still counts {self.engine.active} active request(s)")
            await asyncio.sleep(0.02)

    async def declares(self) -> None:
        for name in ("max_num_seqs", "block_size", "context_length"):
            value = getattr(self.engine, name, "missing")
            if value is not None and not (isinstance(value, int) and value > 0):
                raise AssertionError(f"{name} is {value!r}: a positive int, or None")
        if not isinstance(self.engine.active, int) or self.engine.active != 0:
            raise AssertionError(f"active is {self.engine.active!r} while idle: an int, 0")

    async def final_item(self) -> None:
        *middle, last = await self.run(self.request(6))
        if any(item.finish_reason is not None for item in middle):
            raise AssertionError("an item before the last has a finish_reason")
        usage = last.completion_usage or {}
        tokens = sum(len(item.token_ids) for item in [*middle, last])
        expected = completion_usage(len(self.prompt), tokens)
        counts = {key: usage.get(key) for key in expected}
        if last.finish_reason is None or counts != expected:
            raise AssertionError(
                f"the last item is {last.to_dict()}: want a finish_reason and usage {expected}"
            )
        details = usage.get("prompt_tokens_details")
        if details is not None:
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            if not (isinstance(cached, int) and 0 <= cached <= len(self.prompt)):
                raise AssertionError(
                    f"usage.prompt_tokens_details is {details!r}: want {{'cached_tokens': N}}, "
                    f"0 <= N <= the prompt's {len(self.prompt)} tokens"
                )

    async def max_tokens(self) -> None:
        for limit in (1, 3):
            items = await self.run(self.request(limit))
            tokens = sum(len(item.token_ids) for item in items)
            if tokens != limit or items[-1].finish_reason != "length":
                raise AssertionError(
                    f"max_tokens={limit}: {tokens} tokens, finish_reason {items[-1].finish_reason!r}"
                )

    async def greedy(self) -> None:
        runs = [[t for item in await self.run(self.request(8)) for t in item.token_ids] for _ in range(2)]
        if runs[0] != runs[1]:
            raise AssertionError(f"temperature 0 gave {runs[0]} then {runs[1]}")

    async def defaults(self) -> None:
        items = await self.run(self.request(3, sampling=SamplingOptions()))
        tokens = sum(len(item.token_ids) for item in items)
        if tokens != 3 or items[-1].finish_reason != "length":
            raise AssertionError(
                f"with SamplingOptions() (what a client that sends no temperature gets): {tokens} tokens, "
                f"finish_reason {items[-1].finish_reason!r}; sample at temperature 1 when it is None"
            )

    async def stopped(self) -> None:
        context = Context()
        items = []
        async with closing(self.engine.generate(self.request(200), context)) as stream:
            async for item in stream:
                items.append(item)
                if len(items) == 2:
                    context.stop_generating()
        if items[-1].finish_reason != "cancelled" or len(items) > 10:
            raise AssertionError(f"after a stop: {len(items)} items, the last {items[-1].to_dict()}")
        await self.idle()

    async def closed(self) -> None:
        stream = self.engine.generate(self.request(200))
        await anext(stream)
        await close_stream(stream)
        await self.idle()

    async def interleave(self) -> None:
        finished: list[str] = []

        async def one(name: str, max_tokens: int) -> None:
            await self.run(self.request(max_tokens))
            finished.append(name)

        await asyncio.gather(one("long", 64), one("short", 3))
        if finished != ["short", "long"]:
            raise AssertionError("a 3-token request ended after a 64-token one started with it")

    async def context(self) -> None:
        limit = self.engine.context_length
        if limit is None:
            raise _Skip("it declares no context_length")
        yielded = 0
        try:
            async with closing(
                self.engine.generate(self.request(4, prompt=[self.prompt[0]] * limit))
            ) as stream:
                async for _ in stream:
                    yielded += 1
        except InvalidRequestError:
            if yielded:  # the frontend could no longer answer 400: the client already had a 200
                raise AssertionError(
                    f"a {limit}-token prompt was refused only after {yielded} item(s) of output: refuse "
                    "before the first item. A wrapper that yields something of its own must first take "
                    "the inner stream's first item (await anext(stream): the inner engine refuses there), "
                    "then yield its own"
                ) from None
            return
        raise AssertionError(
            f"a {limit}-token prompt (its whole context) was not refused with InvalidRequestError"
        )

    async def counters(self) -> None:
        stats, snapshot = self.engine.stats(), self.engine.kv_snapshot()
        if not isinstance(stats, dict) or not isinstance(snapshot, list):
            raise AssertionError(
                f"stats() gave {type(stats).__name__}, kv_snapshot() {type(snapshot).__name__}"
            )
