"""The Router protocol: round robin, random and direct over one client; a tracking router hears
each request's first item and end."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from helpers import collect

from dynamo_nb import DistributedRuntime, InvalidRequestError, NoInstancesError
from dynamo_nb.engines import EchoEngine
from dynamo_nb.llm import PreprocessedRequest, StopConditions, engine_handler
from dynamo_nb.router import DirectRouter, RandomRouter, RoundRobinRouter, Route, Router


async def three_instances(rt: DistributedRuntime, name: str) -> Any:
    endpoint = rt.endpoint(f"rt.{name}.generate")
    for _ in range(3):
        await endpoint.serve(engine_handler(EchoEngine().generate))
    client = await endpoint.client()
    await client.wait_for_instances(timeout=5)
    return client


REQUEST = PreprocessedRequest([4, 5, 6], StopConditions(max_tokens=3))


async def test_round_robin_random_and_direct_pick_as_they_say() -> None:
    async with await DistributedRuntime.create() as rt:
        client = await three_instances(rt, "pick")
        ids = client.instance_ids()
        round_robin = RoundRobinRouter(client)
        assert [round_robin.pick(REQUEST).instance_id for _ in range(6)] == ids + ids
        random = RandomRouter(client)
        assert set(Counter(random.pick(REQUEST).instance_id for _ in range(200))) == set(ids)
        direct = DirectRouter(client)
        routed = PreprocessedRequest([1], routing={"backend_instance_id": ids[1]})
        assert direct.pick(routed).instance_id == ids[1]
        with pytest.raises(InvalidRequestError, match="backend_instance_id"):
            direct.pick(REQUEST)
        items = await collect(round_robin.send(REQUEST))
        assert [i["token_ids"] for i in items] == [[4], [5], [6]]


async def test_a_tracking_router_hears_the_first_item_and_the_end() -> None:
    heard: list[str] = []

    class Tracking(RoundRobinRouter):
        tracks_requests = True

        def first_token(self, route: Route) -> None:
            heard.append("first")

        def finished(self, route: Route) -> None:
            heard.append("end")

    async with await DistributedRuntime.create() as rt:
        router: Router = Tracking(await three_instances(rt, "track"))
        assert len(await collect(router.send(REQUEST))) == 3
        assert heard == ["first", "end"]
        stream = router.send(PreprocessedRequest([1], StopConditions(max_tokens=50)))
        await stream.__anext__()
        await stream.aclose()  # left early: the router still hears the end, once
        assert heard == ["first", "end", "first", "end"]


async def test_no_instances_is_a_clear_error() -> None:
    async with await DistributedRuntime.create() as rt:
        client = await rt.endpoint("rt.none.generate").client()
        with pytest.raises(NoInstancesError, match=r"no instances of dyn://rt\.none\.generate"):
            RoundRobinRouter(client).pick(REQUEST)


async def test_every_router_returns_a_finished_decision_filed_under_its_ticket() -> None:
    """A router is told the request's id, model, hop and queue, and its decision comes back whole:
    nothing is assigned on it afterwards (it is frozen)."""
    import dataclasses

    from dynamo_nb.router import FunctionRouter, KvRouter, LeastLoadedRouter, RoutingTicket

    ticket = RoutingTicket("r-7", "tiny", queue={"priority": 2, "strict_priority": 1, "waited_ms": 1.5})
    async with await DistributedRuntime.create() as rt:
        client = await three_instances(rt, "ticket")
        routers: list[Router] = [
            RoundRobinRouter(client),
            RandomRouter(client),
            LeastLoadedRouter(client),
            FunctionRouter(client, lambda request, ids: min(ids)),
            await KvRouter.create(client, block_size=2),
        ]
        for router in routers:
            decision = router.pick(REQUEST, ticket).decision
            assert decision is not None
            got = (decision.request_id, decision.model, decision.hop, decision.queue)
            assert got == ("r-7", "tiny", "decode", ticket.queue), router.name
            prefill = router.pick(REQUEST, ticket.for_prefill()).decision
            assert prefill is not None and prefill.hop == "prefill"
            with pytest.raises(dataclasses.FrozenInstanceError):
                decision.hop = "prefill"  # type: ignore[misc]
        assert routers[3].pick(REQUEST).decision.router == "policy:<lambda>"  # type: ignore[union-attr]
        kv = routers[4].pick(REQUEST, ticket).decision
        assert kv is not None and kv.policy is not None and kv.overhead_ms["total"] >= 0
        assert routers[0].pick(REQUEST).decision.request_id == ""  # type: ignore[union-attr]  # no ticket
