"""What a worker's ``--mode`` makes of its engine: aggregated, prefill or decode.

Example:
    >>> WorkerRole("prefill", "dynamo.prefill.generate").kinds
    ['prefill']
    >>> WorkerRole("decode", "dynamo.backend.generate").kinds
    ['chat', 'completions', 'decode']
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .decode import DecodeHandler
from .roles import DisaggregatedEngine

if TYPE_CHECKING:
    from ..llm.register import EngineMethod
    from ..runtime.distributed import DistributedRuntime

__all__ = ["WORKER_MODES", "WorkerRole"]

logger = logging.getLogger("dynamo_nb.disagg")

WORKER_MODES = ("aggregated", "prefill", "decode")


@dataclass
class WorkerRole:
    """What ``--mode`` makes of an engine: where it serves and what its model card says.

    - ``aggregated``: ``engine.generate`` at ``--endpoint``;
    - ``prefill``: ``engine.prefill`` at ``--prefill-endpoint``, card kind ``prefill`` with its
      bootstrap server as ``disaggregated_endpoint`` (unless ``--no-bootstrap-endpoint``); an
      engine that moves the KV itself says where with ``handoff_endpoint`` (SGLang's bootstrap
      server; None for vLLM's connector: the fallback path);
    - ``decode``: a `DecodeHandler` at ``--endpoint`` (it asks a prefill worker itself for requests
      without bootstrap info), card kinds chat, completions and decode.
    """

    mode: str
    endpoint: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WorkerRole:
        """The role the flags ``--mode``, ``--endpoint`` and ``--prefill-endpoint`` give."""
        if args.mode not in WORKER_MODES:
            raise ConfigError(f"--mode {args.mode!r}: use one of {', '.join(WORKER_MODES)}")
        return cls(args.mode, args.prefill_endpoint if args.mode == "prefill" else args.endpoint)

    @property
    def kinds(self) -> list[str] | None:
        """The model card's kinds (None: chat and completions, as the model folder allows)."""
        return {"prefill": ["prefill"], "decode": ["chat", "completions", "decode"]}.get(self.mode)

    async def method(
        self, runtime: DistributedRuntime, engine: DisaggregatedEngine, args: argparse.Namespace
    ) -> tuple[EngineMethod, dict[str, Any] | None]:
        """The engine method to serve and the card's runtime config; starts what the role needs
        (the prefill role's bootstrap server, the decode role's prefill client)."""
        if self.mode == "prefill":
            if hasattr(engine, "handoff_endpoint"):  # the engine moves the KV itself (vLLM, SGLang)
                published = None if getattr(args, "no_bootstrap_endpoint", False) else engine.handoff_endpoint
                return engine.prefill, {"disaggregated_endpoint": published}
            bootstrap = await engine.start_bootstrap(
                args.bootstrap_host, args.bootstrap_port, ttl=args.kv_ttl
            )
            published = None if args.no_bootstrap_endpoint else bootstrap.endpoint
            return engine.prefill, {"disaggregated_endpoint": published}
        if self.mode == "decode":
            try:  # to ask a prefill worker itself for requests that come without bootstrap info
                prefill = await runtime.endpoint(args.prefill_endpoint).client()
            except ConfigError as exc:  # e.g. static TCP: no address for the prefill workers
                logger.warning("no prefill client (%s): such requests run here", exc)
                prefill = None
            return DecodeHandler(engine, prefill).generate, None
        return engine.generate, None
