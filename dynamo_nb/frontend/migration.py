"""Migration: a request whose worker went down mid-stream is carried on by another worker, the
client seeing one stream (Dynamo's ``--migration-limit``).

The new worker gets the prompt plus the tokens already streamed (`PreprocessedRequest.continued`),
``max_tokens`` less them (without one, the rest of the model's context), routed (and, with
prefill workers, prefilled) afresh. It is not moved when the frontend runs with
``--migration-limit 0``, when the request named its instance (``nvext.backend_instance_id``),
or after the limit; then the stream ends with the error.

Example::

    migration = Migration(limit=3, reopen=pipeline.open_planned, counter=metrics.migrations)
    first = await migration.carry_on(model, request, generated, count, down, outcome)
    # None: it could not (outcome.error says why); else the new stream's first item
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..errors import InstanceDownError, RequestError
from ..llm.protocol import PreprocessedRequest

if TYPE_CHECKING:
    from .pipeline import Opened
    from .relay import Outcome
    from .served_models import ServedModel

__all__ = ["DEFAULT_MIGRATION_LIMIT", "Migration"]

logger = logging.getLogger("dynamo_nb.frontend")

DEFAULT_MIGRATION_LIMIT = 3  # as Dynamo's guidance

Reopen = Callable[["ServedModel", PreprocessedRequest, str], Awaitable["Opened"]]
"""Opens a request (its model, the request, its id) afresh, planned and routed: its stream, first
item, prefill plan and routing decision."""


class Migration:
    """Carries requests on after their worker went down; see the module docstring.

    Args:
        limit: how many times one request may move (0: never).
        reopen: opens the continued request (the pipeline's plan → open step).
        counter: a Prometheus counter labelled by model, counting migrations that succeeded.
    """

    def __init__(self, limit: int, reopen: Reopen, counter: Any) -> None:
        self.limit = limit
        self._reopen = reopen
        self._counter = counter

    @property
    def enabled(self) -> bool:
        """Whether requests move at all (the relay then keeps the tokens it streamed)."""
        return self.limit > 0

    async def carry_on(
        self,
        model: ServedModel,
        request: PreprocessedRequest,
        generated: list[int] | None,
        count: int,
        down: InstanceDownError,
        outcome: Outcome,
    ) -> Any | None:
        """The first item of ``request`` carried on by another worker after ``generated`` tokens
        (``count`` came), with ``outcome`` now served by the new stream; None when it cannot
        (``outcome`` then holds the error, or the end: every token came but the final item)."""
        asked = request.stop_conditions.max_tokens
        if asked is not None and count >= asked:
            outcome.finish_reason = "length"  # every token came; only the last item was lost
            return None
        if generated is None:
            outcome.error = f"{down} (no migration: the frontend runs with --migration-limit 0)"
            return None
        if request.routing and "backend_instance_id" in request.routing:
            outcome.error = f"{down} (the request named this instance, so it is not moved)"
            return None
        if outcome.migrations >= self.limit:
            outcome.error = (
                f"{down} (after {outcome.migrations} migrations, the frontend's --migration-limit)"
            )
            return None
        outcome.migrations += 1
        logger.warning(
            "a worker of %r went down after %d tokens of a request (%s): another carries it on (%d of at most %d)",
            model.name,
            len(generated),
            down,
            outcome.migrations,
            self.limit,
        )
        if asked is None and model.card.context_length:  # else every leg starts a full budget
            request = request.with_max_tokens(model.card.context_length - len(request.token_ids))
        try:
            opened = await self._reopen(model, request.continued(generated), outcome.request_id)
        except RequestError as exc:
            outcome.error = f"{down}; no other worker could carry the request on: {exc}"
            return None
        self._counter.labels(model.name).inc()
        # a unary answer's headers and the last chunk's nvext say so
        outcome.served_by(opened.stream, opened.plan, opened.decision)
        return opened.first
