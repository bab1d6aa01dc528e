"""Models that need no download: the built-in tiny model (random weights, built on first use)
and the readable model (trained on the standard library's docstrings, shipped).

Example:
    >>> from dynamo_nb.models import tiny_model_path
    >>> path = tiny_model_path()        # built on first use (a second), then cached
    >>> (path / "config.json").is_file(), (path / "tokenizer.json").is_file()
    (True, True)
"""

from __future__ import annotations

from .readable_model import READABLE_MODEL_NAME, readable_model_path
from .tiny import TINY_MODEL_NAME, tiny_model_path

__all__ = ["READABLE_MODEL_NAME", "TINY_MODEL_NAME", "readable_model_path", "tiny_model_path"]
