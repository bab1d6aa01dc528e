"""Why a request went where it did: the routing decision every router records.

A `RoutingDecision` lists the candidates a router looked at, for each the parts of the score
it used (KV: overlap blocks, prefill tokens, decode blocks, the cost; least-loaded: requests
in flight; a policy: what it returned), the instance it chose, the margin to the runner-up,
whether there was a tie, and why other instances were left out (reported down, at their
limit, not drawn, pinned elsewhere). The frontend keeps the last ones in a `RoutingRecords`
ring, returns one with an answer when the request asks (``nvext.extra_fields: ["routing"]``)
and shows them as a table (`RoutingRecords.table`).

Example:
    >>> decision = RoutingDecision("kv", chosen=2, rule="lowest cost", candidates=[
    ...     Candidate(1, score=18.0, parts={"overlap_blocks": 0, "cost": 18.0}),
    ...     Candidate(2, score=10.0, parts={"overlap_blocks": 4, "cost": 10.0}),
    ... ])
    >>> decision.margin, decision.tie
    (8.0, False)
    >>> decision.explain()
    'kv chose 2 (lowest cost; score 10, next best 18, margin 8) of 2 candidates'
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..runtime.instance import format_instance_id

__all__ = ["NO_TICKET", "Candidate", "RoutingDecision", "RoutingRecords", "RoutingTicket"]


@dataclass(frozen=True, slots=True)
class RoutingTicket:
    """What a router is told of a request beside the request itself, so that the decision it
    returns is finished: the request's id and model, the hop (``decode`` or ``prefill``) and
    how the request waited at the frontend's queue (``priority``, ``strict_priority``,
    ``waited_ms``; None when it did not go through one).

    Example:
        >>> RoutingTicket("r1", "tiny-llama").for_prefill().hop
        'prefill'
    """

    request_id: str = ""
    model: str = ""
    hop: str = "decode"
    queue: dict[str, float] | None = None

    def for_prefill(self) -> RoutingTicket:
        """The same request's ticket for its prefill worker's decision."""
        return RoutingTicket(self.request_id, self.model, "prefill", self.queue)


NO_TICKET = RoutingTicket()
"""A request routed outside a frontend (a router called directly): no id, model or queue."""


@dataclass(slots=True)
class Candidate:
    """One instance a router considered (or left out, saying why in ``excluded``).

    Attributes:
        score: what the router ranks by, lower is better (KV: the cost; least-loaded: requests
            in flight); None when it ranks nothing (round robin, random, a policy).
        parts: the numbers the score is made of.
        excluded: why it could not be chosen (None: it could).
    """

    instance_id: int
    score: float | None = None
    parts: dict[str, float] = field(default_factory=dict)
    excluded: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"instance_id": self.instance_id}
        if self.score is not None:
            out["score"] = self.score
        if self.parts:
            out["parts"] = self.parts
        if self.excluded is not None:
            out["excluded"] = self.excluded
        return out


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    """One router's choice for one request (see the module docstring), made whole by the router
    that decided (`dynamo_nb.router.Router.decision`, with the request's `RoutingTicket`).

    Attributes:
        router: which router decided (``round-robin``, ``random``, ``least-loaded``, ``kv``,
            ``direct``, ``policy:NAME``); ``hop``: ``decode`` or ``prefill``.
        rule: how it chose among the candidates, in words.
        margin: the runner-up's score minus the chosen one's (None without scores or a runner-up).
        tie: whether another candidate had the chosen one's score.
        overhead_ms: milliseconds per routing phase (the KV router's ``block_hashing``,
            ``indexer_find_matches``, ``scheduling`` and ``total``).
        seen_before_tokens: the KV router's: the prompt's leading tokens whose blocks it sent to
            some worker before (cached there still, or evicted since).
        policy: the KV router's knobs when it decided (`dynamo_nb.router.policy.RouterPolicy`).
        queue: the frontend's: the request's ``priority``, ``strict_priority`` and the
            milliseconds it waited for a slot (``waited_ms``) before it was routed.
    """

    router: str
    chosen: int
    candidates: list[Candidate]
    rule: str = ""
    request_id: str = ""
    model: str = ""
    hop: str = "decode"
    overhead_ms: dict[str, float] = field(default_factory=dict)  # time per routing phase (KV router)
    seen_before_tokens: int | None = None  # KV router: the prompt's leading tokens in blocks it routed before
    policy: dict[str, float] | None = None  # KV router: its knobs when it decided
    queue: dict[str, float] | None = None  # the frontend's: priority, tier, time waited for a slot
    margin: float | None = field(default=None, init=False)
    tie: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        chosen = next((c for c in self.candidates if c.instance_id == self.chosen), None)
        if chosen is None or chosen.score is None:
            return
        others = [
            c.score
            for c in self.candidates
            if c.instance_id != self.chosen and c.excluded is None and c.score is not None
        ]
        if others:
            best_other = min(others)
            object.__setattr__(self, "margin", best_other - chosen.score)
            object.__setattr__(self, "tie", best_other == chosen.score)

    @property
    def cached_blocks(self) -> int | None:
        """The prompt's blocks the router found cached on the chosen worker (the KV router's
        ``overlap_blocks``); None where the router does not know.

        Example:
            >>> RoutingDecision("kv", 7, [Candidate(7, 1.0, {"overlap_blocks": 3})]).cached_blocks
            3
            >>> RoutingDecision("round-robin", 7, [Candidate(7)]).cached_blocks is None
            True
        """
        chosen = next((c for c in self.candidates if c.instance_id == self.chosen), None)
        blocks = None if chosen is None else chosen.parts.get("overlap_blocks")
        return None if blocks is None else int(blocks)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (what ``nvext.routing`` carries)."""
        return {
            "request_id": self.request_id,
            "model": self.model,
            "hop": self.hop,
            "router": self.router,
            "chosen": self.chosen,
            "rule": self.rule,
            "margin": self.margin,
            "tie": self.tie,
            "candidates": [c.to_dict() for c in self.candidates],
            "overhead_ms": self.overhead_ms,
            "seen_before_tokens": self.seen_before_tokens,
            "policy": self.policy,
            "queue": self.queue,
        }

    def explain(self) -> str:
        """The decision in one sentence."""
        considered = [c for c in self.candidates if c.excluded is None]
        how = self.rule
        chosen = next((c for c in self.candidates if c.instance_id == self.chosen), None)
        if chosen is not None and chosen.score is not None and self.margin is not None:
            how += (
                f"; score {chosen.score:g}, next best {chosen.score + self.margin:g}, margin {self.margin:g}"
            )
            if self.tie:
                how += ", a tie"
        left_out = len(self.candidates) - len(considered)
        tail = f", {left_out} left out" if left_out else ""
        return f"{self.router} chose {format_instance_id(self.chosen)} ({how}) of {len(considered)} candidates{tail}"


class RoutingRecords:
    """The last ``size`` routing decisions of a frontend, newest last (a bounded ring: adding
    one is an append, whatever the load; ``size=0`` keeps none).

    Example:
        >>> records = RoutingRecords(size=2)
        >>> for chosen in (1, 2, 3):
        ...     records.add(RoutingDecision("round-robin", chosen, [Candidate(chosen)], request_id=f"r{chosen}"))
        >>> [d.chosen for d in records], records.get("r3").chosen, records.get("r1")
        ([2, 3], 3, None)
    """

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._ring: collections.deque[RoutingDecision] = collections.deque(maxlen=max(size, 0))

    def add(self, decision: RoutingDecision) -> None:
        if self.size > 0:
            self._ring.append(decision)

    def __iter__(self) -> Iterator[RoutingDecision]:
        return iter(list(self._ring))

    def __len__(self) -> int:
        return len(self._ring)

    def get(self, request_id: str, hop: str = "decode") -> RoutingDecision | None:
        """The newest decision of ``request_id`` for ``hop`` (None when it is not kept)."""
        for decision in reversed(self._ring):
            if decision.request_id == request_id and decision.hop == hop:
                return decision
        return None

    def rows(self, decisions: Iterable[RoutingDecision] | None = None) -> list[dict[str, Any]]:
        """One row per candidate of each decision: request, hop, router, instance (hex, as people
        read it: ``/health``, READY lines, the benchmark frame's ``worker``), whether it
        was chosen, its score, its score's parts (a column each), why it was left out, the
        decision's margin and tie; a KV router's knobs (``overlap_score_credit``,
        ``prefill_load_scale``, ``temperature``) and the frontend's queue (``priority``,
        ``strict_priority``, ``waited_ms``) as columns too, where the decision has them."""
        rows = []
        for d in self if decisions is None else decisions:
            extra = {**(d.policy or {}), **(d.queue or {})}
            for c in d.candidates:
                rows.append(
                    {
                        "request_id": d.request_id,
                        "model": d.model,
                        "hop": d.hop,
                        "router": d.router,
                        "instance": format_instance_id(c.instance_id),
                        "chosen": c.instance_id == d.chosen,
                        "score": c.score,
                        **c.parts,
                        "excluded": c.excluded,
                        "margin": d.margin,
                        "tie": d.tie,
                        "rule": d.rule,
                        **extra,
                    }
                )
        return rows

    def table(self) -> Any:
        """`rows` as a pandas DataFrame (the ``notebook`` extra has pandas)."""
        import pandas as pd

        return pd.DataFrame(self.rows())
