"""Engines: what runs the model behind a worker endpoint.

``hf`` (PyTorch + transformers; needs the ``hf`` extra), ``echo`` (zero-cost, streams the
prompt back) and ``mocker`` (a simulated engine with a KV block manager and KV events). Each engine's ``generate`` is an endpoint handler: ``PreprocessedRequest`` dict
in, ``LLMEngineOutput`` dicts out.

Example:
    >>> from dynamo_nb.engines import EchoEngine
    >>> engine = EchoEngine()
    >>> server = await endpoint.serve(engine.generate)   # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import stats_handler
from .echo import EchoEngine
from .mocker import MockerEngine

if TYPE_CHECKING:
    from .hf import HFEngine

__all__ = ["EchoEngine", "HFEngine", "MockerEngine", "stats_handler"]


def __getattr__(name: str) -> Any:  # HFEngine imports torch only when asked for
    if name == "HFEngine":
        from .hf import HFEngine

        return HFEngine
    raise AttributeError(name)
