"""Models that need no download: the built-in tiny model.

Example:
    >>> from dynamo_nb.models import tiny_model_path
    >>> path = tiny_model_path()        # doctest: +SKIP
    >>> sorted(p.name for p in path.iterdir())[:2]   # doctest: +SKIP
    ['config.json', 'generation_config.json']
"""

from __future__ import annotations

from .tiny import TINY_MODEL_NAME, tiny_model_path

__all__ = ["TINY_MODEL_NAME", "tiny_model_path"]
