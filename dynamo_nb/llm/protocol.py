"""What a frontend sends a worker and what a worker streams back (docs/design.md §3).

Requests and outputs travel as plain JSON-able dicts (msgpack on the wire); these dataclasses
build, validate and read them. Unknown fields are tolerated, so a newer frontend can talk to
an older worker.

Example:
    >>> request = PreprocessedRequest(token_ids=[5, 6, 7], stop_conditions=StopConditions(max_tokens=4))
    >>> PreprocessedRequest.from_dict(request.to_dict()).stop_conditions.max_tokens
    4
    >>> LLMEngineOutput.from_dict({"token_ids": [9], "finish_reason": "length"}).finish_reason
    'length'
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import InvalidRequestError
from .bootstrap_info import BootstrapInfo, PrefillResult
from .guided import GuidedDecoding

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "FINISH_REASONS",
    "EmittingStream",
    "LLMEngineOutput",
    "PreprocessedRequest",
    "SamplingOptions",
    "StopConditions",
    "completion_usage",
]

FINISH_REASONS = ("stop", "length", "error", "cancelled")

DEFAULT_MAX_TOKENS = 16
"""Tokens generated for a request that names no ``max_tokens`` where nothing else bounds it (no
context length): OpenAI's and vLLM's default for completions."""


def _mapping(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{name} must be an object, got {type(value).__name__}", param=name)
    return value


MAX_STOP_SEQUENCES = 4  # as OpenAI
SEED_RANGE = (-(2**63), 2**64 - 1)  # as vLLM


def _opt_int(data: dict[str, Any], key: str, *, minimum: int | None = None) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{key} must be an integer, got {value!r}", param=key)
    if minimum is not None and value < minimum:
        raise InvalidRequestError(f"{key} must be at least {minimum}, got {value}", param=key)
    return value


def _opt_float(data: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(f"{key} must be a number, got {value!r}", param=key)
    if not low <= value <= high:
        raise InvalidRequestError(f"{key} must be between {low:g} and {high:g}, got {value}", param=key)
    return float(value)


def _optional(parse: Any, value: Any, what: str) -> Any:
    return None if value is None else parse(value, what)


@dataclass
class StopConditions:
    """When generation ends: ``max_tokens`` new tokens, a ``stop`` string, or an eos token."""

    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0

    @classmethod
    def from_dict(cls, data: Any) -> StopConditions:
        data = _mapping(data, "stop_conditions")
        stop = data.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise InvalidRequestError("stop must be a non-empty string or a list of them", param="stop")
        if len(stop) > MAX_STOP_SEQUENCES:
            raise InvalidRequestError(
                f"stop takes at most {MAX_STOP_SEQUENCES} sequences, got {len(stop)}", param="stop"
            )
        conditions = cls(
            max_tokens=_opt_int(data, "max_tokens", minimum=1),
            stop=stop,
            ignore_eos=bool(data.get("ignore_eos", False)),
            min_tokens=_opt_int(data, "min_tokens", minimum=0) or 0,
        )
        if conditions.max_tokens is not None and conditions.min_tokens > conditions.max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({conditions.min_tokens}) is more than max_tokens ({conditions.max_tokens}): "
                "lower min_tokens",
                param="min_tokens",
            )
        return conditions

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ignore_eos": self.ignore_eos, "min_tokens": self.min_tokens}
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        if self.stop:
            out["stop"] = self.stop
        return out


@dataclass
class SamplingOptions:
    """How the next token is picked: ``temperature`` 0 (or ``top_k`` 1) is greedy; None means 1.0."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None

    @classmethod
    def from_dict(cls, data: Any) -> SamplingOptions:
        data = _mapping(data, "sampling_options")
        top_k = _opt_int(data, "top_k", minimum=-1)
        if top_k == 0:
            raise InvalidRequestError("top_k must be -1 (off) or at least 1, got 0", param="top_k")
        seed = _opt_int(data, "seed")
        if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
            raise InvalidRequestError(
                f"seed must be between {SEED_RANGE[0]} and {SEED_RANGE[1]}, got {seed}", param="seed"
            )
        return cls(
            temperature=_opt_float(data, "temperature", 0.0, 2.0),
            top_p=_opt_float(data, "top_p", 0.0, 1.0),
            top_k=None if top_k == -1 else top_k,
            seed=seed,
        )

    def to_dict(self) -> dict[str, Any]:
        fields = (
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("top_k", self.top_k),
            ("seed", self.seed),
        )
        return {name: value for name, value in fields if value is not None}

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


_INT = {int}


@dataclass
class PreprocessedRequest:
    """A tokenized request, as a frontend sends it to a worker endpoint.

    ``bootstrap_info`` (the fast path: where the decode fetches its KV, the room drawn by the
    router) and ``prefill_result`` (the fallback path: what the prefill handed back) are typed,
    parsed once by `from_dict` where the request enters a process."""

    token_ids: list[int]
    stop_conditions: StopConditions = field(default_factory=StopConditions)
    sampling_options: SamplingOptions = field(default_factory=SamplingOptions)
    eos_token_ids: list[int] = field(default_factory=list)
    model: str = ""
    routing: dict[str, Any] | None = None
    bootstrap_info: BootstrapInfo | None = None
    prefill_result: PrefillResult | None = None
    extra_args: dict[str, Any] | None = None
    guided_decoding: GuidedDecoding | None = None  # structured output (`dynamo_nb.llm.guided`)

    @classmethod
    def from_dict(cls, data: Any) -> PreprocessedRequest:
        """Read and validate a request dict; raises `InvalidRequestError` naming the bad field
        (`DisaggregationError` for a malformed ``bootstrap_info`` or ``prefill_result``)."""
        if not isinstance(data, dict):
            raise InvalidRequestError(f"a request must be an object, got {type(data).__name__}")
        token_ids = data.get("token_ids")
        if (
            not isinstance(token_ids, list)
            or not token_ids
            or set(map(type, token_ids)) != _INT  # ints only (not bools), checked at C speed
            or min(token_ids) < 0
        ):
            raise InvalidRequestError(
                "token_ids must be a non-empty list of token ids (ints ≥ 0)", "token_ids"
            )
        eos = data.get("eos_token_ids") or []
        if not isinstance(eos, list) or not all(isinstance(t, int) for t in eos):
            raise InvalidRequestError("eos_token_ids must be a list of ints", param="eos_token_ids")
        return cls(
            token_ids=token_ids,
            stop_conditions=StopConditions.from_dict(data.get("stop_conditions")),
            sampling_options=SamplingOptions.from_dict(data.get("sampling_options")),
            eos_token_ids=eos,
            model=str(data.get("model") or ""),
            routing=data.get("routing"),
            bootstrap_info=_optional(BootstrapInfo.parse, data.get("bootstrap_info"), "bootstrap_info"),
            prefill_result=_optional(PrefillResult.parse, data.get("prefill_result"), "prefill_result"),
            extra_args=data.get("extra_args"),
            guided_decoding=None
            if data.get("guided_decoding") is None
            else GuidedDecoding.parse(data["guided_decoding"]),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form (what travels to the worker), without optional fields left at None."""
        out: dict[str, Any] = {
            "token_ids": self.token_ids,
            "stop_conditions": self.stop_conditions.to_dict(),
            "sampling_options": self.sampling_options.to_dict(),
            "eos_token_ids": self.eos_token_ids,
            "model": self.model,
        }
        if self.routing is not None:
            out["routing"] = self.routing
        if self.bootstrap_info is not None:
            out["bootstrap_info"] = self.bootstrap_info.to_dict()
        if self.prefill_result is not None:
            out["prefill_result"] = self.prefill_result.to_dict()
        if self.extra_args is not None:
            out["extra_args"] = self.extra_args
        if self.guided_decoding is not None:
            out["guided_decoding"] = self.guided_decoding.to_dict()
        return out

    def with_max_tokens(self, max_tokens: int) -> PreprocessedRequest:
        """A copy whose ``stop_conditions.max_tokens`` is ``max_tokens`` (a prefill asks for 1).

        Example:
            >>> PreprocessedRequest(token_ids=[1]).with_max_tokens(1).stop_conditions.max_tokens
            1
        """
        return replace(self, stop_conditions=replace(self.stop_conditions, max_tokens=max_tokens))

    def continued(self, generated: list[int]) -> PreprocessedRequest:
        """The request that carries on after ``generated`` (a stream's tokens so far), for
        another worker: the prompt plus those tokens, ``max_tokens`` and ``min_tokens`` less
        them, no prefill result or instance pin of the first attempt.

        Example:
            >>> r = PreprocessedRequest([1, 2], StopConditions(max_tokens=10, min_tokens=4))
            >>> c = r.continued([7, 8, 9])
            >>> c.token_ids, c.stop_conditions.max_tokens, c.stop_conditions.min_tokens
            ([1, 2, 7, 8, 9], 7, 1)
        """
        stop = self.stop_conditions
        return replace(
            self,
            token_ids=[*self.token_ids, *generated],
            stop_conditions=replace(
                stop,
                max_tokens=None if stop.max_tokens is None else stop.max_tokens - len(generated),
                min_tokens=max(0, stop.min_tokens - len(generated)),
            ),
            routing=None,
            bootstrap_info=None,
            prefill_result=None,
            guided_decoding=None
            if self.guided_decoding is None
            else self.guided_decoding.continued(len(generated)),  # its grammar goes on from there
        )


def completion_usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
) -> dict[str, Any]:
    """OpenAI's ``usage`` object, with ``prompt_tokens_details.cached_tokens`` (the prompt tokens
    whose KV the engine reused) when it is known: what an engine's last item carries and what the
    frontend's answer says.

    Example:
        >>> completion_usage(3, 4)
        {'prompt_tokens': 3, 'completion_tokens': 4, 'total_tokens': 7}
        >>> completion_usage(40, 4, cached_tokens=32)["prompt_tokens_details"]
        {'cached_tokens': 32}
    """
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if cached_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return usage


@dataclass(slots=True)
class LLMEngineOutput:
    """One stream item from a worker: the new tokens, and on the last item why it ended.

    Example:
        >>> LLMEngineOutput.final([7], "length", prompt_tokens=3, completion_tokens=4).to_dict()["completion_usage"]
        {'prompt_tokens': 3, 'completion_tokens': 4, 'total_tokens': 7}
    """

    token_ids: list[int]
    finish_reason: str | None = None
    completion_usage: dict[str, Any] | None = None
    disaggregated_params: dict[str, Any] | None = None
    error: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LLMEngineOutput:
        """Read a stream item (unknown fields are ignored)."""
        get = data.get
        return cls(
            get("token_ids") or [],
            get("finish_reason"),
            get("completion_usage"),
            get("disaggregated_params"),
            get("error"),
        )

    @classmethod
    def final(
        cls,
        token_ids: list[int],
        finish_reason: str,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int | None = None,
    ) -> LLMEngineOutput:
        """The last item of a stream: its tokens, why it ended, and the usage (with OpenAI's
        ``prompt_tokens_details.cached_tokens``, the prompt tokens whose KV the engine reused,
        when it says).

        Example:
            >>> LLMEngineOutput.final([7], "stop", prompt_tokens=40, completion_tokens=2, cached_tokens=32
            ...                       ).completion_usage["prompt_tokens_details"]
            {'cached_tokens': 32}
        """
        return cls(
            token_ids, finish_reason, completion_usage(prompt_tokens, completion_tokens, cached_tokens)
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form (what travels back), without fields left at None."""
        out: dict[str, Any] = {"token_ids": self.token_ids}
        if self.finish_reason is not None:
            out["finish_reason"] = self.finish_reason
        if self.completion_usage is not None:
            out["completion_usage"] = self.completion_usage
        if self.disaggregated_params is not None:
            out["disaggregated_params"] = self.disaggregated_params
        if self.error is not None:
            out["error"] = self.error
        return out


class EmittingStream(abc.ABC):
    """An engine's output stream that can also send its outputs itself (a base class: the
    check is one ``isinstance`` per request).

    ``await stream.emit_to(emit)`` calls ``emit(output.to_dict())`` for each `LLMEngineOutput`
    as the engine produces it (from the engine's own step: no task woken per token) and returns
    after the last one, or raises what iterating would have raised (or what ``emit`` raised:
    that stream ends, the others go on). The items are exactly those iterating the stream gives.
    `dynamo_nb.llm.engine_handler` with ``emit=True`` (as `dynamo_nb.llm.serve_llm` serves)
    uses it when a server of ours gave the handler's context an ``emit``; everything else
    iterates the stream.

    Example:
        >>> from dynamo_nb.engines import EchoEngine, MockerEngine
        >>> request = PreprocessedRequest([1, 2])
        >>> isinstance(MockerEngine().generate(request), EmittingStream)
        True
        >>> isinstance(EchoEngine().generate(request), EmittingStream)
        False
    """

    __slots__ = ()

    def __aiter__(self) -> EmittingStream:
        return self

    @abc.abstractmethod
    def __anext__(self) -> Awaitable[LLMEngineOutput]:
        """The next output, as iterating any engine stream gives it."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Leave early: the engine frees the request."""

    @abc.abstractmethod
    async def emit_to(self, emit: Callable[[dict[str, Any]], None]) -> None:
        """Send every output's dict through ``emit`` as the engine produces it; return after the last."""
