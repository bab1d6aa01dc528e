"""The KV router's policy: the three knobs Dynamo 1.7 tunes live, with Dynamo's names.

A worker's cost (`dynamo_nb.router.kv.selector`) is

    prefill_load_scale × (active prompt tokens + prompt tokens − overlap_score_credit × cached
    prefix tokens) / block_size  +  decode_blocks

and the pick is the cheapest at ``temperature`` 0, else a softmax draw. ``overlap_score_credit``
(default 1) is how much a cached prefix block is worth: 0 ignores the caches, above 1 gives them
extra credit (the prefill part can go negative). ``prefill_load_scale`` (default 1; the old
``--kv-overlap-score-weight``) weighs prompt work against decode load. A policy is immutable: a
router swaps the whole object between two decisions, so a change is atomic.

Example:
    >>> policy = RouterPolicy()
    >>> policy.changed({"prefill_load_scale": 32, "router_temperature": 0.1}).to_dict()
    {'overlap_score_credit': 1.0, 'prefill_load_scale': 32.0, 'temperature': 0.1}
    >>> policy.changed({"weight": 2})
    Traceback (most recent call last):
    ...
    dynamo_nb.errors.ConfigError: unknown router policy knob 'weight': use overlap_score_credit, prefill_load_scale or temperature
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ConfigError
from ..settings import Settings, setting

__all__ = ["KNOB_ALIASES", "RouterPolicy"]

KNOB_ALIASES = {  # another name → the knob (Dynamo's flag spellings and the kit's older names)
    "router_kv_overlap_score_credit": "overlap_score_credit",
    "kv_overlap_score_credit": "overlap_score_credit",
    "router_prefill_load_scale": "prefill_load_scale",
    "kv_overlap_score_weight": "prefill_load_scale",
    "overlap_weight": "prefill_load_scale",
    "router_temperature": "temperature",
}


_GROUP = "kv router"


@dataclass(frozen=True)
class RouterPolicy(Settings):
    """The KV router's knobs (see the module docstring); each finite and 0 or more."""

    overlap_score_credit: float = setting(
        1.0,
        flag="--router-kv-overlap-score-credit",
        group=_GROUP,
        help="how much a prefix block a worker already holds takes off its prefill cost; 0 ignores the "
        "caches, above 1 favours them more (Dynamo's name)",
    )
    prefill_load_scale: float = setting(
        1.0,
        flag="--router-prefill-load-scale",
        aliases=("--kv-overlap-score-weight",),
        group=_GROUP,
        help="weight of a worker's prefill blocks against its decode blocks; raise it for TTFT (Dynamo's "
        "name; --kv-overlap-score-weight is its older one)",
    )
    temperature: float = setting(
        0.0,
        flag="--router-temperature",
        group=_GROUP,
        help="0 picks the cheapest worker, more samples by a softmax of the costs",
    )

    def __post_init__(self) -> None:
        for knob, value in self.to_dict().items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"router policy knob {knob} must be a number, got {value!r}")
            try:
                finite = math.isfinite(value)
            except OverflowError:  # an int too large for a float
                finite = False
            if not finite or value < 0:
                raise ConfigError(
                    f"router policy knob {knob} must be finite and 0 or more, got {str(value)[:40]}"
                )
            object.__setattr__(self, knob, float(value))
        super().__post_init__()

    def changed(self, updates: Mapping[str, Any]) -> RouterPolicy:
        """This policy with ``updates`` applied (knob names, or their `KNOB_ALIASES`, with or
        without leading dashes); an unknown knob or a bad value raises `ConfigError`."""
        if not isinstance(updates, Mapping):
            raise ConfigError(
                f"a router policy change is a JSON object of knobs, got {type(updates).__name__}"
            )
        knobs: dict[str, Any] = {}
        for name, value in updates.items():
            key = str(name).lstrip("-").replace("-", "_")
            knob = KNOB_ALIASES.get(key, key)
            if knob not in _KNOBS:
                raise ConfigError(
                    f"unknown router policy knob {name!r}: use overlap_score_credit, prefill_load_scale "
                    "or temperature"
                )
            knobs[knob] = value
        return replace(self, **knobs)

    def to_dict(self) -> dict[str, float]:
        """The knobs by their names (the body of ``GET /router_policy``; every KV routing
        decision records it, so it reads the three fields rather than `dataclasses.asdict`)."""
        return {knob: getattr(self, knob) for knob in _KNOB_ORDER}

    def differences(self, other: RouterPolicy) -> dict[str, tuple[float, float]]:
        """Each knob ``other`` sets differently: name → (this value, other's)."""
        mine, theirs = self.to_dict(), other.to_dict()
        return {knob: (mine[knob], theirs[knob]) for knob in mine if mine[knob] != theirs[knob]}


_KNOB_ORDER = tuple(RouterPolicy.__dataclass_fields__)  # as declared
_KNOBS = frozenset(_KNOB_ORDER)
