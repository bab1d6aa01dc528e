"""The request a log line is about: set where a request is handled, added to every record.

The frontend sets the request's id for the task that serves it; a worker sets it (the id that
travelled with the request) for its handler's task. `RequestIdFilter`, installed on the log
handlers of every component, prefixes each record about a request with ``[request ID]``, so one
request can be followed through the frontend's, the prefill worker's and the decode worker's logs.

Example:
    >>> import logging
    >>> record = logging.LogRecord("demo", logging.INFO, __file__, 1, "prefill done", None, None)
    >>> with request_id_scope("req-7"):
    ...     _ = RequestIdFilter().filter(record)
    >>> record.getMessage()
    '[request req-7] prefill done'
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator

__all__ = ["RequestIdFilter", "current_request_id", "request_id_scope"]

_REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("dynamo_nb_request_id", default=None)


def current_request_id() -> str | None:
    """The id of the request this task handles (None outside a request)."""
    return _REQUEST_ID.get()


def set_request_id(request_id: str | None) -> None:
    """Say that this task handles ``request_id`` (a task's context is its own: nothing to undo)."""
    _REQUEST_ID.set(request_id)


@contextlib.contextmanager
def request_id_scope(request_id: str | None) -> Iterator[None]:
    """Within the block, log records are about ``request_id``."""
    token = _REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        _REQUEST_ID.reset(token)


class RequestIdFilter(logging.Filter):
    """Prefix a record logged while a request is handled with ``[request ID]`` (once)."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = _REQUEST_ID.get()
        if request_id is not None and not getattr(record, "request_id", None):
            record.request_id = request_id
            record.msg = f"[request {request_id.replace('%', '%%')}] {record.msg}"
        return True
