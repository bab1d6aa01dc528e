"""Sending a prefill and handing its KV to a decode: the one implementation its two callers share.

The frontend's prefill planner (`dynamo_nb.router.prefill_planner`) and a decode worker that got a
request without bootstrap info (`dynamo_nb.disagg.decode`) both send a prefill the same way:

- `prefill_request`: the request with ``max_tokens`` 1 (and the router's ``bootstrap_info``
  when it drew the room);
- `await_params` (fallback path): wait for the prefill's first item and read its
  ``disaggregated_params`` (bootstrap host, port, room; or an engine's own
  ``kv_transfer_params``); a stream that ends, fails, times out or carries bad params is a
  `DisaggregationError` that says which;
- `drain`: read the rest of the prefill stream in the background (its KV is parked once it
  ends), log its failure and tell the caller; the task is held until it is done, and can be
  cancelled together with its decode.

Example:
    >>> from dynamo_nb.llm import PreprocessedRequest
    >>> prefill_request(PreprocessedRequest(token_ids=[1, 2])).stop_conditions.max_tokens
    1

On the fallback path, in short::

    stream = client.round_robin(prefill_request(request).to_dict())
    params = await await_params(stream, timeout=30)     # host, port, room (or kv_transfer_params)
    task = drain(stream, what="prefill")                 # the rest, in the background
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import DisaggregationError, RequestError
from ..llm.bootstrap_info import BootstrapInfo, PrefillResult
from ..llm.protocol import PreprocessedRequest

if TYPE_CHECKING:
    from ..runtime.client import ResponseStream

__all__ = ["ItemWatch", "await_params", "drain", "prefill_request"]

logger = logging.getLogger("dynamo_nb.disagg")

_DRAINS: set[asyncio.Task[None]] = set()  # held until done: a dropped task could be collected mid-run


def prefill_request(request: PreprocessedRequest, info: BootstrapInfo | None = None) -> PreprocessedRequest:
    """The prefill of ``request``: one token, with ``bootstrap_info`` when the room is drawn already."""
    prefill = request.with_max_tokens(1)
    if info is not None:
        prefill.bootstrap_info = info
    return prefill


async def await_params(stream: Any, timeout: float) -> PrefillResult:
    """The ``disaggregated_params`` of the prefill ``stream``'s first item, parsed and checked
    (`PrefillResult.from_params`; the stream goes on).

    Raises:
        DisaggregationError: the prefill ended without output, failed, did not answer within
            ``timeout`` seconds, or sent params that are neither an engine's ``kv_transfer_params``
            nor bootstrap host, port and room.
    """
    try:
        first = await asyncio.wait_for(stream.__anext__(), timeout)
    except StopAsyncIteration:
        raise DisaggregationError("the prefill worker ended its stream without output") from None
    except asyncio.TimeoutError:
        raise DisaggregationError(f"the prefill worker did not answer within {timeout:g} s") from None
    except DisaggregationError:
        raise
    except RequestError as exc:
        raise DisaggregationError(f"the prefill failed: {exc}") from None
    params = first.get("disaggregated_params") if isinstance(first, dict) else None
    return PrefillResult.from_params(params)


class ItemWatch(Protocol):
    """Told of each item of a stream and of its end (the frontend's hung-worker watchdog's
    `dynamo_nb.frontend.watchdog.StreamWatch`)."""

    def item(self, now: float, gap: float | None = None) -> None: ...

    def close(self) -> None: ...


def drain(
    stream: ResponseStream,
    *,
    what: str,
    on_failure: Callable[[RequestError], None] | None = None,
    on_done: Callable[[], None] | None = None,
    watch: ItemWatch | None = None,
) -> asyncio.Task[None]:
    """Read (the rest of) the prefill ``stream`` in the background, then close it.

    ``what`` names it in the warning logged when it fails; ``on_failure(error)`` and
    ``on_done()`` report how it ended; ``watch`` is told of the item with the first token (the
    prefill done: the items before it only say where its KV goes) and of the end.
    """

    started = False

    async def run() -> None:
        nonlocal started
        started = True
        try:
            async for item in stream:
                if watch is not None and item.get("token_ids"):  # its token: the prefill's work is done
                    watch.item(time.perf_counter())
            if on_done is not None:
                on_done()
        except RequestError as exc:
            logger.warning("%s failed: %s", what, exc)
            if on_failure is not None:
                on_failure(exc)
        finally:
            if watch is not None:
                watch.close()
            await stream.aclose()

    def closed_unstarted(task: asyncio.Task[None]) -> None:
        _DRAINS.discard(task)
        if not started:  # cancelled before its first step: ``run``'s finally never ran
            if watch is not None:
                watch.close()
            closing = asyncio.get_running_loop().create_task(stream.aclose())
            _DRAINS.add(closing)
            closing.add_done_callback(_DRAINS.discard)

    task = asyncio.get_running_loop().create_task(run(), name=f"dynamo_nb {what}")
    _DRAINS.add(task)
    task.add_done_callback(closed_unstarted)
    return task
