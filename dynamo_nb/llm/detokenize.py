"""Incremental detokenizing with stop strings: tokens in, text out, as soon as it is final.

Text that could be the start of a stop string is held back until the next tokens show it is
not; a matched stop string and everything after it is never sent.

Example::

    from dynamo_nb.models import tiny_model_path
    tok = ModelTokenizer.load(tiny_model_path())
    detok = StreamDetokenizer(tok, stop=["world"])
    "".join(detok.push(t) for t in tok.encode("hello world again")), detok.stopped
    # ('hello ', True)
"""

from __future__ import annotations

from .tokenizer import ModelTokenizer

__all__ = ["StreamDetokenizer"]


class StreamDetokenizer:
    """Turns one stream's token ids into text pieces, honouring ``stop`` strings."""

    __slots__ = ("_decode", "_held", "_stream", "_tokenizer", "stop", "stopped", "stopped_by")

    def __init__(self, tokenizer: ModelTokenizer, stop: list[str] | None = None) -> None:
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer.tokenizer
        self._stream = DecodeStream(skip_special_tokens=True)
        self._decode = self._stream.step
        self.stop = [s for s in (stop or []) if s]
        self._held = ""
        self.stopped = False
        self.stopped_by: str | None = None  # the stop string that ended the text, once one did

    def push(self, token_id: int) -> str:
        """The text that ``token_id`` makes final ("" while bytes or a stop-string prefix are pending)."""
        if self.stopped:
            return ""
        piece = self._decode(self._tokenizer, token_id)
        if not self.stop:
            return piece or ""
        if piece:
            self._held += piece
        return self._release()

    def _release(self) -> str:
        held = self._held
        cut = -1
        for stop in self.stop:
            at = held.find(stop)
            if at != -1 and (cut == -1 or at < cut):
                cut = at
                self.stopped_by = stop
        if cut != -1:
            self.stopped = True
            self._held = ""
            return held[:cut]
        keep = 0
        for stop in self.stop:
            for length in range(min(len(held), len(stop) - 1), keep, -1):
                if held.endswith(stop[:length]):
                    keep = length
                    break
        if keep:
            self._held = held[-keep:]
            return held[:-keep]
        self._held = ""
        return held

    def finish(self) -> str:
        """The text held back, at the end of the stream."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
