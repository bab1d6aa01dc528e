"""The hf engine's structured output: an llguidance matcher per guided sequence, masking its
logits row each step so only tokens its grammar allows can be drawn.

`Grammars` holds the engine's llguidance tokenizer (made once from the model folder's
``tokenizer.json``, sized to the model's logits) and makes a `GrammarMatcher` for a request's
`dynamo_nb.llm.guided.GuidedDecoding`. Each step, on the model thread, `GrammarMatcher.mask`
sets the logits of the tokens the grammar forbids to ``-inf`` in the sequence's row (in the same
batch as unconstrained rows, which are left alone); once the step's token is drawn,
`GrammarMatcher.accept` advances the grammar, and `GrammarMatcher.finished` says the grammar is
complete (the sequence then ends with ``stop``). A request that continues a stream (it moved to
this worker) replays the output tokens made before into its matcher first.

Example::

    grammars = Grammars.from_folder(model_dir, vocab_rows=model.config.vocab_size, eos_token_ids=[2])
    matcher = grammars.matcher(GuidedDecoding("json", {"type": "object"}), prompt=[1, 450])
    matcher.mask(logits_row)          # in place: forbidden tokens at -inf
    matcher.accept(token)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import EngineError, InvalidRequestError
from ..llm.guided import GuidedDecoding

__all__ = ["GrammarMatcher", "Grammars"]


class Grammars:
    """Makes matchers for one model's tokenizer (see the module docstring)."""

    def __init__(self, tokenizer_json: str, *, vocab_rows: int, eos_token_ids: Sequence[int]) -> None:
        from llguidance import LLTokenizer

        eos = list(eos_token_ids)
        self.vocab_rows = vocab_rows
        self.tokenizer = LLTokenizer(tokenizer_json, n_vocab=vocab_rows, eos_token=eos[0] if eos else None)

    @classmethod
    def from_folder(cls, folder: str | Path, *, vocab_rows: int, eos_token_ids: Sequence[int]) -> Grammars:
        """For the model in ``folder`` (its ``tokenizer.json``), whose logits have ``vocab_rows`` columns."""
        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise EngineError(f"structured output needs the model's tokenizer.json, not found in {folder}")
        return cls(path.read_text(), vocab_rows=vocab_rows, eos_token_ids=eos_token_ids)

    def matcher(self, guided: GuidedDecoding, prompt: Sequence[int]) -> GrammarMatcher:
        """A matcher at the start of ``guided``'s grammar, or past the ``guided.generated`` output
        tokens at the end of ``prompt`` (a continued stream's)."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self.tokenizer, guided.grammar())
        if matcher.is_error():
            where = guided.field or "guided_decoding"
            raise InvalidRequestError(f"{where}: {matcher.get_error()}", where)
        made = list(prompt[len(prompt) - guided.generated :]) if guided.generated else []
        if made and not matcher.consume_tokens(made):
            raise EngineError(f"the output so far does not match its grammar: {matcher.get_error()}")
        return GrammarMatcher(matcher, self.vocab_rows)


class GrammarMatcher:
    """One sequence's grammar state (see the module docstring)."""

    def __init__(self, matcher: Any, vocab_rows: int) -> None:
        self._matcher = matcher
        self._vocab_rows = vocab_rows

    def mask(self, row: Any) -> None:
        """Set ``row``'s logits (one sequence's, a 1-d tensor) of the tokens the grammar forbids now to -inf."""
        import numpy as np
        import torch

        bits = np.unpackbits(
            np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8), bitorder="little"
        )
        allowed = torch.from_numpy(bits[: row.shape[-1]].astype(bool))
        if allowed.shape[0] < row.shape[-1]:  # logits wider than the tokenizer: the rest is forbidden
            allowed = torch.cat([allowed, torch.zeros(row.shape[-1] - allowed.shape[0], dtype=torch.bool)])
        row.masked_fill_(~allowed.to(row.device), float("-inf"))

    def accept(self, token: int) -> None:
        """The step's token: the grammar moves past it."""
        if not self._matcher.consume_token(token):
            raise EngineError(f"token {token} broke its grammar: {self._matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """Whether the grammar is complete (nothing more may follow)."""
        return bool(self._matcher.is_stopped())
