"""A notebook's measured sentences as checks.

Prose is written once; numbers are measured on every run. A sentence that states a measured
comparison ("the fast path's TTFT is below the fallback's") belongs in a `claim`: the cell
prints the sentence with the values it rests on, and fails with `ClaimError` when they do not
bear it out, so a notebook cannot say what its own numbers contradict. The markdown then says
what to look for; the claim says what was found.

Example:
    >>> claim("the fast path's TTFT p50 is below the fallback's", 12.1 < 14.4, fast_ms=12.1, fallback_ms=14.4)
    ✓ the fast path's TTFT p50 is below the fallback's (fast_ms=12.1, fallback_ms=14.4)
    >>> claim("both stacks answered every request", True)
    ✓ both stacks answered every request
    >>> import numpy as np
    >>> claim("more requests per second", True, req_per_s=(np.float64(30.81), np.float64(16.7)))
    ✓ more requests per second (req_per_s=(30.8, 16.7))
    >>> claim("the worst round beats the best", True, worst={"req_per_s": np.float64(30.51)})
    ✓ the worst round beats the best (worst={req_per_s: 30.5})
"""

from __future__ import annotations

from typing import Any

from ..errors import ClaimError

__all__ = ["ClaimError", "claim", "within"]


def _shown(value: Any) -> str:
    """A measured value as a reader wants it: 3 significant digits, numpy scalars as numbers,
    pairs, lists and dicts item by item."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_shown(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_shown(item) for item in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a numpy or torch scalar
        value = value.item()
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def claim(sentence: str, holds: Any, **measured: Any) -> None:
    """Print ``✓ sentence (name=value, …)`` when ``holds`` is true; else raise `ClaimError`
    with the sentence and the values, so the cell (and the notebook's test) fails.

    Example:
        >>> claim("least-loaded's p90 is lower", 80.0 < 75.0, least_loaded_ms=80.0, round_robin_ms=75.0)
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ClaimError: not borne out: least-loaded's p90 is lower (least_loaded_ms=80, round_robin_ms=75)
    """
    values = ", ".join(f"{name}={_shown(value)}" for name, value in measured.items())
    line = f"{sentence} ({values})" if values else sentence
    if not holds:
        raise ClaimError(f"not borne out: {line}")
    print(f"✓ {line}")


def within(a: float, b: float, relative: float) -> bool:
    """Whether ``a`` and ``b`` differ by at most ``relative`` of the larger: for a sentence that
    says two measurements are the same within noise, with its bound.

    Example:
        >>> within(26.1, 26.3, 0.05), within(24.2, 30.3, 0.05)
        (True, False)
    """
    return abs(a - b) <= relative * max(abs(a), abs(b))
