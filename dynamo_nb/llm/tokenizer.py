"""Tokenizer and chat template of a model folder, for the frontend (no torch, no transformers).

Uses the fast ``tokenizers`` library for ``tokenizer.json`` and a sandboxed Jinja2 for the
chat template (``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``).

Example:
    >>> from dynamo_nb.models import tiny_model_path
    >>> tok = ModelTokenizer.load(tiny_model_path())
    >>> tok.render_chat([{"role": "user", "content": "hi"}])
    '<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InvalidRequestError
from .card import check_model_dir
from .segment_cache import SegmentCache, fast_encoder

__all__ = ["LONG_TEXT_CHARS", "ModelTokenizer"]

LONG_TEXT_CHARS = 65_536
"""Past this many characters `ModelTokenizer.encode_off_loop` tokenizes in a thread: the event loop
(every other stream of the frontend, its health checks) keeps running meanwhile."""


def _text_size(messages: list[dict[str, Any]]) -> int:
    """The characters of the messages' text (plain contents and text parts)."""
    size = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            size += len(content)
        elif isinstance(content, list):
            size += sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
    return size


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _raise_exception(message: str) -> None:
    raise InvalidRequestError(f"the chat template rejected the messages: {message}", param="messages")


class ModelTokenizer:
    """Encode, decode and apply the chat template of one model folder."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        self.folder = check_model_dir(folder)
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        config_file = self.folder / "tokenizer_config.json"
        self.config: dict[str, Any] = json.loads(config_file.read_text()) if config_file.is_file() else {}
        template_file = self.folder / "chat_template.jinja"
        self.chat_template: str | None = (
            template_file.read_text() if template_file.is_file() else self.config.get("chat_template")
        )
        if isinstance(self.chat_template, list):  # named templates: take "default"
            named = {t.get("name"): t.get("template") for t in self.chat_template if isinstance(t, dict)}
            self.chat_template = named.get("default")
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))

    @classmethod
    def load(cls, folder: str | Path) -> ModelTokenizer:
        """Load the tokenizer of ``folder``; raises `ConfigError` if it has no ``tokenizer.json``."""
        return cls(Path(folder))

    @cached_property
    def _template(self) -> Any:
        if not self.chat_template:
            raise ConfigError(f"{self.folder} has no chat template; use /v1/completions")
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.globals["raise_exception"] = _raise_exception
        env.filters["tojson"] = lambda value, indent=None: json.dumps(
            value, indent=indent, ensure_ascii=False
        )
        template = env.from_string(self.chat_template)
        template.globals = dict(template.globals)  # a ChainMap of globals costs ~7 µs per render
        return template

    def render_chat(
        self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """The prompt text for ``messages``, as the model's chat template writes it."""
        import jinja2

        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **extra,
            )
        except InvalidRequestError:
            raise
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(
                f"the chat template failed on these messages: {exc}", "messages"
            ) from None

    async def render_chat_off_loop(
        self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """`render_chat`, in a thread when the messages hold more than `LONG_TEXT_CHARS` characters
        (a template is Python: the event loop runs between its steps instead of after them all);
        ``extra`` goes to the template (``tools``)."""
        if _text_size(messages) <= LONG_TEXT_CHARS:
            return self.render_chat(messages, add_generation_prompt=add_generation_prompt, **extra)
        return await asyncio.to_thread(
            functools.partial(
                self.render_chat, messages, add_generation_prompt=add_generation_prompt, **extra
            )
        )

    @cached_property
    def segments(self) -> SegmentCache | None:
        """The ids of the prompts' pieces between added tokens, each tokenized once (None where
        that is not exact for this tokenizer): `dynamo_nb.llm.segment_cache`."""
        return SegmentCache.for_tokenizer(self.tokenizer)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``: the pieces between added tokens seen before are not tokenized
        again (`segments`), the others without the character offsets a plain ``encode`` also
        tracks (a third less time on a long prompt, the same ids)."""
        segments = self.segments
        if segments is not None:
            return segments.encode(text, add_special_tokens)
        return self._encode_whole([text], add_special_tokens)[0]

    @cached_property
    def _encode_whole(self) -> Callable[[list[str], bool], list[list[int]]]:
        return fast_encoder(self.tokenizer)

    async def encode_off_loop(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """`encode`, in a thread when ``text`` is longer than `LONG_TEXT_CHARS` (tokenizers releases
        the GIL while it works)."""
        if len(text) <= LONG_TEXT_CHARS:
            return self.encode(text, add_special_tokens=add_special_tokens)
        return await asyncio.to_thread(self.encode, text, add_special_tokens=add_special_tokens)

    @cached_property
    def longest_token_chars(self) -> int:
        """The most characters one token stands for (the longest token of the vocabulary, added
        tokens included, as written: a byte-level or word-piece token never decodes to more
        characters than it is written with): a text of ``n`` characters is at least ``n / this``
        tokens.

        Example:
            >>> from dynamo_nb.models import tiny_model_path
            >>> ModelTokenizer.load(tiny_model_path()).longest_token_chars
            17
        """
        return max((len(token) for token in self.tokenizer.get_vocab(with_added_tokens=True)), default=1) or 1

    def fewest_tokens(self, text: str) -> int:
        """A floor on the tokens of ``text`` without tokenizing it: its characters over
        `longest_token_chars`, halved (a normalizer may shorten a text before it is split)."""
        return len(text) // self.longest_token_chars // 2

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def special_token_ids(self) -> frozenset[int]:
        """The ids of the special tokens (``<s>``, chat-template markers…): decoding skips them."""
        return frozenset(i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)
