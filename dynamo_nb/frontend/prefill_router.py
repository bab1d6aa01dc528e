"""The frontend's prefill router: disaggregated prefill/decode, fast path and fallback path.

It is active for a model once a prefill worker of that model has published its card (kind
``prefill``); until then the model is served aggregated. For each request it picks the
prefill worker first (round robin; with ``--router-mode kv`` the KV router's choice, by
prefix overlap and the load it routed there) and then:

- **fast path**, when that worker published ``disaggregated_endpoint`` in its runtime config:
  draw a ``bootstrap_room``, send the prefill (``max_tokens`` 1, with ``bootstrap_info``)
  straight to that worker as a background task — its stream drained, its errors logged and
  counted, cancelled together with its decode — and hand back the decode request with the
  same ``bootstrap_info`` at once, so decode does not wait for a prefill round trip;
- **fallback path**, when it published none: send the prefill, wait for its first item,
  require ``disaggregated_params`` (missing keys are a `DisaggregationError` naming them)
  and hand them to decode as ``prefill_result``.

If the prefill cannot be sent, or its params are bad, the request is served aggregated with
a warning (``extra_args.aggregated``: the decode worker generates it whole), unless the
router enforces disaggregation: then `DisaggregationError` (the frontend answers 503). The
decode request keeps the request's own ``max_tokens``.

Example:
    >>> plan = await router.plan(engine_request)      # doctest: +SKIP
    >>> plan.path, plan.prefill_worker, plan.room     # doctest: +SKIP
    ('fast', 7421…, 4611686018427387904)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._ids import new_request_id
from ..disagg.rooms import BootstrapInfo, draw_room
from ..errors import DisaggregationError, NoInstancesError, RequestError

if TYPE_CHECKING:
    from .._client import Client, ResponseStream
    from ..kv import KvRouter

__all__ = ["DISAGG_PATHS", "PrefillPlan", "PrefillRouter"]

logger = logging.getLogger("dynamo_nb.frontend")

DISAGG_PATHS = ("fast", "fallback", "aggregated")


@dataclass
class PrefillPlan:
    """How one request is served: the decode request to send and what was chosen for it.

    Attributes:
        path: ``fast``, ``fallback`` or ``aggregated``.
        decode_request: the request for the decode worker (``bootstrap_info`` on the fast
            path, ``prefill_result`` on the fallback path, ``extra_args.aggregated`` else).
        prefill_worker: the prefill instance id (None when aggregated).
        room: the bootstrap room (None when aggregated).
        reason: why it is aggregated, when it is.
        events: what happened, in order (``prefill sent``, ``prefill first item``,
            ``decode handed back``, ``prefill done`` / ``prefill failed`` …).
    """

    path: str
    decode_request: dict[str, Any]
    prefill_worker: int | None = None
    room: int | None = None
    reason: str = ""
    events: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def cancel(self) -> None:
        """Stop the background prefill stream (when the decode ends or is cancelled)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()


class PrefillRouter:
    """Routes the prefill half of a model's requests; see the module docstring.

    Attributes:
        endpoint: the prefill workers' endpoint path.
        errors_total: prefills that failed (before or after their decode was sent).
    """

    def __init__(
        self,
        endpoint: str,
        client: Client,
        *,
        enforce: bool = False,
        prefill_timeout: float = 30.0,
        on_error: Callable[[], None] | None = None,
        kv_router: KvRouter | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.client = client
        self.kv_router = kv_router
        self.enforce = enforce
        self.prefill_timeout = prefill_timeout
        self.errors_total = 0
        self._on_error = on_error
        self._endpoints: dict[int, dict[str, Any] | None] = {}  # instance id → disaggregated_endpoint
        self._keys: dict[str, int] = {}  # card key → instance id
        self._turn = 0

    def add_worker(self, key: str, instance_id: int, disaggregated_endpoint: dict[str, Any] | None) -> None:
        """A prefill worker's card arrived (``disaggregated_endpoint`` None: fallback path for it)."""
        self._keys[key] = instance_id
        self._endpoints[instance_id] = disaggregated_endpoint

    def remove_worker(self, key: str) -> bool:
        """Its card left; True when the key was one of this router's."""
        instance_id = self._keys.pop(key, None)
        if instance_id is None:
            return False
        self._endpoints.pop(instance_id, None)
        return True

    @property
    def active(self) -> bool:
        """Whether any prefill worker of the model has a card now."""
        return bool(self._keys)

    def _pick(self, request: dict[str, Any]) -> tuple[int, Callable[[dict[str, Any]], ResponseStream]]:
        """The prefill instance for ``request`` and a function that sends it there: the KV router's
        choice (its load tracked until the prefill ends), else round robin over the instances now."""
        if self.kv_router is not None:
            kv_router, request_id = self.kv_router, new_request_id()
            decision = kv_router.choose(list(request.get("token_ids") or []), request_id)

            def send_tracked(prefill_request: dict[str, Any]) -> ResponseStream:
                try:
                    stream = self.client.direct(prefill_request, decision.worker)
                except BaseException:
                    kv_router.finished(decision.worker, request_id)
                    raise
                return kv_router.track(stream, decision, request_id)  # type: ignore[return-value]

            return decision.worker, send_tracked
        ids = sorted(self.client.instance_ids())
        if not ids:
            raise NoInstancesError(f"no prefill worker serves {self.endpoint}", endpoint=self.endpoint)
        chosen = ids[self._turn % len(ids)]
        self._turn += 1
        return chosen, lambda prefill_request: self.client.direct(prefill_request, chosen)

    async def plan(self, request: dict[str, Any]) -> PrefillPlan:
        """Start the prefill of ``request`` and say how its decode goes (see the module docstring)."""
        events: list[str] = []
        instance: int | None = None
        try:
            instance, send = self._pick(request)
            stop = {**(request.get("stop_conditions") or {}), "max_tokens": 1}
            prefill_request = {**request, "stop_conditions": stop}
            endpoint = self._endpoints.get(instance)
            if endpoint is not None:
                info = BootstrapInfo.parse(
                    {**endpoint, "bootstrap_room": draw_room()}, "disaggregated_endpoint"
                )
                stream = send({**prefill_request, "bootstrap_info": info.to_dict()})
                plan = PrefillPlan("fast", {**request, "bootstrap_info": info.to_dict()}, instance, info.room)
                plan.events = events
                plan.task = self._drain(stream, plan)  # sends it: a background task
                events.append("decode handed back")
                return plan
            stream = send(prefill_request)
            events.append("prefill sent")
            first = await asyncio.wait_for(stream.__anext__(), self.prefill_timeout)
            events.append("prefill first item")
            params = first.get("disaggregated_params") if isinstance(first, dict) else None
            info = BootstrapInfo.parse(params, "the prefill worker's disaggregated_params")
            decode = {**request, "prefill_result": {"disaggregated_params": info.to_dict()}}
            plan = PrefillPlan("fallback", decode, instance, info.room, events=events)
            plan.task = self._drain(stream, plan)
            events.append("decode handed back")
            return plan
        except (RequestError, asyncio.TimeoutError, StopAsyncIteration) as exc:
            reason = _describe(exc, instance)
            self._count_error()
            if self.enforce:
                raise DisaggregationError(
                    f"{reason}; disaggregation is enforced, so the request fails"
                ) from None
            return self.aggregated(request, reason, events)

    def aggregated(
        self, request: dict[str, Any], reason: str, events: list[str] | None = None
    ) -> PrefillPlan:
        """The plan that serves ``request`` on the decode worker alone (logged as a warning)."""
        logger.warning("serving a request aggregated: %s", reason)
        extra = {**(request.get("extra_args") or {}), "aggregated": True}
        clean = {k: v for k, v in request.items() if k not in ("bootstrap_info", "prefill_result")}
        return PrefillPlan("aggregated", {**clean, "extra_args": extra}, reason=reason, events=events or [])

    def handoff_failed(self, plan: PrefillPlan, message: str) -> None:
        """The decode could not take the KV of ``plan`` (e.g. its prefill worker died)."""
        plan.cancel()
        plan.events.append("decode refused the handoff")
        self._count_error()
        logger.warning(
            "prefill → decode handoff failed (%s path, room %s): %s", plan.path, plan.room, message
        )

    def _count_error(self) -> None:
        self.errors_total += 1
        if self._on_error is not None:
            self._on_error()

    def _drain(self, stream: ResponseStream, plan: PrefillPlan) -> asyncio.Task[None]:
        """Read (the rest of) the prefill stream in the background; log and count its failure."""

        async def drain() -> None:
            if plan.path == "fast":
                plan.events.append("prefill sent")
            try:
                async for _ in stream:
                    pass
                plan.events.append("prefill done")
            except RequestError as exc:
                plan.events.append("prefill failed")
                self._count_error()
                logger.warning(
                    "prefill on %x failed (%s path, room %s): %s",
                    plan.prefill_worker or 0,
                    plan.path,
                    plan.room,
                    exc,
                )
            finally:
                await stream.aclose()

        return asyncio.get_running_loop().create_task(drain(), name=f"prefill-{plan.room}")


def _describe(exc: BaseException, instance: int | None) -> str:
    if isinstance(exc, StopAsyncIteration):
        return f"the prefill worker {instance:x} ended its stream without output"
    if isinstance(exc, asyncio.TimeoutError):
        return "the prefill worker did not answer in time"
    where = f" (prefill worker {instance:x})" if instance is not None else ""
    return f"prefill failed{where}: {exc}"
