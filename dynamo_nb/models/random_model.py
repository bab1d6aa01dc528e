"""The random model: a random-weight Llama and a byte-level BPE tokenizer, built locally; and
the tokenizer and config recipe it shares with the built-in tiny model's training.

Tests use it where a model whose build is checked byte for byte matters, or as the contrast
to the trained tiny model (`dynamo_nb.models.tiny_model_path`). It is built on first use
(about a second, no network), deterministically, and cached in the user cache folder
(``$DYN_NB_CACHE_DIR``, else ``$XDG_CACHE_HOME/dynamo_nb``, else ``~/.cache/dynamo_nb``) as an
ordinary Hugging Face model folder, so anything that takes a model folder takes it:
``AutoModelForCausalLM.from_pretrained(random_model_path())``.

Its weights are random (``initializer_range=0.3`` so that greedy outputs vary instead of
repeating one token): the text it writes is gibberish, but it is real model execution with a
real KV cache, tokenizer and ChatML chat template.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["RANDOM_MODEL_NAME", "cache_dir", "random_model_path"]

RANDOM_MODEL_NAME = "random-llama"
_VERSION = "v1"  # bump when the recipe changes: a new folder is built next to the old one
_DONE_MARKER = ".dynamo_nb_complete"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 512
CONTEXT_LENGTH = 1024


def cache_dir() -> Path:
    """Where dynamo_nb keeps what it builds (``$DYN_NB_CACHE_DIR`` wins)."""
    explicit = os.environ.get("DYN_NB_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dynamo_nb"


def random_model_path() -> Path:
    """The folder of the random model, built on the first call.

    Needs ``torch`` and ``transformers`` (``pip install -e ".[hf]"``) the first time.

    Example::

        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained(random_model_path())
    """
    target = cache_dir() / f"{RANDOM_MODEL_NAME}-{_VERSION}"
    if (target / _DONE_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _build(staging)
        (staging / _DONE_MARKER).write_text("ok\n")
        try:
            os.replace(staging, target)
        except OSError:  # another process finished first, or a stale partial folder is in the way
            if not (target / _DONE_MARKER).exists():
                shutil.rmtree(target, ignore_errors=True)
                os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer (``tokenizers.Tokenizer``) of ``vocab_size`` tokens trained
    on ``texts``, with the built-in models' special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def chat_tokenizer(raw: Any) -> Any:
    """``raw`` as a ``PreTrainedTokenizerFast`` with the ChatML template and end tokens."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=CONTEXT_LENGTH,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def llama_config(raw: Any, **shape: Any) -> Any:
    """A ``LlamaConfig`` for ``raw``'s vocabulary, end and padding tokens and the built-in
    context length; ``shape`` gives the sizes (``hidden_size``, ``num_hidden_layers``, ...)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=raw.get_vocab_size(),
        max_position_embeddings=CONTEXT_LENGTH,
        bos_token_id=None,
        eos_token_id=end_token_ids(raw),
        pad_token_id=raw.token_to_id("<|endoftext|>"),
        **shape,
    )


def end_token_ids(raw: Any) -> list[int]:
    """The ids that end a generation: ``<|im_end|>`` and ``<|endoftext|>``."""
    return [raw.token_to_id("<|im_end|>"), raw.token_to_id("<|endoftext|>")]


def _train_tokenizer() -> Any:
    corpus = (Path(__file__).with_name("corpus.txt")).read_text(encoding="utf-8")
    return train_bpe_tokenizer(corpus.splitlines(), VOCAB_SIZE)


def _build(folder: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    raw = _train_tokenizer()
    tokenizer = chat_tokenizer(raw)
    eos_ids = end_token_ids(raw)
    config = llama_config(
        raw,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
        with torch.no_grad():  # tokens that print as noise (lone bytes, control characters) get logit 0
            for token_id in _noisy_token_ids(raw):
                model.lm_head.weight[token_id].zero_()
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=config.pad_token_id)
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _noisy_token_ids(raw: Any) -> list[int]:
    """Ids of ordinary tokens whose text is not printable on its own."""
    noisy = []
    for token_id in range(raw.get_vocab_size()):
        if raw.id_to_token(token_id) in SPECIAL_TOKENS:
            continue
        text = raw.decode([token_id])
        if not text or any(not (ch.isprintable() or ch == "\n") or ch == "\ufffd" for ch in text):
            noisy.append(token_id)
    return noisy
