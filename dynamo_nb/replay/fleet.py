"""What a replay runs: the fleet (aggregated workers, or prefill and decode pools, and the router)
and the mocker engines' settings.

`MockerSettings` (`dynamo_nb.engines.mocker_scheduler`'s) holds the flags of the mocker worker
that shape its scheduler and timing, with the same defaults; `MockerSettings.argv` gives them
back as that worker's command line, so a fleet replayed offline can be started live with the
same engines.

Example:
    >>> Fleet(workers=4).describe()
    '4 workers, kv router'
    >>> Fleet(prefill=1, decode=3, router="round-robin").describe()
    '1 prefill + 3 decode workers, round-robin router'
    >>> MockerSettings(speedup_ratio=5).argv()
    ['--kv-cache-block-size', '16', '--max-num-seqs', '256', '--num-gpu-blocks', '16384', '--max-num-batched-tokens', '8192', '--speedup-ratio', '5', '--decode-speedup-ratio', '1']
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..engines.mocker_scheduler import MockerSettings
from ..errors import ConfigError
from ..router import ROUTER_MODES
from ..router.policy import RouterPolicy

__all__ = ["Fleet", "MockerSettings"]


@dataclass(frozen=True)
class Fleet:
    """The workers a trace is replayed on.

    Aggregated: ``workers`` engines that each prefill and decode. Disaggregated: ``prefill``
    and ``decode`` pools (both at least 1; ``workers`` is then ignored), as the frontend's
    prefill planner runs them: the prefill worker is picked by ``router``, the decode worker
    too, at once (the fast path), and the decode starts when the prefill hands its KV over.

    Attributes:
        router: one of `dynamo_nb.router.ROUTER_MODES`, for every pool.
        router_policy: the KV router's knobs (`dynamo_nb.router.policy.RouterPolicy`:
            ``overlap_score_credit``, ``prefill_load_scale``, ``temperature``).
        transfer_ms: simulated time from a prefill's end to its decode's start (the KV transfer;
            the live mocker's handoff carries no tensors).
        overhead_ms: each request's time between the client and the engines (HTTP, the
            frontend, the request plane), added to its TTFT and end-to-end time; `bench.profile`
            measures it (``TimingProfile.request_overhead_ms``).
    """

    workers: int = 1
    prefill: int = 0
    decode: int = 0
    router: str = "kv"
    router_policy: RouterPolicy = field(default_factory=RouterPolicy)
    transfer_ms: float = 0.0
    overhead_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.router not in ROUTER_MODES:
            raise ConfigError(f"unknown router {self.router!r}: use one of {', '.join(ROUTER_MODES)}")
        if self.disaggregated:
            if self.prefill < 1 or self.decode < 1:
                raise ConfigError(
                    f"a disaggregated fleet needs at least 1 prefill and 1 decode worker, got "
                    f"prefill={self.prefill}, decode={self.decode}"
                )
        elif self.workers < 1:
            raise ConfigError(f"a fleet needs at least 1 worker, got workers={self.workers}")
        if self.transfer_ms < 0 or self.overhead_ms < 0:
            raise ConfigError(
                f"transfer_ms and overhead_ms must be 0 or more, got {self.transfer_ms} and {self.overhead_ms}"
            )

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0 or self.decode > 0

    @property
    def size(self) -> int:
        """Workers in all."""
        return self.prefill + self.decode if self.disaggregated else self.workers

    def describe(self) -> str:
        """A short name, for tables and chart labels."""
        if self.disaggregated:
            return f"{self.prefill} prefill + {self.decode} decode workers, {self.router} router"
        plural = "s" if self.workers != 1 else ""
        return f"{self.workers} worker{plural}, {self.router} router"
