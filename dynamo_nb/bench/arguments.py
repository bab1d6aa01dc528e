"""What the benchmark commands parse from their flags.

Example:
    >>> comma_separated_sizes("1,8,32")
    (1, 8, 32)
"""

from __future__ import annotations

import argparse

__all__ = ["comma_separated_sizes"]


def comma_separated_sizes(text: str) -> tuple[int, ...]:
    """``"1,4,16"`` as ``(1, 4, 16)``: positive whole numbers, at least one (an argparse ``type``:
    anything else is a usage error that says what to write)."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, like 1,8,32; got {text!r}"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers, like 1,8,32; got {text!r}")
    return sizes
