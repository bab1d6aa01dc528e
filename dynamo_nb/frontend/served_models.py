"""The models a frontend serves: found from model cards in discovery, or given (static mode).

Each model keeps its tokenizer and a client of its endpoint. When the last card of a model
disappears the model leaves ``/v1/models``, but requests naming it get 503 (its workers are
gone) rather than 404 (never heard of it).

Example::

    manager = ModelManager(runtime)
    await manager.watch()                                    # follow cards in discovery
    await manager.add_card(card_from_folder(path, name="tiny"))   # static mode
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, InvalidRequestError, NoInstancesError
from ..llm.card import CARD_PREFIX, STRUCTURED_OUTPUT, ModelCard
from ..llm.guided import GuidedDecoding
from ..llm.protocol import PreprocessedRequest
from ..llm.tokenizer import ModelTokenizer
from ..router import (
    DirectRouter,
    FunctionRouter,
    KvRouter,
    PickFunction,
    PrefillPlanner,
    RoundRobinRouter,
    Router,
    RoutingDecision,
    RoutingRecords,
    RoutingTicket,
    ServerLoads,
    make_router,
)
from ..router.base import RoutedStream
from ..router.decision import NO_TICKET
from ..router.policy import RouterPolicy
from ..router.server_load import STATS_ENDPOINT
from ..runtime.client import Client, ResponseStream
from ..runtime.context import Context
from ..runtime.discovery import KeyValueDiscovery
from ..runtime.names import EndpointPath
from ..runtime.suspects import SuspectInstances
from ..telemetry.tracing import inject_trace, span
from .admission import Admission
from .config import FrontendConfig
from .policy_sync import PolicySync

# A prompt longer than this many characters per token of the model's context is tokenized in
# two steps: its head first (typical text has 3-5 characters a token), refused if that alone
# overflows the context by more than the few tokens a cut through a word can add.
HEAD_CHARS_PER_TOKEN = 8
HEAD_CUT_TOKENS = 8
JSON_BYTES_PER_CHAR = 6
"""The most bytes one character of a prompt takes in a JSON body (``\\u00e9``)."""
BODY_SLACK_BYTES = 1 << 20
"""What a request body holds beside its prompt's text (other fields, messages' markup), at most."""

if TYPE_CHECKING:
    from ..runtime.distributed import DistributedRuntime

__all__ = ["ModelManager", "ServedModel"]

logger = logging.getLogger("dynamo_nb.frontend")

SERVED_KINDS = ("chat", "completions")


class ServedModel:
    """One model name: its card, tokenizer, endpoint client, router and live cards."""

    def __init__(
        self,
        card: ModelCard,
        tokenizer: ModelTokenizer,
        client: Client,
        router: Router,
        *,
        limits: dict[int, int] | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.card = card
        self.name = card.name
        self.tokenizer = tokenizer
        self.client = client
        self.router = router
        self.direct = DirectRouter(client)
        self.created = int(time.time())
        self.cards: dict[str, ModelCard] = {}
        self.limits = limits if limits is not None else {}  # instance id → its max_num_seqs
        self.admission = admission or Admission()
        # the instances with a card of this model: another model's workers may serve the same
        # endpoint path, and its requests must not reach them (cards without an instance id,
        # static mode's or one added in this process, leave every instance allowed)
        self.card_instances: set[int] = set()
        self._keyed = False
        self._capacity: int | None = None  # `capacity`, kept as cards come and go (asked per request)
        client.serves = self.serves

    @property
    def body_bytes_bound(self) -> int | None:
        """The largest request body that can hold a prompt this model's context takes (None: its
        context is unknown): such a prompt has fewer than twice the longest token's characters
        per context token (more is refused unread, `ModelTokenizer.fewest_tokens`), each at most
        `JSON_BYTES_PER_CHAR` bytes, plus `BODY_SLACK_BYTES`."""
        context = self.card.context_length
        if not context:
            return None
        return 2 * self.tokenizer.longest_token_chars * context * JSON_BYTES_PER_CHAR + BODY_SLACK_BYTES

    def serves(self, instance_id: int) -> bool:
        """Whether requests for this model may go to ``instance_id`` (its card names this model)."""
        return not self._keyed or instance_id in self.card_instances

    def card_added(self, key: str, card: ModelCard) -> None:
        self.cards[key] = card
        instance_id = _instance_of(key)
        if instance_id is not None:
            self._keyed = True
            self.card_instances.add(instance_id)
        self._capacity = self._sum_of_limits()

    def card_removed(self, key: str) -> None:
        self.cards.pop(key, None)
        instance_id = _instance_of(key)
        if instance_id is not None:
            self.card_instances.discard(instance_id)
        self._capacity = self._sum_of_limits()

    def check_guided(self, guided: GuidedDecoding) -> None:
        """Refuse structured output (a 400 naming its field) unless every worker of this model
        enforces it (its card's ``runtime_config.extra.structured_output``): a worker that does
        not would answer unconstrained."""
        cards = list(self.cards.values())
        if cards and all(card.runtime_config.extra.get(STRUCTURED_OUTPUT) for card in cards):
            return
        field = guided.field or "response_format"
        raise InvalidRequestError(
            f"{field}: the workers of model {self.name!r} do not enforce structured output; serve it with "
            "the hf engine (hf_worker.py, run --out hf) or vLLM's, or leave the field out",
            field,
        )

    def capacity(self) -> int | None:
        """Requests the workers take at once: the sum of their cards' ``max_num_seqs`` (None
        when a worker publishes no limit)."""
        return self._capacity

    def _sum_of_limits(self) -> int | None:
        limits = [card.runtime_config.max_num_seqs for card in self.cards.values()]
        known = [limit for limit in limits if limit is not None]
        if not limits or len(known) < len(limits):
            return None
        return sum(known)

    @property
    def live(self) -> bool:
        """Whether any worker has a card for this model now."""
        return bool(self.cards)

    def send(
        self, request: PreprocessedRequest, ticket: RoutingTicket = NO_TICKET
    ) -> tuple[ResponseStream | RoutedStream, RoutingDecision | None]:
        """Route ``request`` to an instance: the one its ``routing.backend_instance_id`` names, else
        the router's choice (raises `NoInstancesError` when there is none). The stream carries
        the ticket's request id to the worker; the router's decision, filed under ``ticket``,
        comes back with it."""
        routing = request.routing
        router = self.direct if routing and "backend_instance_id" in routing else self.router
        request_id = ticket.request_id
        with span("route") as route_span:
            route = router.pick(request, ticket)
            if route_span is not None:
                route_span.set_attributes({"router": router.name, "instance_id": route.instance_id})
        context = Context(request_id, metadata=inject_trace({})) if request_id else None
        return router.open(route, request, context=context), route.decision

    async def tokenize(
        self,
        kind: str,
        messages: list[dict[str, Any]] | None,
        prompt: str | list[int] | None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of a chat's rendered template (``tools`` rendered by it) or of a completion
        prompt. A text that cannot fit the model's context whatever its tokens is refused before
        it is tokenized; a long one is tokenized off the event loop."""
        if kind == "chat":
            extra = {"tools": tools} if tools else {}
            text = await self.tokenizer.render_chat_off_loop(
                messages or [], add_generation_prompt=True, **extra
            )
            return await self._encode_within_context(text, "messages", add_special_tokens=False)
        if isinstance(prompt, list):
            vocab = self.tokenizer.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise InvalidRequestError(
                    f"prompt token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})", param="prompt"
                )
            return prompt
        return await self._encode_within_context(prompt or "", "prompt", add_special_tokens=True)

    async def _encode_within_context(self, text: str, param: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of ``text``, with the work bounded by the model's context: a 400 for a text
        longer than the context can hold however it tokenizes (without tokenizing it), else for
        one whose first `HEAD_CHARS_PER_TOKEN` × context characters alone overflow it (tokenizing
        only those); a long text is tokenized off the event loop. One huge body would otherwise
        hold the event loop, or a thread, and gigabytes while it is tokenized whole."""
        context = self.card.context_length
        encode = self.tokenizer.encode_off_loop
        if context:
            fewest = self.tokenizer.fewest_tokens(text)
            if fewest >= context:
                raise InvalidRequestError(
                    f"the prompt is {len(text)} characters, at least {fewest} tokens, and {self.name!r} "
                    f"has a context of {context}: shorten it",
                    param=param,
                )
            head_chars = HEAD_CHARS_PER_TOKEN * context
            if len(text) > head_chars:
                head = await encode(text[:head_chars], add_special_tokens=add_special_tokens)
                # a cut through a word adds at most a few tokens that the whole text would not have
                if len(head) > context + HEAD_CUT_TOKENS:
                    raise InvalidRequestError(
                        f"the prompt is {len(text)} characters, and its first {head_chars} alone are "
                        f"{len(head)} tokens; {self.name!r} has a context of {context}: shorten it",
                        param=param,
                    )
        return await encode(text, add_special_tokens=add_special_tokens)


class ModelManager:
    """Builds `ServedModel` objects from model cards and keeps them up to date, with the
    router each one gets and the KV routers' policy (`change_kv_router_policy`).

    Args:
        config: the frontend's settings it reads: router mode, KV router, admission, records.
        router_policy: a function ``pick(request, instance_ids)`` that routes every model
            instead of ``config.router_mode`` (a `FunctionRouter`).
        only_endpoint: serve only the models registered at this endpoint (``ns.comp.ep``).
        on_prefill_error: called with a model's name when its prefill failed.
        on_policy_change: called with who changed the KV router policy and the new policy.
    """

    def __init__(
        self,
        runtime: DistributedRuntime,
        config: FrontendConfig | None = None,
        *,
        router_policy: PickFunction | None = None,
        only_endpoint: str | None = None,
        on_prefill_error: Callable[[str], None] | None = None,
        on_policy_change: Callable[[str, RouterPolicy], None] | None = None,
    ) -> None:
        config = config or FrontendConfig()
        self.runtime = runtime
        self.records = RoutingRecords(config.routing_records)
        self.max_queue = config.max_queue
        self.queue_timeout = config.queue_timeout
        self.router_mode = config.router_mode
        self.router_policy = router_policy
        self.only_endpoint = str(EndpointPath.parse(only_endpoint)) if only_endpoint else None
        self.models: dict[str, ServedModel] = {}
        self.prefill: dict[str, PrefillPlanner] = {}  # model name → its prefill planner
        self.enforce_disagg = config.enforce_disagg
        self.kv_config = config.kv_settings(nats=runtime.nats_url is not None)
        self.server_load_interval = config.server_load_interval
        self.policy_sync: PolicySync | None = None
        """Shares router policy changes with the other processes of its group (`share_kv_router_policy`)."""
        self._on_prefill_error = on_prefill_error
        self._on_policy_change = on_policy_change
        self._card_names: dict[str, str] = {}  # discovery key → model name
        self._body_bound: int | None = None
        self._body_bound_stale = True  # `body_bytes_bound` is found again (a card came or went)
        self.suspects = SuspectInstances()
        """Worker instances suspected of hanging (the watchdog's): every model's client routes around them."""
        self._changed = asyncio.Event()

    def kv_index_blocks(self) -> list[tuple[str, int, int]]:
        """(model, worker instance id, blocks) for each worker the models' KV routers know cached blocks of."""
        return [
            (name, worker, model.router.tree.block_count(worker))
            for name, model in list(self.models.items())
            if isinstance(model.router, KvRouter)
            for worker in model.router.tree.workers()
        ]

    def kv_router_policy(self) -> RouterPolicy:
        """The KV routers' policy (`dynamo_nb.router.policy.RouterPolicy`): every KV router
        of this frontend, and those it makes for models that come later, decide by it."""
        return self.kv_config.policy

    def change_kv_router_policy(
        self, updates: Mapping[str, Any], *, by: str = "this process", peer: str = ""
    ) -> RouterPolicy:
        """Apply ``updates`` (knob → value, Dynamo's names or their aliases) to every KV router
        at once, between two decisions (each decision reads the policy once); logged with
        ``by`` (and the ``peer`` address), old → new, and counted in the frontend's ``/metrics``
        (``dynamo_frontend_router_policy_changes_total{by}``). Returns the new policy; with
        `share_kv_router_policy`, the other frontends of the group take it too.

        Example::

            frontend.models.change_kv_router_policy({"prefill_load_scale": 16, "temperature": 0})
        """
        new = self._set_kv_router_policy(updates, by=by, peer=peer)
        if self.policy_sync is not None:
            self.policy_sync.changed_here(new)
        return new

    def _set_kv_router_policy(self, updates: Mapping[str, Any], *, by: str, peer: str) -> RouterPolicy:
        old = self.kv_router_policy()
        new = old.changed(updates)
        self.kv_config = replace(self.kv_config, policy=new)
        for router in [m.router for m in self.models.values()] + [p.router for p in self.prefill.values()]:
            if isinstance(router, KvRouter):
                router.policy = new
        changes = ", ".join(f"{knob} {a:g} → {b:g}" for knob, (a, b) in old.differences(new).items())
        source = f"{by} from {peer}" if peer else by
        logger.info("the KV router policy was changed by %s: %s", source, changes or "nothing")
        if self._on_policy_change is not None:
            self._on_policy_change(by, new)
        return new

    async def share_kv_router_policy(self, group: str | None = None, *, heartbeat: float = 2.0) -> PolicySync:
        """Share this frontend's router policy changes with the other frontends of ``group``
        (None: a new group; `policy_sync.group` names it) over the event plane, and take theirs:
        what ``--http-workers N`` with the admin API does, so a ``PATCH /router_policy`` reaching
        one process changes them all (`dynamo_nb.frontend.policy_sync`). Needs an event plane
        (``nats_url`` with etcd discovery).

        Example::

            sync = await frontend.models.share_kv_router_policy()
            await other.models.share_kv_router_policy(sync.group)
        """
        if self.policy_sync is None:

            def apply(policy: RouterPolicy, source: str) -> None:
                self._set_kv_router_policy(policy.to_dict(), by="another frontend process", peer=source)

            self.policy_sync = await PolicySync.start(
                self.runtime, group or secrets.token_hex(8), apply=apply, heartbeat=heartbeat
            )
        return self.policy_sync

    def get(self, name: str) -> ServedModel | None:
        return self.models.get(name)

    def live_models(self) -> list[ServedModel]:
        return [m for m in self.models.values() if m.live]

    def body_bytes_bound(self) -> int | None:
        """The largest request body a served model's context could take (None: no bound known:
        no model yet, or one whose context is unknown). A larger body is refused unread. Asked
        per request, found again only after a card came or went."""
        if self._body_bound_stale:
            bounds = [model.body_bytes_bound for model in self.live_models()]
            known = [bound for bound in bounds if bound is not None]
            self._body_bound = max(known) if known and len(known) == len(bounds) else None
            self._body_bound_stale = False
        return self._body_bound

    async def add_card(
        self, card: ModelCard, key: str | None = None, *, address: str | None = None
    ) -> ServedModel:
        """Serve ``card``'s model (a second card of a known model only adds to its live cards)."""
        key = key or f"local/{card.name}"
        model = self.models.get(card.name)
        if model is None:
            tokenizer = await asyncio.to_thread(ModelTokenizer.load, card.model_path)
            endpoint = self.runtime.endpoint(card.endpoint)
            client = await endpoint.client(address=address)
            client.suspects = self.suspects
            limits: dict[int, int] = {}
            if self.router_policy is not None:  # --router-policy: the user's function picks
                router: Router = FunctionRouter(client, self.router_policy)
            else:
                router = await self._router(client, card, limits.get)
            model = self.models.get(card.name)  # another card may have won while we loaded
            if model is None:
                model = self.models[card.name] = ServedModel(
                    card,
                    tokenizer,
                    client,
                    router,
                    limits=limits,
                    admission=Admission(self.max_queue, self.queue_timeout, card.name),
                )
                logger.info("serving model %s from %s", card.name, card.endpoint)
            else:
                await router.stop()
        elif card.endpoint != model.card.endpoint:
            logger.warning(
                "model %s is served at %s; ignoring its card from %s",
                card.name,
                model.card.endpoint,
                card.endpoint,
            )
            return model
        model.card_added(key, card)
        instance_id = _instance_of(key)
        if instance_id is not None and card.runtime_config.max_num_seqs:
            model.limits[instance_id] = card.runtime_config.max_num_seqs
        self._card_names[key] = card.name
        self._notify()
        return model

    async def add_prefill_card(self, card: ModelCard, key: str) -> PrefillPlanner:
        """A prefill worker's card: the model's prefill planner learns it (and starts, if new)."""
        router = self.prefill.get(card.name)
        if router is None:
            client = await self.runtime.endpoint(card.endpoint).client()
            client.suspects = self.suspects
            # round robin; with --router-mode kv the prefill worker is chosen by KV overlap and load too
            picker = (
                await self._router(client, card) if self.router_mode == "kv" else RoundRobinRouter(client)
            )
            router = self.prefill.get(card.name)  # another card may have won while we waited
            if router is None:
                report = self._on_prefill_error
                on_error = (lambda: report(card.name)) if report is not None else None
                router = PrefillPlanner(card.endpoint, picker, enforce=self.enforce_disagg, on_error=on_error)
                self.prefill[card.name] = router
                logger.info("model %s: disaggregated serving, prefill at %s", card.name, card.endpoint)
            else:
                await picker.stop()
        instance_id = _instance_of(key)
        if instance_id is None:
            raise ConfigError(f"the prefill card at {key!r} does not end with its instance id")
        router.add_worker(
            key,
            instance_id,
            card.runtime_config.disaggregated_endpoint,
            structured_output=bool(card.runtime_config.extra.get(STRUCTURED_OUTPUT)),
        )
        return router

    def prefill_planner(self, name: str) -> PrefillPlanner | None:
        """The prefill planner of model ``name`` while a prefill worker has a card, else None."""
        router = self.prefill.get(name)
        return router if router is not None and router.active else None

    def remove_card(self, key: str) -> None:
        for router in self.prefill.values():
            if router.remove_worker(key):
                return
        name = self._card_names.pop(key, None)
        model = self.models.get(name) if name else None
        if model is not None:
            model.card_removed(key)
            instance_id = _instance_of(key)
            if instance_id is not None:
                model.limits.pop(instance_id, None)
            if not model.live:
                logger.info("model %s has no workers left", name)
            self._notify()

    def _notify(self) -> None:
        self._body_bound_stale = True
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_model(self, name: str, timeout: float = 30.0) -> ServedModel:
        """Wait until ``name`` is served by at least one worker."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            model = self.models.get(name)
            if model is not None and model.live:
                return model
            remaining = deadline - loop.time()
            if remaining <= 0:
                known = ", ".join(m.name for m in self.live_models()) or "none"
                raise NoInstancesError(
                    f"model {name!r} did not appear within {timeout:g} s (serving: {known})"
                )
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def _router(
        self, client: Client, card: ModelCard, limit_of: Callable[[int], int | None] | None = None
    ) -> Router:
        """The ``--router-mode`` router of a card's endpoint (a KV router follows its KV events;
        ``limit_of`` gives an instance's ``max_num_seqs``)."""
        component = self.runtime.endpoint(card.endpoint).component()
        server_loads = None
        if self.server_load_interval > 0 and self.router_mode in ("least-loaded", "kv"):
            server_loads = await ServerLoads.start(
                component.endpoint(STATS_ENDPOINT), self.server_load_interval
            )
        router = await make_router(
            self.router_mode,
            client,
            block_size=card.kv_cache_block_size,
            kv_config=self.kv_config,
            component=component,
            limit_of=limit_of,
            server_loads=server_loads,
        )
        if isinstance(router, KvRouter):  # a policy changed while it was made: the newest
            router.policy = self.kv_config.policy
        return router

    async def close(self) -> None:
        """Stop sharing policy changes and the routers' event subscriptions (the frontend's
        `stop` calls it)."""
        if self.policy_sync is not None:
            await self.policy_sync.stop()
            self.policy_sync = None
        for router in [m.router for m in self.models.values()] + [p.router for p in self.prefill.values()]:
            await router.stop()

    async def watch(self) -> None:
        """Follow model cards in discovery (memory or etcd)."""
        discovery = self.runtime.discovery
        if not isinstance(discovery, KeyValueDiscovery):
            raise ConfigError(
                "static discovery has no model cards to watch: give the model with "
                "--static-endpoint ns.comp.ep --model-name NAME --model-path DIR"
            )
        watch = await discovery.watch_prefix(CARD_PREFIX)

        def on_change(key: str, value: bytes | None) -> None:
            if value is None:
                self.remove_card(key)
                return
            try:
                card = ModelCard.from_json(value)
            except ValueError as exc:
                logger.warning("ignoring malformed model card at %s: %s", key, exc)
                return
            if "prefill" in card.kinds:
                self.runtime.spawn(
                    self._add_logged(card, key, prefill=True), name=f"prefill-card-{card.name}"
                )
                return
            if not any(kind in SERVED_KINDS for kind in card.kinds):
                return
            if self.only_endpoint is not None and card.endpoint != self.only_endpoint:
                return
            self.runtime.spawn(self._add_logged(card, key), name=f"model-card-{card.name}")

        watch.add_listener(on_change)
        for key, value in list(watch.items.items()):
            on_change(key, value)

    async def _add_logged(self, card: ModelCard, key: str, prefill: bool = False) -> None:
        try:
            await (self.add_prefill_card(card, key) if prefill else self.add_card(card, key))
        except Exception as exc:
            logger.error("cannot serve model %s from %s: %s", card.name, card.endpoint, exc)


def _instance_of(key: str) -> int | None:
    """The instance id a card's discovery key ends with (``.../694d9a8e...``), if it does."""
    try:
        return int(key.rsplit("/", 1)[-1], 16)
    except ValueError:
        return None
