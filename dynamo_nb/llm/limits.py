"""What a worker accepts, checked where a request enters it, before any compute.

The frontend checks every request, but a worker's request-plane port can be reached without
it (a client of the endpoint, a stranger on the network). `RequestLimits` repeats the checks
whose failure would cost the worker: token ids outside the vocabulary, a prompt that fills the
context, a prompt plus ``max_tokens`` past it. A refused request gets an `InvalidRequestError`
(a 400 at a frontend) at once, so a million-token prompt sent straight to a prefill worker
costs its decoding, not minutes of prefill and gigabytes of memory.

Example:
    >>> from dynamo_nb.llm.protocol import PreprocessedRequest, StopConditions
    >>> limits = RequestLimits(context_length=8, vocab_size=100)
    >>> limits.check(PreprocessedRequest(token_ids=[1, 2, 3], stop_conditions=StopConditions(max_tokens=5)))
    >>> limits.check(PreprocessedRequest(token_ids=[1, 2, 3], stop_conditions=StopConditions(max_tokens=6)))
    Traceback (most recent call last):
    ...
    dynamo_nb.errors.InvalidRequestError: the model has a context of 8 tokens, but the prompt (3) plus max_tokens (6) is 9: lower max_tokens to at most 5
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidRequestError
from .card import read_json_object
from .protocol import PreprocessedRequest

__all__ = ["RequestLimits", "check_context"]


def check_context(
    prompt_tokens: int,
    max_tokens: int | None,
    context_length: int | None,
    *,
    model: str | None = None,
    prompt_param: str = "token_ids",
) -> None:
    """Refuse (`InvalidRequestError`, a 400) a prompt that fills ``context_length``, or a prompt plus
    ``max_tokens`` past it, naming the field to change (``prompt_param`` for the prompt: the
    frontend's ``messages`` or ``prompt``) and the ``model`` when given. The one context rule of the
    frontend, the workers and the engines.

    Example:
        >>> check_context(3, 5, 8)
        >>> check_context(8, None, 8, model="tiny")
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.InvalidRequestError: the prompt is 8 tokens and 'tiny' has a context of 8: shorten it
    """
    if not context_length:
        return
    who = repr(model) if model is not None else "the model"
    if prompt_tokens >= context_length:
        raise InvalidRequestError(
            f"the prompt is {prompt_tokens} tokens and {who} has a context of {context_length}: shorten it",
            param=prompt_param,
        )
    if max_tokens is not None and prompt_tokens + max_tokens > context_length:
        raise InvalidRequestError(
            f"{who} has a context of {context_length} tokens, but the prompt ({prompt_tokens}) plus max_tokens "
            f"({max_tokens}) is {prompt_tokens + max_tokens}: lower max_tokens to at most "
            f"{context_length - prompt_tokens}",
            param="max_tokens",
        )


@dataclass(frozen=True)
class RequestLimits:
    """The limits a worker checks on each request (None: not checked).

    Attributes:
        context_length: the longest prompt + output the model serves.
        vocab_size: token ids must be below it.
    """

    context_length: int | None = None
    vocab_size: int | None = None

    @classmethod
    def of_model(cls, model_path: str | Path, context_length: int | None) -> RequestLimits:
        """The limits of the model in ``model_path`` (its ``config.json`` gives the vocabulary),
        with ``context_length`` as its model card says."""
        vocab = read_json_object(Path(model_path) / "config.json").get("vocab_size")
        return cls(context_length, vocab if isinstance(vocab, int) and vocab > 0 else None)

    def check(self, request: PreprocessedRequest) -> None:
        """Refuse ``request`` (`InvalidRequestError`, naming the field) when it breaks a limit."""
        prompt = len(request.token_ids)
        if self.vocab_size is not None:
            top = max(request.token_ids)
            if top >= self.vocab_size:
                raise InvalidRequestError(
                    f"token id {top} is outside the vocabulary ({self.vocab_size} tokens)", param="token_ids"
                )
        check_context(prompt, request.stop_conditions.max_tokens, self.context_length)
