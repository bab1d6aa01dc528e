"""What a frontend sends a worker and what a worker streams back (DESIGN.md §3).

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

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import InvalidRequestError

__all__ = [
    "FINISH_REASONS",
    "LLMEngineOutput",
    "PreprocessedRequest",
    "SamplingOptions",
    "StopConditions",
    "final_item",
]

FINISH_REASONS = ("stop", "length", "error", "cancelled")


def _without_none(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in asdict(obj).items() if v is not None}


def _mapping(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{name} must be an object, got {type(value).__name__}", param=name)
    return value


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
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise InvalidRequestError("stop must be a string or a list of strings", param="stop")
        return cls(
            max_tokens=_opt_int(data, "max_tokens", minimum=1),
            stop=stop,
            ignore_eos=bool(data.get("ignore_eos", False)),
            min_tokens=_opt_int(data, "min_tokens", minimum=0) or 0,
        )


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
        return cls(
            temperature=_opt_float(data, "temperature", 0.0, 2.0),
            top_p=_opt_float(data, "top_p", 0.0, 1.0),
            top_k=None if top_k == -1 else top_k,
            seed=_opt_int(data, "seed"),
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


@dataclass
class PreprocessedRequest:
    """A tokenized request, as a frontend sends it to a worker endpoint."""

    token_ids: list[int]
    stop_conditions: StopConditions = field(default_factory=StopConditions)
    sampling_options: SamplingOptions = field(default_factory=SamplingOptions)
    eos_token_ids: list[int] = field(default_factory=list)
    model: str = ""
    routing: dict[str, Any] | None = None
    bootstrap_info: dict[str, Any] | None = None
    prefill_result: dict[str, Any] | None = None
    extra_args: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: Any) -> PreprocessedRequest:
        """Read and validate a request dict; raises `InvalidRequestError` naming the bad field."""
        if not isinstance(data, dict):
            raise InvalidRequestError(f"a request must be an object, got {type(data).__name__}")
        token_ids = data.get("token_ids")
        if (
            not isinstance(token_ids, list)
            or not token_ids
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in token_ids)
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
            bootstrap_info=data.get("bootstrap_info"),
            prefill_result=data.get("prefill_result"),
            extra_args=data.get("extra_args"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form, without fields left at None."""
        return _without_none(self)


@dataclass
class LLMEngineOutput:
    """One stream item from a worker: the new tokens, and on the last item why it ended."""

    token_ids: list[int]
    finish_reason: str | None = None
    completion_usage: dict[str, int] | None = None
    disaggregated_params: dict[str, Any] | None = None
    error: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LLMEngineOutput:
        return cls(
            token_ids=list(data.get("token_ids") or []),
            finish_reason=data.get("finish_reason"),
            completion_usage=data.get("completion_usage"),
            disaggregated_params=data.get("disaggregated_params"),
            error=data.get("error"),
        )

    def to_dict(self) -> dict[str, Any]:
        return _without_none(self)


def final_item(
    token_ids: list[int], finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """The last stream item: its tokens, why the stream ended, and the usage."""
    return {
        "token_ids": token_ids,
        "finish_reason": finish_reason,
        "completion_usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
