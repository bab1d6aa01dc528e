"""Size a fleet for a trace and an SLO, and scale a running graph to its load.

- ``sizing.py``: `plan`, the fewest workers (aggregated, or a prefill:decode split) that
  serve a trace within an SLO, found by offline replay (`dynamo_nb.replay`), with a Pareto
  table, a chart and the cost per million tokens;
- ``retune.py``: `retune`, the KV router's knobs that serve a recorded trace best, found by
  replaying it once per point of a grid, with the winner's margin over the running policy;
- ``retuner.py``: `Retuner`, the same from a running frontend's request trace, window after
  window, applying a policy that wins by enough in enough windows in a row (admin API);
- ``interval_loop.py``: `IntervalLoop`, a decision per interval in the background with a live
  chart (what the autoscaler and the retuner share);
- ``autoscaler.py``: `Autoscaler`, which reads a frontend's metrics and scales a running
  graph's workers (load, throughput or SLO mode, with hysteresis and bounds).

Example:
    >>> from dynamo_nb.bench import SLO, synthetic_trace
    >>> plan(synthetic_trace(100, rate=10.0, seed=1), SLO(ttft_ms=100)).fleet
    Fleet(workers=1, prefill=0, decode=0, router='kv', router_policy=RouterPolicy(overlap_score_credit=1.0, prefill_load_scale=1.0, temperature=0.0), transfer_ms=0.0, overhead_ms=0.0)
"""

from __future__ import annotations

from .autoscaler import AUTOSCALE_MODES, Autoscaler, Scalable
from .retune import Retune, retune
from .retuner import Retuner
from .sizing import Plan, Simulate, plan

__all__ = [
    "AUTOSCALE_MODES",
    "Autoscaler",
    "Plan",
    "Retune",
    "Retuner",
    "Scalable",
    "Simulate",
    "plan",
    "retune",
]
