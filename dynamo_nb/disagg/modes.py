"""What a worker's ``--mode`` makes of its engine: aggregated, prefill or decode.

Example:
    >>> WorkerRole("prefill", "dynamo.prefill.generate").kinds
    ['prefill']
    >>> WorkerRole("both", "dynamo.backend.generate")
    Traceback (most recent call last):
    ...
    dynamo_nb.errors.ConfigError: mode (--mode) must be one of aggregated, prefill, decode, got 'both'
    >>> WorkerRole("decode", "dynamo.backend.generate").kinds
    ['chat', 'completions', 'decode']
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..runtime.names import DEFAULT_WORKER_ENDPOINT
from ..settings import Settings, greater_than, setting
from .decode import DecodeHandler
from .roles import DisaggregatedEngine, GeneratingEngine

if TYPE_CHECKING:
    from ..llm.register import EngineMethod
    from ..runtime.distributed import DistributedRuntime

__all__ = ["DEFAULT_PREFILL_ENDPOINT", "FLAG_GROUP", "WORKER_MODES", "WorkerRole"]

logger = logging.getLogger("dynamo_nb.disagg")

WORKER_MODES = ("aggregated", "prefill", "decode")
DEFAULT_PREFILL_ENDPOINT = "dynamo.prefill.generate"
FLAG_GROUP = "disaggregated serving"
"""The ``--help`` group of the role's flags (an engine worker adds ``--kv-timeout`` to it)."""


@dataclass(frozen=True)
class WorkerRole(Settings):
    """What ``--mode`` makes of an engine: where it serves, what its model card says, and what
    the role starts. Built once, in a worker's ``main``, from its flags (`from_args`).

    - ``aggregated``: ``engine.generate`` at ``endpoint``;
    - ``prefill``: ``engine.prefill`` at the prefill endpoint, card kind ``prefill``; the engine's
      bootstrap server is started (``bootstrap_host``, ``bootstrap_port``, ``kv_ttl``,
      ``bootstrap_advertise_host``, the two hosts as `dynamo_nb.runtime.addresses` picks them: a no-op
      for an engine whose KV moves by its own means) and its ``handoff_endpoint`` published as
      the card's ``disaggregated_endpoint`` (unless ``publish_handoff`` is off, the
      ``--no-bootstrap-endpoint`` flag: the fallback path);
    - ``decode``: a `DecodeHandler` at ``endpoint`` (it asks a prefill worker at
      ``prefill_endpoint`` itself for requests without bootstrap info), card kinds chat,
      completions and decode.

    Attributes:
        mode: ``aggregated``, ``prefill`` or ``decode``.
        endpoint: where the worker serves (a prefill worker: its prefill endpoint).
        prefill_endpoint: where prefill workers serve (a decode worker's own prefill client).
        kv_timeout: seconds a decode engine waits for its prefill's KV (the engine reads it, as
            ``--kv-timeout``, when its worker builds it).
    """

    mode: str = setting(
        "aggregated",
        flag="--mode",
        choices=WORKER_MODES,
        group=FLAG_GROUP,
        help="worker role: aggregated (prefill + decode), prefill (serves at --prefill-endpoint, parks "
        "KV caches in its bootstrap server) or decode (serves at --endpoint, fetches them)",
    )
    endpoint: str = (
        DEFAULT_WORKER_ENDPOINT  # --endpoint (each program's own default), or for prefill --prefill-endpoint
    )
    prefill_endpoint: str = setting(
        DEFAULT_PREFILL_ENDPOINT,
        flag="--prefill-endpoint",
        group=FLAG_GROUP,
        help="where prefill workers serve; a decode worker asks one itself when a request comes without "
        "bootstrap info",
    )
    bootstrap_host: str | None = setting(  # None: the runtime's own address (`AddressRule`)
        None,
        flag="--bootstrap-host",
        env="BOOTSTRAP_HOST",
        group=FLAG_GROUP,
        default_text="as --tcp-host",
        help="prefill: the host the bootstrap server (decode workers fetch KV caches from it) listens on",
    )
    bootstrap_advertise_host: str | None = setting(
        None,
        flag="--bootstrap-advertise-host",
        env="BOOTSTRAP_ADVERTISE_HOST",
        group=FLAG_GROUP,
        default_text="--bootstrap-host, or for 0.0.0.0 the address that reaches discovery; never a wildcard",
        help="prefill: the host decode workers are told to fetch from",
    )
    bootstrap_port: int = setting(
        0, flag="--bootstrap-port", group=FLAG_GROUP, default_text="0, a free one", help="prefill: its port"
    )
    publish_handoff: bool = setting(
        True,
        flag="--no-bootstrap-endpoint",
        negate=True,
        group=FLAG_GROUP,
        default_text="off",
        help="prefill: do not publish the bootstrap server as disaggregated_endpoint, so routers take the "
        "fallback path (wait for disaggregated_params), as with engines that have none",
    )
    kv_ttl: float = setting(
        60.0,
        flag="--kv-ttl",
        group=FLAG_GROUP,
        help="prefill: seconds a parked KV cache waits for its decode before it is dropped",
    )
    kv_timeout: float = setting(
        30.0,
        flag="--kv-timeout",
        group=FLAG_GROUP,
        check=greater_than(0, "seconds"),
        help="decode: seconds to wait for a prefill's KV cache",
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace, **overrides: Any) -> WorkerRole:
        """The role an engine worker's flags give (`dynamo_nb.flags.add_disagg_args`: ``--mode``,
        ``--endpoint``, ``--prefill-endpoint``, ``--bootstrap-*``, ``--no-bootstrap-endpoint``,
        ``--kv-ttl``, ``--kv-timeout``): a prefill worker serves at its prefill endpoint."""
        endpoint = args.prefill_endpoint if args.mode == "prefill" else args.endpoint
        return super().from_args(args, **{"endpoint": endpoint, **overrides})

    @property
    def kinds(self) -> list[str] | None:
        """The model card's kinds (None: chat and completions, as the model folder allows)."""
        return {"prefill": ["prefill"], "decode": ["chat", "completions", "decode"]}.get(self.mode)

    async def method(
        self, runtime: DistributedRuntime, engine: GeneratingEngine
    ) -> tuple[EngineMethod, dict[str, Any] | None]:
        """The engine method to serve and the card's runtime config; starts what the role needs
        (the prefill role's bootstrap server, the decode role's prefill client)."""
        if self.mode == "aggregated":
            return engine.generate, None
        if not isinstance(engine, DisaggregatedEngine):
            raise ConfigError(
                f"--mode {self.mode}: {type(engine).__name__} has no prefill and decode roles; implement "
                "DisaggregatedEngine (mix in dynamo_nb.disagg.BootstrapRole) or run it with --mode aggregated"
            )
        if self.mode == "prefill":
            # by default where the TCP plane listens and what it advertises
            rule = await runtime.addresses.resolve()
            listen = self.bootstrap_host or runtime.listen_host or rule.listen(None)
            asked = self.bootstrap_advertise_host or (
                runtime.advertise_host if self.bootstrap_host is None else None
            )
            advertise = rule.advertise(listen, asked, what="the bootstrap server")
            await engine.start_bootstrap(
                listen, self.bootstrap_port, ttl=self.kv_ttl, advertise_host=advertise
            )
            published = engine.handoff_endpoint if self.publish_handoff else None
            return engine.prefill, {"disaggregated_endpoint": published}
        if self.mode == "decode":
            try:  # to ask a prefill worker itself for requests that come without bootstrap info
                prefill = await runtime.endpoint(self.prefill_endpoint).client()
            except ConfigError as exc:  # e.g. static TCP: no address for the prefill workers
                logger.warning("no prefill client (%s): such requests run here", exc)
                prefill = None
            return DecodeHandler(engine, prefill).generate, None
        raise ConfigError(f"mode (--mode) must be one of {', '.join(WORKER_MODES)}, got {self.mode!r}")
