"""The roles a disaggregated engine plays: the `DisaggregatedEngine` contract.

An engine with a prefill and a decode role is a `DisaggregatedEngine`. Each side has its own
module: the prefill parks the prompt's KV (`dynamo_nb.disagg.prefill`: `BootstrapRole`,
`prefill_stream`), the decode fetches it (`dynamo_nb.disagg.decode`: `fetch_prompt_kv`,
`DecodeHandler`); what a worker's ``--mode`` makes of the engine is
`dynamo_nb.disagg.modes.WorkerRole`.

Example:
    >>> from dynamo_nb.engines import EchoEngine, MockerEngine
    >>> isinstance(MockerEngine(), DisaggregatedEngine), isinstance(EchoEngine(), DisaggregatedEngine)
    (True, False)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from ..llm.protocol import LLMEngineOutput, PreprocessedRequest
from ..runtime.context import Context

__all__ = ["DisaggregatedEngine", "GeneratingEngine"]


class GeneratingEngine(Protocol):
    """What a worker role asks of any engine (`dynamo_nb.engines.Engine` is one): ``generate``,
    the aggregated role; the prefill and decode roles need a `DisaggregatedEngine`."""

    def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]: ...


@runtime_checkable
class DisaggregatedEngine(Protocol):
    """An engine (`dynamo_nb.engines.Engine`) with the prefill and decode roles of disaggregated serving.

    ``prefill`` yields ``disaggregated_params`` (bootstrap host, port, room) first and parks the
    prompt's KV for its decode; ``decode`` fetches it and goes on from the prefill's first token.
    ``start_bootstrap`` starts the server the prefill role parks KV caches in (a no-op for an
    engine whose KV moves by its own means, as vLLM's connector or SGLang's bootstrap server).

    Attributes:
        kv_timeout: how long the decode role waits for its prefill's KV, in seconds (given to
            the constructor, ``--kv-timeout``).
        handoff_endpoint: where decode workers fetch the KV this engine's prefills park, as
            ``{bootstrap_host, bootstrap_port}``: the prefill worker publishes it in its card as
            ``disaggregated_endpoint``, and the frontend takes the fast path (it draws the
            room). None: the fallback path (the frontend waits for the prefill's params).
            `BootstrapRole`'s is its bootstrap server's, once started.
    """

    kv_timeout: float

    @property
    def handoff_endpoint(self) -> dict[str, Any] | None: ...

    def generate(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]: ...

    def prefill(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]: ...

    def decode(
        self, request: PreprocessedRequest, context: Context | None = None
    ) -> AsyncIterator[LLMEngineOutput]: ...

    async def start_bootstrap(
        self, host: str = "127.0.0.1", port: int = 0, *, ttl: float = 60.0, advertise_host: str | None = None
    ) -> Any: ...
