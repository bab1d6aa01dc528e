"""A run's records as a DataFrame: one row per request, the columns `RECORD_COLUMNS` names.

Example:
    >>> records_frame([]).columns[:3].tolist()
    ['label', 'concurrency', 'rate']
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .http_client import RECORD_COLUMNS

__all__ = ["records_frame"]


def records_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The DataFrame of `run` from its record dicts (also used for live redraws and loading JSON)."""
    frame = pd.DataFrame.from_records(records, columns=RECORD_COLUMNS)
    for column in ("ttft_s", "e2e_s", "sent_s", "rate"):
        frame[column] = frame[column].astype(float)
    for column in ("output_tokens", "input_tokens", "status"):
        frame[column] = frame[column].astype("Int64")
    return frame
