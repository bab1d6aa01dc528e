"""The readable model: a small Llama trained by this project, shipped in the package.

Where the random tiny model (`tiny_model_path`) writes noise, this one (about 1.6 M
parameters, a 2048-token byte-level BPE tokenizer, the same ChatML template and special
tokens) was trained on the docstrings of Python's standard library, so its greedy
completions read as English words and Python names, and its chat answers read like
documentation and end by themselves. ``models/train_readable.py`` rebuilds it;
``training.json`` in its folder records the data, steps and losses.

Example::

    from dynamo_nb.models import readable_model_path
    engine = await HFEngine.load(readable_model_path())
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["READABLE_MODEL_NAME", "readable_model_path"]

READABLE_MODEL_NAME = "tiny-docs"


def readable_model_path() -> Path:
    """The folder of the readable model (it ships with the package: nothing is built).

    Example:
        >>> (readable_model_path() / "config.json").is_file()
        True
    """
    return Path(__file__).with_name("readable")
