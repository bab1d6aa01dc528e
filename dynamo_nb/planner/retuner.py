"""`Retuner`: the router retuned from a running frontend's own traffic, as Dynamo 1.7's Live Retune.

Every ``interval`` it reads the frontend's request trace (``--request-trace PATH``), keeps the
last ``window_s`` seconds, asks the frontend for its policy (``GET /router_policy``), and
replays the window once per point of ``grid`` and for that policy (`retune`). When a policy
beats the running one by more than ``min_improvement_pct`` in ``confirm`` windows in a row
(the same policy each time: hysteresis, so noise does not flap the router), it applies it
(``PATCH /router_policy``, with the admin token or signed with the cluster secret). With
``dry_run`` it only says what it would apply. Given ``error`` (the replay's measured error,
`dynamo_nb.replay.model_error`), it keeps the running policy when the winner's margin is within
that error (`Retune.beyond_error`). Each window is a row of `decisions` (the audit), drawn live
in a notebook.

Example::

    retuner = Retuner(frontend.url, "trace.jsonl", {"prefill_load_scale": [1, 8, 32]},
                      fleet=Fleet(workers=2), token=token, interval=30, window_s=60)
    async with retuner:
        ...                                   # traffic comes and goes
    retuner.decisions                         # a row per window: the winner, its margin, the action
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bench.traces import read_trace
from ..errors import ConfigError
from ..http import fetch
from ..replay import Fleet, MockerSettings, error_band_pct
from ..router.policy import RouterPolicy
from ..runtime.security import ClusterSecret
from .interval_loop import IntervalLoop
from .retune import Grid, Retune, describe, last_window, objective_label, retune

if TYPE_CHECKING:
    import pandas as pd

    from ..bench.charts import Chart

__all__ = ["Retuner"]

_PATH = "/router_policy"
COLUMNS = ["t_s", "requests", "incumbent", "winner", "margin_pct", "action", "reason"]


class Retuner(IntervalLoop):
    """See the module docstring.

    Attributes:
        applied: the policies it applied, in order.
    """

    name = "retuner"

    def __init__(
        self,
        url: str,
        trace_path: str | Path,
        grid: Grid,
        *,
        fleet: Fleet | None = None,
        settings: MockerSettings | None = None,
        objective: str = "ttft_mean_ms",
        window_s: float = 60.0,
        interval: float = 30.0,
        min_improvement_pct: float = 5.0,
        confirm: int = 2,
        min_requests: int = 20,
        token: str | None = None,
        secret: ClusterSecret | None = None,
        dry_run: bool = False,
        concurrency: int | None = None,
        seed: int = 0,
        live: bool = False,
        tune: Callable[..., Retune] = retune,
        clock: Callable[[], float] = time.monotonic,
        error: Mapping[str, float] | None = None,
    ) -> None:
        if window_s <= 0 or interval <= 0 or confirm < 1 or min_improvement_pct < 0 or min_requests < 1:
            raise ConfigError(
                "window_s and interval must be positive, confirm and min_requests at least 1, "
                "min_improvement_pct 0 or more"
            )
        if not dry_run and token is None and secret is None:
            raise ConfigError(
                "applying a policy takes the frontend's admin token (token=) or the cluster secret "
                "(secret=); or retune with dry_run=True"
            )
        super().__init__(interval, live=live)
        self.url = url.rstrip("/")
        self.trace_path = Path(trace_path)
        self.grid = grid
        self.fleet = fleet
        self.settings = settings
        self.objective = objective
        self.window_s = window_s
        self.min_improvement_pct = min_improvement_pct
        self.confirm = confirm
        self.min_requests = min_requests
        self.token = token
        self.secret = secret
        self.dry_run = dry_run
        self.concurrency = concurrency
        self.seed = seed
        self.error = dict(error) if error is not None else None
        self.applied: list[RouterPolicy] = []
        self._tune = tune
        self._clock = clock
        self._origin = clock()
        self._candidate: RouterPolicy | None = None
        self._streak = 0  # windows in a row the candidate won by enough

    @property
    def decisions(self) -> pd.DataFrame:
        """One row per window: ``t_s``, ``requests`` (in the window), ``incumbent``, ``winner``,
        ``margin_pct``, ``action`` (wait, keep, hold, applied, would apply) and ``reason``."""
        import pandas as pd

        return pd.DataFrame(self.records, columns=COLUMNS)

    def _headers(self, method: str, body: bytes) -> dict[str, str]:
        if self.token is not None:
            return {"Authorization": f"Bearer {self.token}"}
        if self.secret is not None:
            from ..frontend.admin import SIGNATURE_HEADER, sign_admin_request

            return {SIGNATURE_HEADER: sign_admin_request(self.secret, method, _PATH, body)}
        return {}

    async def _admin(self, method: str, body: bytes = b"") -> dict[str, Any]:
        status, answer = await fetch(
            self.url + _PATH, method=method, body=body, headers=self._headers(method, body), timeout=10
        )
        if status != 200:
            raise ConfigError(
                f"{method} {self.url}{_PATH} answered {status}: {answer[:300].decode(errors='replace')}"
            )
        result: dict[str, Any] = json.loads(answer)
        return result

    async def current_policy(self) -> RouterPolicy:
        """The frontend's policy now (``GET /router_policy``)."""
        return RouterPolicy(**(await self._admin("GET"))["policy"])

    async def step(self) -> dict[str, Any]:
        """One window now (the background task calls it every ``interval``): its row."""
        row: dict[str, Any] = {"t_s": round(self._clock() - self._origin, 2), "requests": 0}
        trace = await asyncio.to_thread(read_trace, self.trace_path) if self.trace_path.exists() else None
        window = last_window(trace, self.window_s) if trace is not None and len(trace) else None
        row["requests"] = 0 if window is None else len(window)
        incumbent = await self.current_policy()
        row["incumbent"] = describe(incumbent)
        if window is None or len(window) < self.min_requests:
            row.update(winner=None, margin_pct=math.nan, action="wait",
                       reason=f"{row['requests']} requests in the window, fewer than {self.min_requests}")  # fmt: skip
            return await self._recorded(row)
        answer = await asyncio.to_thread(
            self._tune, window, self.grid, objective=self.objective, fleet=self.fleet, settings=self.settings,
            incumbent=incumbent, concurrency=self.concurrency, seed=self.seed, error=self.error,
        )  # fmt: skip
        row.update(winner=describe(answer.winner), margin_pct=round(answer.margin_pct, 2))
        if not answer.beats_incumbent_by(self.min_improvement_pct):
            self._candidate, self._streak = None, 0
            row.update(action="keep", reason=f"nothing beat it by more than {self.min_improvement_pct:g} %")
            return await self._recorded(row)
        if answer.beyond_error is False:  # a margin the replay's own error could make up
            self._candidate, self._streak = None, 0
            band = error_band_pct(answer.error_pct or {}, self.objective)
            row.update(
                action="keep", reason=f"its margin is within the replay's measured error (±{band:.0f} %)"
            )
            return await self._recorded(row)
        if answer.winner == self._candidate:
            self._streak += 1
        else:
            self._candidate, self._streak = answer.winner, 1
        better = f"{answer.margin_pct:.1f} % better on {self.objective}"
        if self._streak < self.confirm:
            row.update(action="hold", reason=f"{better}, {self._streak} of {self.confirm} windows in a row")
            return await self._recorded(row)
        self._candidate, self._streak = None, 0
        if self.dry_run:
            row.update(action="would apply", reason=f"{better} in {self.confirm} windows (dry run)")
        else:
            await self._admin("PATCH", json.dumps(answer.winner.to_dict()).encode())
            self.applied.append(answer.winner)
            row.update(action="applied", reason=f"{better} in {self.confirm} windows")
        return await self._recorded(row)

    def chart(self) -> Chart:
        """Each window's winner margin over the running policy, the threshold dashed, the
        windows where a policy was applied marked."""
        from ..bench.charts import _chart

        table = self.decisions
        figure, (ax,) = _chart(1)
        ax.plot(table["t_s"], table["margin_pct"], marker="o", label="the best policy's margin")
        ax.axhline(self.min_improvement_pct, color="red", linestyle="--", alpha=0.7, label="threshold")
        changed = table[table["action"].isin(["applied", "would apply"])]
        ax.scatter(changed["t_s"], changed["margin_pct"], s=160, facecolors="none", edgecolors="green",
                   linewidths=2, label="applied", zorder=3)  # fmt: skip
        ax.set_title(f"retuning on {objective_label(self.objective)}")
        ax.set_xlabel("seconds")
        ax.set_ylabel("% better than the running policy")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        return figure

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<Retuner {self.url} on {self.objective}, {len(self.records)} windows, {len(self.applied)} applied, {state}>"
