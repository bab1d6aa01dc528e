"""Migration: a request whose worker went down mid-stream is carried on by another worker, the
client seeing one stream (Dynamo's ``--migration-limit``).

The new worker gets the prompt plus the tokens already streamed (`PreprocessedRequest.continued`),
``max_tokens`` less them (without one, the rest of the model's context), routed (and, with
prefill workers, prefilled) afresh. It is not moved when the frontend runs with
``--migration-limit 0``, when the request named its instance (``nvext.backend_instance_id``),
or after the limit; then the stream ends with the error.

Example::

    migration = Migration(limit=3, reopen=pipeline.open_planned, counter=metrics.migrations)
    moving = migration.follow(model, request, ticket)   # one per request: its own state
    moving.record(token_ids)                                 # as they stream
    moved = await moving.carry_on(count, down)               # after an InstanceDownError
    # an `Opened` (the new stream and its first item), or a `Stopped` saying why not
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InstanceDownError, RequestError
from ..llm.protocol import PreprocessedRequest
from ..router.decision import RoutingTicket

if TYPE_CHECKING:
    from .pipeline import Opened
    from .served_models import ServedModel

__all__ = ["DEFAULT_MIGRATION_LIMIT", "MigratingRequest", "Migration", "Stopped"]

logger = logging.getLogger("dynamo_nb.frontend")

DEFAULT_MIGRATION_LIMIT = 3  # as Dynamo's guidance

Reopen = Callable[["ServedModel", PreprocessedRequest, RoutingTicket], Awaitable["Opened"]]
"""Opens a request (its model, the request, its id) afresh, planned and routed: its stream, first
item, prefill plan and routing decision."""


@dataclass(frozen=True)
class Stopped:
    """A request that was not carried on: how its stream ends.

    Attributes:
        error: why not (the stream ends with it), or None when nothing was lost;
        finish_reason: OpenAI's, when every token came and only the last item was lost.
    """

    error: str | None = None
    finish_reason: str | None = None


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
        """Whether requests move at all (a request then keeps the tokens it streamed)."""
        return self.limit > 0

    def follow(
        self, model: ServedModel, request: PreprocessedRequest, ticket: RoutingTicket
    ) -> MigratingRequest:
        """The migration state of one request: what it streamed, how often it moved (its moves
        routed under its ``ticket``)."""
        return MigratingRequest(self, model, request, ticket)


class MigratingRequest:
    """One request's migration state, owned here: the tokens it streamed (kept only when
    migration is on) and the moves so far.

    Attributes:
        generated: the token ids streamed so far (None: migration is off, nothing is kept).
        moves: how often another worker carried it on.
    """

    def __init__(
        self, migration: Migration, model: ServedModel, request: PreprocessedRequest, ticket: RoutingTicket
    ) -> None:
        self._migration = migration
        self._model = model
        self._request = request
        self._ticket = ticket
        self.generated: list[int] | None = [] if migration.enabled else None
        self.moves = 0

    def record(self, token_ids: Sequence[int]) -> None:
        """Tokens streamed (kept for a migration)."""
        if self.generated is not None:
            self.generated.extend(token_ids)

    async def carry_on(self, count: int, down: InstanceDownError) -> Opened | Stopped:
        """The request carried on by another worker after its worker went down (``count``
        tokens came): the new stream opened, or `Stopped` when it is not moved."""
        migration, model, request, generated = self._migration, self._model, self._request, self.generated
        asked = request.stop_conditions.max_tokens
        if asked is not None and count >= asked:
            return Stopped(finish_reason="length")  # every token came; only the last item was lost
        if generated is None:
            return Stopped(f"{down} (no migration: the frontend runs with --migration-limit 0)")
        if request.routing and "backend_instance_id" in request.routing:
            return Stopped(f"{down} (the request named this instance, so it is not moved)")
        if self.moves >= migration.limit:
            return Stopped(f"{down} (after {self.moves} migrations, the frontend's --migration-limit)")
        self.moves += 1
        logger.warning(
            "a worker of %r went down after %d tokens of a request (%s): another carries it on (%d of at most %d)",
            model.name,
            len(generated),
            down,
            self.moves,
            migration.limit,
        )
        if asked is None and model.card.context_length:  # else every leg starts a full budget
            request = request.with_max_tokens(model.card.context_length - len(request.token_ids))
        try:
            opened = await migration._reopen(model, request.continued(generated), self._ticket)
        except RequestError as exc:
            return Stopped(f"{down}; no other worker could carry the request on: {exc}")
        migration._counter.labels(model.name).inc()
        return opened
