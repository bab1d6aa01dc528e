"""Built-in prompt sets for load tests: random, shared system prompt, multi-turn conversations.

Every set is deterministic for a given ``seed``; text is made of English words (from the
tiny model's corpus) so token counts are realistic for any tokenizer.

Example:
    >>> from dynamo_nb.bench import random_prompts, multi_turn_prompts
    >>> prompts = random_prompts(4, words=8, seed=1)
    >>> len(prompts), len(prompts[0].text.split())
    (4, 8)
    >>> [p.name for p in multi_turn_prompts(conversations=2, turns=2, words=4)]
    ['conv0-turn0', 'conv1-turn0', 'conv0-turn1', 'conv1-turn1']
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, cast

from ..errors import ConfigError

__all__ = [
    "PROMPT_SETS",
    "Prompt",
    "as_prompts",
    "multi_turn_prompts",
    "prompt_set",
    "random_prompts",
    "shared_prefix_prompts",
]


@dataclass(frozen=True)
class Prompt:
    """One request's input: chat ``messages`` (a completion request sends them joined as text).

    Attributes:
        name: a short label recorded with each request (``random-3``, ``conv1-turn2``).
        messages: OpenAI chat messages.
        meta: anything else worth keeping (conversation, turn, …).
    """

    name: str
    messages: tuple[dict[str, str], ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The messages' contents joined with blank lines (the prompt of a completion request)."""
        return "\n\n".join(m["content"] for m in self.messages)


@cache
def _vocabulary() -> tuple[str, ...]:
    corpus = resources.files("dynamo_nb.models").joinpath("corpus.txt").read_text()
    return tuple(sorted(set(re.findall(r"[a-z]+", corpus.lower()))))


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choices(_vocabulary(), k=count))


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def random_prompts(n: int = 100, *, words: int = 64, seed: int = 0) -> list[Prompt]:
    """``n`` independent user messages of ``words`` random words each (no shared prefix)."""
    _check_positive(n=n, words=words)
    rng = random.Random(seed)
    return [Prompt(f"random-{i}", ({"role": "user", "content": _words(rng, words)},)) for i in range(n)]


def shared_prefix_prompts(
    n: int = 100, *, system_words: int = 256, user_words: int = 32, seed: int = 0
) -> list[Prompt]:
    """``n`` requests that share one long system prompt and differ in a short user message."""
    _check_positive(n=n, system_words=system_words, user_words=user_words)
    rng = random.Random(seed)
    system = {"role": "system", "content": _words(rng, system_words)}
    return [
        Prompt(f"shared-{i}", (system, {"role": "user", "content": _words(rng, user_words)}))
        for i in range(n)
    ]


def multi_turn_prompts(
    conversations: int = 8, *, turns: int = 4, words: int = 32, seed: int = 0
) -> list[Prompt]:
    """Conversations whose turn ``k`` repeats turns ``0..k-1`` (with a fixed assistant reply).

    Each request carries its conversation's whole history, so later turns share a growing
    prefix with earlier ones: the load that KV-aware routing pays off on. Ordered turn by
    turn (every conversation's first turn, then every second turn, …).
    """
    _check_positive(conversations=conversations, turns=turns, words=words)
    rng = random.Random(seed)
    histories: list[list[dict[str, str]]] = [[] for _ in range(conversations)]
    prompts = []
    for turn in range(turns):
        for conv, history in enumerate(histories):
            if turn:
                history.append({"role": "assistant", "content": _words(rng, words)})
            history.append({"role": "user", "content": _words(rng, words)})
            prompts.append(
                Prompt(f"conv{conv}-turn{turn}", tuple(history), {"conversation": conv, "turn": turn})
            )
    return prompts


PROMPT_SETS: dict[str, Callable[..., list[Prompt]]] = {
    "random": random_prompts,
    "shared-prefix": shared_prefix_prompts,
    "multi-turn": multi_turn_prompts,
}


def prompt_set(name: str, **options: int) -> list[Prompt]:
    """A built-in set by name (``random``, ``shared-prefix``, ``multi-turn``) with its options."""
    try:
        make = PROMPT_SETS[name]
    except KeyError:
        raise ConfigError(f"unknown prompt set {name!r}: use one of {', '.join(PROMPT_SETS)}") from None
    return make(**options)


def as_prompts(prompts: Iterable[Prompt | str | Sequence[dict[str, str]]] | None) -> list[Prompt]:
    """Turn strings (a user message each) or message lists into `Prompt` objects."""
    if prompts is None:
        return random_prompts(100)
    result = []
    for i, item in enumerate(prompts):
        if isinstance(item, Prompt):
            result.append(item)
        elif isinstance(item, str):
            result.append(Prompt(f"prompt-{i}", ({"role": "user", "content": item},)))
        elif isinstance(item, Sequence) and all(isinstance(m, dict) and "content" in m for m in item):
            result.append(Prompt(f"prompt-{i}", tuple(cast("Sequence[dict[str, str]]", item))))
        else:
            raise ConfigError(
                f"prompts[{i}] must be a str, a list of chat messages or a Prompt, got {item!r}"
            )
    if not result:
        raise ConfigError("prompts is empty: give at least one")
    return result
