"""Dynamo's ``dynamo.runtime.logging``: ``configure_dynamo_logging``, on the standard library.

Change ``from dynamo.runtime.logging import configure_dynamo_logging`` to
``from dynamo_nb.compat.runtime.logging import configure_dynamo_logging``.

Differences from Dynamo: records are plain text lines (no JSONL mode, no OpenTelemetry
export); ``DYN_LOG`` sets the level (``debug``, ``info``, ``warn``, ``error``) but its
per-target filters (``DYN_LOG=info,dynamo_runtime=debug``) apply only the first item.
"""

from __future__ import annotations

import logging as _logging
import os
import sys

__all__ = ["configure_dynamo_logging"]

_LEVELS = {
    "trace": "DEBUG",
    "debug": "DEBUG",
    "info": "INFO",
    "warn": "WARNING",
    "warning": "WARNING",
    "error": "ERROR",
}


def configure_dynamo_logging(service_name: str | None = None, worker_id: int | None = None) -> None:
    """Log to stderr at ``DYN_LOG``'s level (default info), each line prefixed with
    ``[service:worker]`` when they are given; replaces the root logger's handlers, as Dynamo's does.

    Example::

        configure_dynamo_logging(service_name="backend")
        logging.getLogger(__name__).info("Serving endpoint")   # ... INFO [backend] __main__: Serving endpoint
    """
    first = os.environ.get("DYN_LOG", "info").split(",", 1)[0].strip().lower()
    level = _LEVELS.get(first, "INFO")
    prefix = ""
    if service_name is not None:
        prefix = f"[{service_name}{'' if worker_id is None else f':{worker_id}'}] "
    handler = _logging.StreamHandler(sys.stderr)
    handler.setFormatter(_logging.Formatter(f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s"))
    root = _logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
