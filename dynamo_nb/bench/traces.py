"""Request traces as DataFrames: the frontend's own (``--request-trace``), Mooncake's public
format, and synthetic ones with a chosen prefix structure and arrival process.

A trace has one row per request: ``timestamp_ms`` (arrival, from the trace's start),
``input_length``, ``output_length`` and ``hash_ids`` (the prompt's blocks: equal ids are equal
blocks, so shared prefixes survive without the text); the frontend's traces add what it
measured (``ttft_ms``, ``avg_itl_ms``, ``total_time_ms``, ``cached_tokens``, ``path``, and
``worker`` / ``prefill_worker`` as hex ids, as `bench.run` has them). ``df.attrs["block_size"]`` is the tokens per block (Mooncake's: 512; ours: 64).

Example:
    >>> trace = synthetic_trace(6, rate=2.0, prefix_groups=2, prefix_blocks=3, seed=1)
    >>> list(trace.columns)
    ['timestamp_ms', 'input_length', 'output_length', 'hash_ids', 'group']
    >>> sorted({tuple(ids[:3]) for ids in trace["hash_ids"]})  # two shared prefixes of 3 blocks
    [(0, 1, 2), (3, 4, 5)]
    >>> trace["hash_ids"].map(lambda ids: ids[3]).is_unique  # and a block of its own each
    True
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "MOONCAKE_BLOCK_SIZE",
    "read_trace",
    "save_trace",
    "synthetic_trace",
    "trace_token_ids",
    "unseen_blocks",
]

MOONCAKE_BLOCK_SIZE = 512
TRACE_COLUMNS = ["timestamp_ms", "input_length", "output_length", "hash_ids"]


def _open(path: Path) -> IO[str]:
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def _row(record: dict[str, Any], where: str) -> tuple[dict[str, Any], int] | None:
    """One request of a trace line, and the block size it implies (None: not a finished request)."""
    event = record.get("event", record)
    if isinstance(event, dict) and event.get("schema") == "dynamo.request.trace.v1":
        if event.get("event_type") != "request_end":
            return None
        request = event.get("request") or {}
        replay = request.get("replay") or {}
        if "input_length" not in replay:
            raise ConfigError(f"{where}: a dynamo.request.trace.v1 request_end without replay.input_length")
        row = {
            "timestamp_ms": float(request.get("request_received_ms", event.get("event_time_unix_ms")) or 0),
            "input_length": int(replay["input_length"]),
            "output_length": int(request.get("output_tokens") or 0),
            "hash_ids": list(replay.get("input_sequence_hashes") or []),
        }
        for key in (
            "request_id",
            "model",
            "ttft_ms",
            "avg_itl_ms",
            "total_time_ms",
            "cached_tokens",
            "path",
        ):
            if key in request:
                row[key] = request[key]
        workers = request.get(
            "worker"
        )  # Dynamo's {"decode_worker_id", "prefill_worker_id"}: hex ids as bench.run has them
        if isinstance(workers, dict):
            for column, key in (("worker", "decode_worker_id"), ("prefill_worker", "prefill_worker_id")):
                if isinstance(workers.get(key), int):
                    row[column] = f"{workers[key]:x}"
        return row, int(replay.get("trace_block_size") or 64)
    if "timestamp" in record and "input_length" in record:  # Mooncake
        return {
            "timestamp_ms": float(record["timestamp"]),
            "input_length": int(record["input_length"]),
            "output_length": int(record.get("output_length") or 0),
            "hash_ids": list(record.get("hash_ids") or []),
        }, MOONCAKE_BLOCK_SIZE
    raise ConfigError(
        f"{where}: not a trace line (expected Mooncake's timestamp/input_length/output_length/hash_ids "
        "or a dynamo.request.trace.v1 event)"
    )


def read_trace(path: str | Path) -> pd.DataFrame:
    """The requests of a trace file (JSON lines, ``.gz`` too), sorted by arrival, times from the first.

    Reads the frontend's ``--request-trace`` files (Dynamo's ``dynamo.request.trace.v1``) and
    Mooncake's (``timestamp``, ``input_length``, ``output_length``, ``hash_ids``)."""
    import pandas as pd

    path = Path(path)
    rows, sizes = [], set()
    with _open(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise ConfigError(f"{path}:{number}: not JSON ({exc})") from None
            parsed = _row(record, f"{path}:{number}")
            if parsed is not None:
                rows.append(parsed[0])
                sizes.add(parsed[1])
    if len(sizes) > 1:
        raise ConfigError(f"{path}: lines of several block sizes {sorted(sizes)}: one trace has one")
    frame = pd.DataFrame(rows, columns=None if rows else TRACE_COLUMNS)
    if rows:
        frame = frame.sort_values("timestamp_ms", kind="stable").reset_index(drop=True)
        frame["timestamp_ms"] -= frame["timestamp_ms"].iloc[0]
    frame.attrs["block_size"] = sizes.pop() if sizes else MOONCAKE_BLOCK_SIZE
    return frame


def save_trace(trace: pd.DataFrame, path: str | Path) -> Path:
    """Write ``trace`` in Mooncake's format (one JSON line per request)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for row in trace[TRACE_COLUMNS].itertuples(index=False):
            record = {
                "timestamp": round(float(row.timestamp_ms), 3),
                "input_length": int(row.input_length),
                "output_length": int(row.output_length),
                "hash_ids": [int(h) for h in row.hash_ids],
            }
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
    return path


def synthetic_trace(
    requests: int,
    *,
    rate: float,
    prefix_groups: int = 4,
    prefix_blocks: int = 8,
    user_blocks: int = 1,
    output_length: int = 64,
    block_size: int = 64,
    arrival: str = "poisson",
    seed: int = 0,
) -> pd.DataFrame:
    """``requests`` requests at ``rate`` per second (``poisson`` or ``uniform`` arrivals), each a
    shared prefix of ``prefix_blocks`` blocks (one of ``prefix_groups``, drawn at random) and
    ``user_blocks`` blocks of its own; ``group`` names the prefix."""
    import pandas as pd

    if requests < 1 or rate <= 0 or prefix_groups < 1 or prefix_blocks < 0 or user_blocks < 1:
        raise ConfigError("synthetic_trace: requests, rate, prefix_groups and user_blocks must be positive")
    if arrival not in ("poisson", "uniform"):
        raise ConfigError(f"synthetic_trace: arrival {arrival!r}: use 'poisson' or 'uniform'")
    rng = random.Random(seed)
    next_id = prefix_groups * prefix_blocks
    rows, now = [], 0.0
    for _ in range(requests):
        group = rng.randrange(prefix_groups)
        ids = list(range(group * prefix_blocks, (group + 1) * prefix_blocks))
        ids += list(range(next_id, next_id + user_blocks))
        next_id += user_blocks
        rows.append([now * 1000, len(ids) * block_size, output_length, ids, group])
        now += rng.expovariate(rate) if arrival == "poisson" else 1 / rate
    frame = pd.DataFrame(rows, columns=[*TRACE_COLUMNS, "group"])
    frame.attrs["block_size"] = block_size
    return frame


def unseen_blocks(trace: pd.DataFrame, run: int) -> pd.DataFrame:
    """A copy of ``trace`` whose blocks are new for run number ``run`` (≥ 1): every hash id moved
    past any an earlier run sent, so an engine that served those runs has none of them cached and
    the trace's own sharing (its prefixes) is kept. Send one trace twice, or two traces with the
    same ids (two loads of `synthetic_trace` with one seed), and the second finds its prompts
    cached: a live run a cold replay cannot match.

    Example:
        >>> trace = synthetic_trace(2, rate=1.0, prefix_groups=1, prefix_blocks=1, seed=1)
        >>> [list(ids) for ids in unseen_blocks(trace, 1)["hash_ids"]]
        [[1000000000, 1000000001], [1000000000, 1000000002]]
    """
    if run < 1:
        raise ConfigError(f"unseen_blocks: run {run}: number the runs from 1 (0 is the trace as it is)")
    moved = trace.copy()
    moved["hash_ids"] = [[int(block) + run * _RUN_STRIDE for block in ids] for ids in trace["hash_ids"]]
    return moved


_RUN_STRIDE = 1_000_000_000  # more blocks than any trace has (Mooncake's day: ~10⁷)


def in_arrival_order(trace: pd.DataFrame) -> tuple[pd.DataFrame, float, float]:
    """``trace`` sorted by arrival, its first arrival (ms) and its offered rate (requests/s over
    the span of its arrivals): what a replay, offline or live, sends and records as ``rate``.

    Example:
        >>> order, origin_ms, rate = in_arrival_order(synthetic_trace(5, rate=4.0, arrival="uniform"))
        >>> origin_ms, rate
        (0.0, 4.0)
    """
    order = trace.sort_values("timestamp_ms", kind="stable")
    if not len(order):
        return order, 0.0, 0.0
    origin_ms = float(order["timestamp_ms"].iloc[0])
    span = (float(order["timestamp_ms"].iloc[-1]) - origin_ms) / 1000.0
    return order, origin_ms, round((len(order) - 1) / span, 3) if span > 0 else float(len(order))


def trace_token_ids(hash_ids: list[int], input_length: int, block_size: int, vocab: int = 2000) -> list[int]:
    """Token ids for a trace's request: each block id stands for the same ``block_size`` tokens
    every time (so equal ids are a shared prefix), cut to ``input_length``.

    Example:
        >>> a, b = trace_token_ids([7, 8], 100, 64), trace_token_ids([7, 9], 100, 64)
        >>> a[:64] == b[:64], a[64:] == b[64:], len(a)
        (True, False, 100)
    """
    tokens: list[int] = []
    for block in hash_ids:
        rng = random.Random(block)
        tokens.extend(rng.randrange(10, vocab) for _ in range(block_size))
        if len(tokens) >= input_length:
            break
    while len(tokens) < input_length:  # a trace whose blocks do not cover its length
        tokens.append(10 + len(tokens) % (vocab - 10))
    return tokens[:input_length]
