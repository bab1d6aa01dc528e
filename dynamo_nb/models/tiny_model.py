"""The built-in tiny model: a small Llama trained by this project, shipped in the package.

About 1.6 M parameters, a 2048-token byte-level BPE tokenizer and a ChatML chat template,
trained on the docstrings of Python's standard library and short ChatML answers drawn from
them: its greedy completions read as English words and Python names, and its chat answers
read like documentation and end by themselves. It decodes a token in about 2 ms on one CPU
core. ``models/train_tiny.py`` rebuilds it; ``training.json`` in its folder records the data,
steps and losses (``docs/models.md``). Nothing is downloaded or built at run time.

Example::

    from dynamo_nb.models import tiny_model_path
    engine = await HFEngine.load(tiny_model_path())
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TINY_MODEL_NAME", "tiny_model_path"]

TINY_MODEL_NAME = "tiny-llama"


def tiny_model_path() -> Path:
    """The folder of the built-in tiny model (a Hugging Face model folder in the package).

    Example:
        >>> (tiny_model_path() / "config.json").is_file()
        True
    """
    return Path(__file__).with_name("tiny_llama")
