"""A prompt's pieces between special tokens, each tokenized once.

A tokenizer splits a text at its added tokens (``<|im_start|>``, ``<|im_end|>``…) before it does
anything else, so the ids of a text are the ids of its pieces, in order, with each added token's
id between them. A chat prompt is mostly pieces seen before: the system prompt, every earlier
turn of the conversation (an agent resends its whole history each turn), the template's role
names. `SegmentCache` remembers each piece's ids (the least recently used go past
`MAX_CACHED_TOKENS`), so only what is new is tokenized: tokenizing costs ~0.5 µs a token with
``tokenizers``' byte-level BPE, a 50,000-token history 25 ms a turn. A text shorter than
`MIN_CHARS` is tokenized whole: splitting a new one costs ~1.5 µs more than it saves.

It is used only where it is exact: `SegmentCache.for_tokenizer` checks the pieces' ids against
the tokenizer's own on probe texts (pieces with and without spaces or new lines beside added
tokens, added tokens side by side) and declines a tokenizer whose pieces depend on their
neighbours (an added token that strips the spaces beside it or matches only whole words, a
normalizer that runs before added tokens are found, a pre-tokenizer that marks only the first
piece). One encode in `CHECK_EVERY` is also compared with the tokenizer's own; a difference turns
the cache off for good, with a warning.

Example:
    >>> from dynamo_nb.llm.tokenizer import ModelTokenizer
    >>> from dynamo_nb.models import tiny_model_path
    >>> tokenizer = ModelTokenizer.load(tiny_model_path()).tokenizer
    >>> cache = SegmentCache.for_tokenizer(tokenizer, min_chars=0)
    >>> prompt = "<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n"
    >>> cache.encode(prompt) == tokenizer.encode(prompt).ids
    True
"""

from __future__ import annotations

import logging
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["CHECK_EVERY", "MAX_CACHED_TOKENS", "MIN_CHARS", "PROBES", "SegmentCache", "fast_encoder"]

logger = logging.getLogger("dynamo_nb.llm")

MAX_CACHED_TOKENS = 1_000_000  # ids kept in all (4 bytes each), the least recently used dropped first
CHECK_EVERY = 256  # one encode in this many is compared with the tokenizer's own
MIN_CHARS = 1024  # a shorter text is tokenized whole: its pieces would save less than they cost
PROBES = (
    "",
    "hello world",
    " hello  world ",
    "{0}",
    "{0}{1}",
    "{0} user\nhi{1}\n",
    "{0}user\n hi there {1}\n{0}assistant\n",
    "text{0}text {1} text\n\n{0}",
    "  {0}  \n{1}\t{0}é ü 😀 {1}",
    "{1}{0}{1}end",
)
"""Texts a cache must tokenize exactly as the tokenizer does (``{0}``, ``{1}``: its first two
added tokens), or it is not used."""


def fast_encoder(tokenizer: Any) -> Callable[[list[str], bool], list[list[int]]]:
    """A function giving the ids of several texts in one call, without the character offsets a
    plain ``encode`` also tracks (a third less time on a long text, the same ids)."""
    fast = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch  # tokenizers ≥ 0.21

    def encode(texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        return [encoding.ids for encoding in fast(texts, add_special_tokens=add_special_tokens)]

    return encode


class SegmentCache:
    """The ids of each piece of text between a tokenizer's added tokens, remembered (at most
    ``max_tokens`` of them, the least recently used dropped first) of texts of ``min_chars`` or
    more. Build one with `for_tokenizer`; its `encode` answers what ``tokenizer.encode(text).ids``
    would. Safe to share between threads."""

    __slots__ = (
        "_added",
        "_batch",
        "_ids",
        "_lock",
        "_prefix",
        "_split",
        "_suffix",
        "_tokenizer",
        "check_every",
        "enabled",
        "encodes",
        "max_tokens",
        "min_chars",
        "tokenized_chars",
        "tokens",
    )

    def __init__(
        self,
        tokenizer: Any,
        added: dict[str, int],
        wrap: tuple[list[int], list[int]],
        *,
        max_tokens: int = MAX_CACHED_TOKENS,
        check_every: int = CHECK_EVERY,
        min_chars: int = MIN_CHARS,
    ) -> None:
        """Use `for_tokenizer`: it finds ``added`` (each added token's text and id) and ``wrap``
        (the ids the tokenizer puts before and after a text with its special tokens on) and checks
        that the pieces' ids are exact."""
        self._tokenizer = tokenizer
        self._batch = fast_encoder(tokenizer)
        self._added = added
        longest_first = sorted(added, key=len, reverse=True)
        pattern = "(" + "|".join(map(re.escape, longest_first)) + ")" if added else None
        self._split: Callable[[str], list[str]] = (
            re.compile(pattern).split if pattern else lambda text: [text]
        )
        self._prefix, self._suffix = wrap
        self._ids: OrderedDict[str, array[int]] = OrderedDict()  # 32-bit ids: 4 bytes a token
        self._lock = threading.Lock()
        self.max_tokens = max_tokens
        self.check_every = check_every
        self.min_chars = min_chars
        self.tokens = 0  # ids held now
        self.encodes = 0
        self.tokenized_chars = 0  # of pieces not found, tokenized
        self.enabled = True  # off for good once an encode differed from the tokenizer's own

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, **limits: int) -> SegmentCache | None:
        """A cache for ``tokenizer`` (a ``tokenizers.Tokenizer``), or None where tokenizing its
        pieces apart is not exactly tokenizing the whole (see the module's docstring)."""
        added: dict[str, int] = {}
        for token_id, token in tokenizer.get_added_tokens_decoder().items():
            if token.lstrip or token.rstrip or token.single_word:
                return None  # it takes the spaces beside it, or exists only between words
            if token.normalized and tokenizer.normalizer is not None:
                return None  # found in the normalized text, which pieces apart do not see
            added[token.content] = token_id
        encode = fast_encoder(tokenizer)
        probe = "probe"
        bare, wrapped = encode([probe], False)[0], encode([probe], True)[0]
        starts = [i for i in range(len(wrapped) - len(bare) + 1) if wrapped[i : i + len(bare)] == bare]
        if not bare or not starts:
            return None  # its special tokens are not a fixed prefix and suffix
        start = starts[0]
        cache = cls(tokenizer, added, (wrapped[:start], wrapped[start + len(bare) :]), **limits)
        names = (list(added) * 2)[:2] if added else ["", ""]
        for text in PROBES:
            text = text.format(*names)
            for special in (True, False):
                if cache._encode(text, special) != encode([text], special)[0]:
                    return None
        cache.clear()
        return cache

    def clear(self) -> None:
        """Forget every piece."""
        with self._lock:
            self._ids.clear()
            self.tokens = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text``, as the tokenizer's ``encode`` gives them (with its special
        tokens unless ``add_special_tokens=False``)."""
        if not self.enabled or len(text) < self.min_chars:
            return self._batch([text], add_special_tokens)[0]
        self.encodes += 1
        ids = self._encode(text, add_special_tokens)
        if self.encodes % self.check_every == 0:
            own = self._batch([text], add_special_tokens)[0]
            if ids != own:
                self.enabled = False
                logger.warning(
                    "tokenizing a prompt piece by piece gave other ids than the tokenizer's own; "
                    "every prompt is tokenized whole from now on"
                )
                return own
        return ids

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        pieces = self._split(text)  # text, added token, text, …: the added tokens at odd places
        known = self._ids
        texts = dict.fromkeys(piece for piece in pieces[::2] if piece)  # each once, in order
        found: dict[str, array[int] | list[int]] = {}
        with self._lock:
            for piece in texts:
                kept = known.get(piece)
                if kept is not None:
                    known.move_to_end(piece)
                    found[piece] = kept
        missing = [piece for piece in texts if piece not in found]
        if missing:
            batch = self._batch
            for piece in missing:  # one at a time: a batch's threads cost more than they save here
                found[piece] = batch([piece], False)[0]
            self.tokenized_chars += sum(map(len, missing))
            self._remember(missing, found)
        out = list(self._prefix) if add_special_tokens else []
        added = self._added
        for index, piece in enumerate(pieces):
            if index % 2:
                out.append(added[piece])
            elif piece:
                out.extend(found[piece])
        if add_special_tokens:
            out.extend(self._suffix)
        return out

    def _remember(self, pieces: list[str], found: dict[str, array[int] | list[int]]) -> None:
        with self._lock:
            for piece in pieces:
                ids = found[piece]
                if len(ids) > self.max_tokens or piece in self._ids:
                    continue
                self._ids[piece] = array("I", ids)
                self.tokens += len(ids)
            while self.tokens > self.max_tokens:
                _, dropped = self._ids.popitem(last=False)
                self.tokens -= len(dropped)
