"""Serve and call an endpoint in every discovery × request-plane mode (real etcd and NATS)."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from typing import Any

import pytest
from helpers import MODES, RuntimeFactory, collect

from dynamo_nb import (
    Context,
    InstanceNotFoundError,
    NoInstancesError,
    RemoteHandlerError,
    RuntimeClosedError,
)
from dynamo_nb.errors import ConfigError, InstanceDownError, InvalidRequestError

pytestmark = pytest.mark.timeout(60)


async def words(request: dict[str, Any], context: Context) -> Any:
    for word in request["text"].split():
        yield {"word": word}


class Recorder:
    """A handler that streams until stopped and records what it saw."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.stopped_seen = asyncio.Event()
        self.finished = asyncio.Event()
        self.request_ids: list[str] = []

    async def __call__(self, request: Any, context: Context) -> Any:
        self.request_ids.append(context.id)
        self.started.set()
        try:
            i = 0
            while True:
                if context.is_stopped():
                    self.stopped_seen.set()
                    yield {"stopped": True}
                    return
                yield {"i": i}
                i += 1
                await asyncio.sleep(0.005)
        finally:
            self.finished.set()


async def serve_and_connect(
    make_runtime: RuntimeFactory, mode: str, handler: Any, name: str, copies: int = 1
):
    server_rt = await make_runtime(mode)
    client_rt = await make_runtime(mode)
    endpoint = server_rt.endpoint(f"test.{name}.generate")
    servers = [await endpoint.serve(handler) for _ in range(copies)]
    client = await client_rt.endpoint(f"test.{name}.generate").client()
    await client.wait_for_instances(timeout=10)
    return servers, client


@pytest.mark.parametrize("mode", MODES)
async def test_each_client_mode_streams_every_item(make_runtime: RuntimeFactory, mode: str) -> None:
    copies = 1 if mode.startswith("static") else 2
    servers, client = await serve_and_connect(make_runtime, mode, words, f"modes-{mode}", copies)
    request = {"text": "the quick brown fox"}
    expected = [{"word": w} for w in request["text"].split()]

    assert await collect(client.round_robin(request)) == expected
    assert await collect(client.random(request)) == expected
    stream = await client.round_robin(request)  # Dynamo style: await, then iterate
    assert stream.instance_id in client.instance_ids()
    assert await collect(stream) == expected
    if not mode.startswith("static"):
        for server in servers:
            direct = client.direct(request, server.instance_id)
            assert direct.instance_id == server.instance_id
            assert await collect(direct) == expected
            as_printed = client.direct(request, f"{server.instance_id:x}")  # the READY line's hex
            assert as_printed.instance_id == server.instance_id
            assert await collect(as_printed) == expected
        assert sorted(client.instance_ids()) == sorted(s.instance_id for s in servers)


async def test_tcp_plane_sockets_send_small_frames_at_once(make_runtime: RuntimeFactory) -> None:
    """TCP_NODELAY on both ends of every TCP request-plane connection (no 40 ms Nagle stall)."""
    import socket

    server_rt, client_rt = await make_runtime("memory-tcp"), await make_runtime("memory-tcp")
    await server_rt.endpoint("test.nodelay.generate").serve(words)
    client = await client_rt.endpoint("test.nodelay.generate").client()
    await client.wait_for_instances(timeout=10)
    assert await collect(client.round_robin({"text": "a b"})) == [{"word": "a"}, {"word": "b"}]
    connections = [*client_rt.request_plane._conns.values(), *server_rt.request_plane._server_conns]
    assert len(connections) == 2  # the client's end and the server's
    for conn in connections:
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.mark.parametrize("mode", ["memory-inproc", "file-tcp", "etcd-tcp", "etcd-nats"])
async def test_round_robin_alternates_and_random_reaches_all(make_runtime: RuntimeFactory, mode: str) -> None:
    servers, client = await serve_and_connect(make_runtime, mode, words, f"rr-{mode.replace('-', '')}", 3)
    picks = [client.round_robin({"text": "x"}).instance_id for _ in range(9)]
    assert Counter(picks) == {s.instance_id: 3 for s in servers}
    assert picks[:3] != [picks[0]] * 3
    seen = {client.random({"text": "x"}).instance_id for _ in range(200)}
    assert seen == {s.instance_id for s in servers}


@pytest.mark.parametrize("mode", MODES)
async def test_handler_error_type_and_message_reach_the_caller(
    make_runtime: RuntimeFactory, mode: str
) -> None:
    async def failing(request: Any) -> Any:
        yield {"before": 1}
        raise KeyError("missing 'prompt'")

    _servers, client = await serve_and_connect(make_runtime, mode, failing, f"fail-{mode}")
    items = []
    with pytest.raises(RemoteHandlerError) as info:
        async for item in client.round_robin({}):
            items.append(item)
    assert items == [{"before": 1}]
    assert info.value.error_type == "KeyError"
    assert "missing 'prompt'" in info.value.remote_message
    assert info.value.endpoint == f"test.fail-{mode}.generate"


@pytest.mark.parametrize("mode", MODES)
async def test_context_metadata_reaches_the_handler(make_runtime: RuntimeFactory, mode: str) -> None:
    async def echo_metadata(request: Any, context: Context) -> Any:
        yield dict(context.metadata)

    _servers, client = await serve_and_connect(make_runtime, mode, echo_metadata, f"meta-{mode}")
    sent = Context(metadata={"user": "a", "tenant": 7})
    assert [item async for item in client.round_robin({}, context=sent)] == [{"user": "a", "tenant": 7}]
    assert [item async for item in client.round_robin({})] == [{}]  # none: the frame carries none


@pytest.mark.parametrize("mode", ["memory-tcp", "file-nats", "static-nats"])
async def test_a_caller_that_goes_away_without_a_stop_stops_the_handler(
    make_runtime: RuntimeFactory, mode: str
) -> None:
    """The caller's runtime shuts down mid-stream and sends no STOP (a program that exits at
    once): the worker still learns the caller left, from the closed connection (TCP) or from
    NATS answering its next frame with "no responders"."""
    recorder = Recorder()
    _servers, client = await serve_and_connect(make_runtime, mode, recorder, f"gone-{mode}")
    stream = client.round_robin({})
    assert await anext(stream) == {"i": 0}
    await client.endpoint.runtime.shutdown(grace=0.1)
    await asyncio.wait_for(recorder.stopped_seen.wait(), 2.5)  # within one heartbeat, not never
    await asyncio.wait_for(recorder.finished.wait(), 2.5)


@pytest.mark.parametrize("mode", MODES)
async def test_a_request_stopped_before_it_is_sent_still_reaches_the_handler(
    make_runtime: RuntimeFactory, mode: str
) -> None:
    """As on Dynamo: the handler runs (its bookkeeping too) and sees the stop; the caller gets nothing."""
    recorder = Recorder()
    _servers, client = await serve_and_connect(make_runtime, mode, recorder, f"prestop-{mode}")
    context = Context()
    context.stop_generating()
    assert [item async for item in client.round_robin({}, context=context)] == []
    await asyncio.wait_for(recorder.stopped_seen.wait(), 5)
    assert recorder.request_ids == [context.id]


@pytest.mark.skipif(
    sys.version_info < (3, 11), reason="Python 3.10 cannot tell a handler's CancelledError from a cancel"
)
@pytest.mark.parametrize("mode", MODES)
async def test_a_handler_that_raises_cancelled_error_is_an_error_not_a_stopping_instance(
    make_runtime: RuntimeFactory, mode: str
) -> None:
    async def gives_up(request: Any) -> Any:
        yield {"before": 1}
        raise asyncio.CancelledError()

    servers, client = await serve_and_connect(make_runtime, mode, gives_up, f"giveup-{mode}")
    for _ in range(2):  # the instance stays in use: the second request goes to it too
        with pytest.raises(RemoteHandlerError) as info:
            async for _item in client.round_robin({}):
                pass
        assert info.value.error_type == "CancelledError"
    assert client.instance_ids() == [servers[0].instance_id]
    assert servers[0].errors_total == 2


@pytest.mark.parametrize("mode", ["memory-inproc", "memory-tcp", "etcd-nats"])
async def test_our_errors_keep_their_http_answer_across_the_wire(
    make_runtime: RuntimeFactory, mode: str
) -> None:
    async def strict(request: Any) -> Any:
        raise InvalidRequestError("top_k must be -1 or at least 1, got 0", param="top_k")
        yield  # an async generator

    async def plain(request: Any) -> Any:
        raise KeyError("x")
        yield

    _servers, client = await serve_and_connect(make_runtime, mode, strict, f"st-{mode}")
    with pytest.raises(RemoteHandlerError) as info:
        await collect(client.round_robin({}))
    error = info.value
    assert (error.http_status, error.openai_type, error.param) == (400, "invalid_request_error", "top_k")
    assert error.error_type == "InvalidRequestError" and "top_k must be" in error.remote_message
    _servers, client = await serve_and_connect(make_runtime, mode, plain, f"pl-{mode}")
    with pytest.raises(RemoteHandlerError) as info:
        await collect(client.round_robin({}))
    assert (info.value.http_status, info.value.param) == (500, None)  # not ours: a server error


@pytest.mark.parametrize("mode", ["memory-tcp", "etcd-nats", "static-nats"])
async def test_items_that_cannot_travel_give_a_clear_error(make_runtime: RuntimeFactory, mode: str) -> None:
    async def bad_item(request: Any) -> Any:
        yield {"ok": 1}
        yield {"not json": object()}

    _servers, client = await serve_and_connect(make_runtime, mode, bad_item, f"enc-{mode}")
    with pytest.raises(RemoteHandlerError, match="JSON-able"):
        await collect(client.round_robin({}))
    with pytest.raises(InvalidRequestError, match="requests must be JSON-able"):
        await collect(client.round_robin({"x": object()}))


@pytest.mark.parametrize("mode", MODES)
async def test_leaving_the_loop_early_stops_the_remote_handler(
    make_runtime: RuntimeFactory, mode: str
) -> None:
    recorder = Recorder()
    servers, client = await serve_and_connect(make_runtime, mode, recorder, f"brk-{mode}")
    async for item in client.round_robin({}):
        if item["i"] == 3:
            break
    await asyncio.wait_for(recorder.finished.wait(), 5)
    assert servers[0].inflight == 0
    assert servers[0].cancelled_total == 1


@pytest.mark.parametrize("mode", MODES)
async def test_stop_generating_on_the_caller_reaches_the_handler(
    make_runtime: RuntimeFactory, mode: str
) -> None:
    recorder = Recorder()
    _servers, client = await serve_and_connect(make_runtime, mode, recorder, f"stop-{mode}")
    context = Context()
    items = []
    async for item in client.round_robin({}, context=context):
        items.append(item)
        if len(items) == 3:
            context.stop_generating()
    await asyncio.wait_for(recorder.stopped_seen.wait(), 5)
    assert items[-1] == {"stopped": True}  # the handler saw the stop and said so
    assert recorder.request_ids == [context.id]


@pytest.mark.parametrize("mode", ["memory-inproc", "etcd-tcp", "etcd-nats"])
async def test_a_linked_child_stops_with_its_parent(make_runtime: RuntimeFactory, mode: str) -> None:
    recorder = Recorder()
    _servers, client = await serve_and_connect(make_runtime, mode, recorder, f"link-{mode.replace('-', '')}")
    parent = Context()
    stream = await client.round_robin({}, context=parent)
    assert await stream.__anext__() == {"i": 0}
    parent.stop_generating()
    rest = await asyncio.wait_for(collect(stream), 5)
    assert rest[-1] == {"stopped": True}
    assert recorder.stopped_seen.is_set()


@pytest.mark.parametrize("mode", MODES)
async def test_cancelling_the_caller_task_stops_the_handler(make_runtime: RuntimeFactory, mode: str) -> None:
    recorder = Recorder()
    servers, client = await serve_and_connect(make_runtime, mode, recorder, f"cxl-{mode}")

    async def consume() -> None:
        async for _ in client.round_robin({}):
            pass

    task = asyncio.create_task(consume())
    await asyncio.wait_for(recorder.started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(recorder.finished.wait(), 5)
    assert servers[0].inflight == 0


@pytest.mark.parametrize("mode", ["memory-inproc", "file-tcp", "etcd-tcp", "etcd-nats"])
async def test_no_instances_is_an_immediate_clear_error(make_runtime: RuntimeFactory, mode: str) -> None:
    rt = await make_runtime(mode)
    client = await rt.endpoint(f"test.nobody-{mode}.generate").client()
    assert client.instance_ids() == []
    with pytest.raises(NoInstancesError, match="wait_for_instances"):
        client.round_robin({})
    with pytest.raises(NoInstancesError, match=r"within 0.3 s"):
        await client.wait_for_instances(timeout=0.3)
    with pytest.raises(InstanceNotFoundError, match="abc"):
        client.direct({}, 0xABC)
    with pytest.raises(ConfigError, match=r"hex.*integer"):
        client.direct({}, "worker-1")
    assert issubclass(NoInstancesError, TimeoutError)


@pytest.mark.usefixtures("services")  # static-nats: a nats-server
async def test_static_wait_for_instances_times_out_without_a_worker(make_runtime: RuntimeFactory) -> None:
    rt = await make_runtime("static-nats")
    client = await rt.endpoint("test.static-nobody.generate").client()
    with pytest.raises(NoInstancesError):
        await client.wait_for_instances(timeout=0.5)
    with pytest.raises(InstanceDownError, match="no responders"):
        await collect(client.round_robin({}))


@pytest.mark.parametrize("mode", ["memory-inproc", "etcd-tcp", "etcd-nats"])
async def test_wait_for_instances_sees_a_late_server(make_runtime: RuntimeFactory, mode: str) -> None:
    server_rt = await make_runtime(mode)
    client_rt = await make_runtime(mode)
    name = f"test.late-{mode}.generate"
    client = await client_rt.endpoint(name).client()
    waiter = asyncio.create_task(client.wait_for_instances(timeout=10))
    await asyncio.sleep(0.1)
    server = await server_rt.endpoint(name).serve(words)
    assert await waiter == [server.instance_id]


@pytest.mark.parametrize("mode", ["memory-inproc", "etcd-tcp", "etcd-nats"])
async def test_graceful_stop_finishes_running_streams_and_leaves_discovery(
    make_runtime: RuntimeFactory, mode: str
) -> None:
    async def slow(request: Any) -> Any:
        for i in range(5):
            await asyncio.sleep(0.02)
            yield {"i": i}

    servers, client = await serve_and_connect(make_runtime, mode, slow, f"grace-{mode.replace('-', '')}")
    stream = await client.round_robin({})
    first = await stream.__anext__()
    stopping = asyncio.create_task(servers[0].stop(grace=5))
    rest = await collect(stream)
    await stopping
    assert [first, *rest] == [{"i": i} for i in range(5)]
    for _ in range(200):
        if not client.instance_ids():
            break
        await asyncio.sleep(0.05)
    assert client.instance_ids() == []


async def test_instance_ids_and_etcd_keys(make_runtime: RuntimeFactory, services: Any) -> None:
    import aetcd

    from dynamo_nb.runtime.instance import Instance

    rt = await make_runtime("etcd-tcp")
    first = await rt.endpoint("test.keys.generate").serve(words)
    second = await rt.endpoint("test.keys.generate").serve(words)
    assert first.instance_id == rt.connection_id  # the lease id
    assert second.instance_id != first.instance_id
    host, port = services.etcd_url.removeprefix("etcd://").split(":")
    async with aetcd.Client(host=host, port=int(port)) as etcd:
        got = await etcd.get(f"v1/instances/test/keys/generate/{first.instance_id:x}".encode())
        assert got is not None
        record = Instance.from_json(got.value)
        assert record.transport["kind"] == "tcp"
        assert record.transport["address"].startswith("127.0.0.1:")
        lease = await etcd.get_lease_info(rt.connection_id)
        assert 0 < lease.TTL <= 10
    await rt.shutdown()
    async with aetcd.Client(host=host, port=int(port)) as etcd:
        assert await etcd.get(f"v1/instances/test/keys/generate/{first.instance_id:x}".encode()) is None


async def test_a_shut_down_runtime_refuses_work(make_runtime: RuntimeFactory) -> None:
    rt = await make_runtime("memory-inproc")
    endpoint = rt.endpoint("test.closed.generate")
    await endpoint.serve(words)
    await rt.shutdown()
    await rt.shutdown()  # twice is fine
    with pytest.raises(RuntimeClosedError):
        await endpoint.serve(words)
    with pytest.raises(RuntimeClosedError):
        await endpoint.client()


async def test_serve_endpoint_serves_until_shutdown(make_runtime: RuntimeFactory) -> None:
    rt = await make_runtime("memory-inproc")
    endpoint = rt.endpoint("test.forever.generate")
    serving = asyncio.create_task(endpoint.serve_endpoint(words))
    client = await endpoint.client()
    await client.wait_for_instances(timeout=5)
    assert await collect(client.round_robin({"text": "still here"})) == [{"word": "still"}, {"word": "here"}]
    assert not serving.done()
    await rt.shutdown()
    await asyncio.wait_for(serving, 5)


async def test_dynamo_worker_injects_the_runtime() -> None:
    from dynamo_nb import dynamo_worker

    @dynamo_worker(discovery="memory")
    async def worker(runtime: Any, text: str) -> list[Any]:
        endpoint = runtime.endpoint("test.decorated.generate")
        await endpoint.serve(words)
        client = await endpoint.client()
        return await collect(client.round_robin({"text": text}))

    assert await worker("a b") == [{"word": "a"}, {"word": "b"}]


@pytest.mark.parametrize(("stop_grace", "saw_the_stop"), [(0.05, False), (2.0, True)])
async def test_a_stopped_handler_runs_on_for_its_stop_grace_then_is_cancelled(
    make_runtime: RuntimeFactory, stop_grace: float, saw_the_stop: bool
) -> None:
    seen: list[str] = []

    async def slow(request: Any, context: Context) -> Any:
        for i in range(100):
            if context.is_stopped():
                seen.append("stopped")
                return
            await asyncio.sleep(1.0)  # longer than the short grace between checks, shorter than the long
            yield i

    rt = await make_runtime("memory-inproc")
    server = await rt.endpoint(f"grace.slow.g{int(stop_grace * 100)}").serve(slow, stop_grace=stop_grace)
    client = await rt.endpoint(f"grace.slow.g{int(stop_grace * 100)}").client()
    await client.wait_for_instances(timeout=5)
    context = Context()
    async for _item in client.round_robin({}, context=context):
        context.stop_generating()
        break
    for _ in range(100):
        if server.inflight == 0:
            break
        await asyncio.sleep(0.05)
    assert server.inflight == 0 and server.cancelled_total == 1
    assert (seen == ["stopped"]) is saw_the_stop  # it checked again (long grace) or was cancelled first
