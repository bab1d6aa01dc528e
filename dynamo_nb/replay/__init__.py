"""Replay request traces offline in virtual time, and size a fleet by replaying them.

- ``fleet.py``: `Fleet` (aggregated workers, or prefill and decode pools, and the router) and
  `MockerSettings` (the mocker engines' scheduler and timing flags);
- ``trace_blocks.py``: `TraceBlocks`, a trace's prompts as KV blocks at the engines' block size;
- ``simulator.py``: `replay`, the real routers and the mocker's scheduler on a simulated clock,
  giving the columns of `dynamo_nb.bench.run`;
- ``fidelity.py``: `fidelity`, a replay per timing model set beside the live run it predicts,
  each figure with its error.

Example:
    >>> from dynamo_nb.bench import synthetic_trace
    >>> trace = synthetic_trace(100, rate=10.0, seed=3)
    >>> result = replay(trace, Fleet(workers=2))
    >>> len(result.requests), result.fleet.describe()
    (100, '2 workers, kv router')
"""

from __future__ import annotations

from .fidelity import FIGURES, error_band, error_band_pct, fidelity, model_error
from .fleet import Fleet, MockerSettings
from .simulator import ReplayResult, replay
from .trace_blocks import TraceBlocks

__all__ = [
    "FIGURES",
    "Fleet",
    "MockerSettings",
    "ReplayResult",
    "TraceBlocks",
    "error_band",
    "error_band_pct",
    "fidelity",
    "model_error",
    "replay",
]
