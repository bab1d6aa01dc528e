"""Priority scheduling as Dynamo 1.7 defines it: ``nvext.agent_hints.priority`` (soft) and
``strict_priority`` (tiers), or the ``x-dynamo-request-*`` headers, order the requests that wait
for a slot: a higher tier always first, the earliest due time within a tier (soft priority moves
a request's due time earlier; one that waited longer still goes first). Against real processes:
high-priority requests pass a burst of low-priority ones waiting for the one slot."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from helpers import FRONTEND, MOCKER_WORKER, free_port, metric_value

from dynamo_nb.errors import InvalidRequestError
from dynamo_nb.frontend.admission import Admission
from dynamo_nb.frontend.openai import parse_request, with_priority_headers

pytestmark = pytest.mark.timeout(120)


async def until(condition: Any, what: str) -> None:
    """Yield to the loop until ``condition()`` holds (each step lets the other tasks run)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never: {what}")


async def admitted_order(admission: Admission, arrivals: list[tuple[str, float, int, float]]) -> list[str]:
    """Hold the one slot, queue ``arrivals`` (name, priority, tier, pause before it), then free
    the slot one request at a time: the order they got in."""
    await admission.enter(1)  # the slot is taken
    order: list[str] = []

    async def request(name: str, priority: float, tier: int) -> None:
        await admission.enter(1, priority=priority, strict_priority=tier)
        order.append(name)

    tasks = []
    for name, priority, tier, pause in arrivals:
        await asyncio.sleep(pause)
        tasks.append(asyncio.ensure_future(request(name, priority, tier)))
        await until(lambda: admission.waiting == len(tasks), "queued")
    for count in range(1, len(arrivals) + 1):
        admission.leave()
        await until(lambda: len(order) == count, "let in")  # noqa: B023  # awaited here, in this iteration
    await asyncio.gather(*tasks)
    return order


async def test_tiers_first_then_the_earliest_due() -> None:
    arrivals = [
        ("a", 0, 0, 0),
        ("b", 5, 0, 0),
        ("c", 0, 1, 0),
        ("d", 5, 0, 0),
        ("e", 0, 0, 0),
        ("f", 0, 2, 0),
    ]
    order = await admitted_order(Admission(), arrivals)
    # tier 2, tier 1, then by due time: b and d (5 s early, in arrival order), then a and e
    assert order == ["f", "c", "b", "d", "a", "e"]


async def test_a_request_that_waited_longer_than_its_rival_s_head_start_goes_first() -> None:
    # one unit of priority is worth 10 ms here: "old" waited at least 50 ms before "urgent" came
    order = await admitted_order(Admission(priority_seconds=0.01), [("old", 0, 0, 0), ("urgent", 1, 0, 0.05)])
    assert order == ["old", "urgent"]
    order = await admitted_order(Admission(priority_seconds=10.0), [("old", 0, 0, 0), ("urgent", 1, 0, 0.05)])
    assert order == ["urgent", "old"]


async def test_given_up_turns_do_not_count_and_do_not_take_slots() -> None:
    admission = Admission(queue_timeout=60)
    await admission.enter(1)
    waiting = [asyncio.ensure_future(admission.enter(1, priority=p)) for p in (9, 0)]
    await until(lambda: admission.waiting == 2, "both queued")
    waiting[0].cancel()  # the client of the first in line left
    with pytest.raises(asyncio.CancelledError):
        await waiting[0]
    assert admission.waiting == 1
    admission.leave()
    assert await waiting[1] >= 0 and admission.inflight == 1 and admission.waiting == 0


def test_hints_and_headers_are_checked_and_headers_win() -> None:
    body = {
        "model": "m",
        "prompt": "hi",
        "nvext": {"agent_hints": {"priority": 10, "strict_priority": 1, "osl": 9}},
    }
    parsed = parse_request(body, "completions")
    assert (parsed.priority, parsed.strict_priority) == (10.0, 1)
    headers = {"x-dynamo-request-priority": "-2.5", "x-dynamo-request-strict-priority": "3"}
    assert (with_priority_headers(parsed, headers).priority, parsed.strict_priority) == (-2.5, 3)
    for hints, param in (
        ({"priority": "high"}, "nvext.agent_hints.priority"),
        ({"strict_priority": -1}, "nvext.agent_hints.strict_priority"),
        ({"strict_priority": 1.5}, "nvext.agent_hints.strict_priority"),
    ):
        with pytest.raises(InvalidRequestError) as refused:
            parse_request({**body, "nvext": {"agent_hints": hints}}, "completions")
        assert refused.value.param == param
    with pytest.raises(InvalidRequestError, match="x-dynamo-request-strict-priority"):
        with_priority_headers(parsed, {"x-dynamo-request-strict-priority": "top"})


async def test_high_priority_requests_pass_a_burst_of_low_priority_ones(
    services: Any, start_worker: Any
) -> None:
    flags = ["--discovery", services.etcd_url]
    await start_worker(
        *flags, "--endpoint", "prio.backend.generate", "--max-num-seqs", "1", script=MOCKER_WORKER
    )
    port = free_port()
    await start_worker(*flags, "--http-port", str(port), script=FRONTEND)
    body = {"model": "tiny-llama", "prompt": "a lighthouse", "max_tokens": 4, "ignore_eos": True,
            "nvext": {"extra_fields": ["routing"]}}  # fmt: skip
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        for _ in range(100):
            if (await http.get("/v1/models")).json()["data"]:
                break
            await asyncio.sleep(0.1)

        async def queued() -> float | None:
            text = (await http.get("/metrics")).text
            return metric_value(text, "dynamo_frontend_queued_requests", model="tiny-llama")

        async def queue_holds(count: int) -> None:
            for _ in range(500):
                if await queued() == count:
                    return
                await asyncio.sleep(0.02)
            raise AssertionError(f"the queue never held {count}: {await queued()}")

        finished: list[str] = []

        async def send(
            name: str, headers: dict[str, str] | None = None, hints: dict[str, Any] | None = None
        ) -> Any:
            nvext = {**body["nvext"], **({"agent_hints": hints} if hints else {})}  # type: ignore[dict-item]
            answer = await http.post("/v1/completions", json={**body, "nvext": nvext}, headers=headers or {})
            finished.append(name)
            assert answer.status_code == 200, answer.text
            return answer.json()["nvext"]["routing"]

        holder = {**body, "max_tokens": 1000, "stream": True}
        async with http.stream("POST", "/v1/completions", json=holder) as running:
            lines = running.aiter_lines()  # kept: a generator dropped would close the stream
            assert (await lines.__anext__()).startswith("data: ")  # the one slot is taken
            lows = [asyncio.ensure_future(send(f"low{i}")) for i in range(6)]
            await queue_holds(6)
            highs = [
                asyncio.ensure_future(send("tier1", headers={"x-dynamo-request-strict-priority": "1"})),
                asyncio.ensure_future(send("soft", hints={"priority": 100})),
            ]
            await queue_holds(8)
        # the running stream is closed: the slot goes to the waiting, one at a time
        routings = await asyncio.gather(*highs, *lows)
    assert finished[:2] == ["tier1", "soft"] and sorted(finished[2:]) == [f"low{i}" for i in range(6)]
    tier1, soft = routings[0]["decode"]["queue"], routings[1]["decode"]["queue"]
    assert tier1["strict_priority"] == 1 and soft["priority"] == 100 and soft["strict_priority"] == 0
    low_waits = [r["decode"]["queue"]["waited_ms"] for r in routings[2:]]
    assert tier1["waited_ms"] < min(low_waits) and soft["waited_ms"] < min(low_waits)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        text = (await http.get("/metrics")).text
    waits = {"model": "tiny-llama", "strict_priority": "1"}
    assert metric_value(text, "dynamo_frontend_queue_wait_seconds_count", **waits) == 1


async def test_a_slot_handed_to_a_waiter_is_not_taken_by_a_newcomer_too() -> None:
    admission = Admission()
    await admission.enter(1)
    waiter = asyncio.ensure_future(admission.enter(1))
    await until(lambda: admission.waiting == 1, "queued")
    admission.leave()  # the slot goes to the waiter, which has not run yet
    newcomer = asyncio.ensure_future(admission.enter(1))
    await waiter
    await until(lambda: admission.waiting == 1, "the newcomer queued")
    assert admission.inflight == 1 and not newcomer.done()
    admission.leave()
    await newcomer
    assert admission.inflight == 1 and admission.waiting == 0


def test_a_priority_too_large_for_a_float_is_a_400() -> None:
    body = {"model": "m", "prompt": "hi", "nvext": {"agent_hints": {"priority": 10**400}}}
    with pytest.raises(InvalidRequestError, match="finite number"):
        parse_request(body, "completions")


def test_a_misspelt_hint_and_vllms_top_level_priority_are_400s_that_name_the_field() -> None:
    misspelt = {"model": "m", "prompt": "hi", "nvext": {"agent_hints": {"priorty": 10}}}
    with pytest.raises(
        InvalidRequestError, match=r"agent_hints.priorty is not a hint: did you mean priority\?"
    ) as bad:
        parse_request(misspelt, "completions")
    assert bad.value.param == "nvext.agent_hints.priorty"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for vllms, route in (({"model": "m", "prompt": "hi"}, "completions"), (chat, "chat")):
        with pytest.raises(
            InvalidRequestError, match=r"vLLM's \(lower first\).*nvext.agent_hints.priority"
        ) as bad:
            parse_request({**vllms, "priority": 10}, route)
        assert bad.value.param == "priority"
    # Dynamo's other hints are taken (and not used here), as Dynamo takes them
    others = {"osl": 128, "speculative_prefill": False, "latency_sensitivity": 0.5, "priority": 3}
    parsed = parse_request({"model": "m", "prompt": "hi", "nvext": {"agent_hints": others}}, "completions")
    assert parsed.priority == 3.0
