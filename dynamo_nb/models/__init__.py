"""Models that need no download: the built-in tiny model.

Example:
    >>> from dynamo_nb.models import tiny_model_path
    >>> path = tiny_model_path()        # built on first use (a second), then cached
    >>> (path / "config.json").is_file(), (path / "tokenizer.json").is_file()
    (True, True)
"""

from __future__ import annotations

from .tiny import TINY_MODEL_NAME, tiny_model_path

__all__ = ["TINY_MODEL_NAME", "tiny_model_path"]
