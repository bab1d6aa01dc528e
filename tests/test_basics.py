"""Names, contexts, wire frames, handler checks: the small pieces on their own."""

from __future__ import annotations

import asyncio
import pickle

import msgpack
import pytest

from dynamo_nb import Context, DistributedRuntime, EndpointPath, InvalidHandlerError, InvalidNameError
from dynamo_nb.errors import ConfigError, FrameTooLargeError, RemoteHandlerError
from dynamo_nb.runtime.planes.channel import NOT_READY
from dynamo_nb.runtime.planes.wire import MAX_FRAME_BYTES, FrameDecoder, encode_prefixed
from dynamo_nb.runtime.server import adapt_handler


@pytest.mark.parametrize("text", ["demo.echo.generate", "dyn://demo.echo.generate", "a-1.b_2.c"])
def test_endpoint_paths_parse(text: str) -> None:
    path = EndpointPath.parse(text)
    assert str(path) == text.removeprefix("dyn://")
    assert path.url == "dyn://" + str(path)


@pytest.mark.parametrize(
    ("text", "part", "bad"),
    [
        ("Demo.echo.generate", "namespace", "D"),
        ("demo.ec ho.generate", "component", " "),
        ("demo.echo.gen/erate", "endpoint", "/"),
        ("demo.echo.", "endpoint", None),
    ],
)
def test_bad_names_say_which_part_and_what_is_allowed(text: str, part: str, bad: str | None) -> None:
    with pytest.raises(InvalidNameError) as info:
        EndpointPath.parse(text)
    message = str(info.value)
    assert part in message
    assert "lowercase letters a-z, digits 0-9, '-' and '_'" in message
    if bad:
        assert repr(bad) in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("text", ["demo.echo", "a.b.c.d", "dyn://x"])
def test_paths_need_three_parts(text: str) -> None:
    with pytest.raises(InvalidNameError, match=r"namespace\.component\.endpoint"):
        EndpointPath.parse(text)


async def test_hierarchy_validates_each_name() -> None:
    async with await DistributedRuntime.create() as rt:
        with pytest.raises(InvalidNameError, match="namespace"):
            rt.namespace("Bad")
        with pytest.raises(InvalidNameError, match="component"):
            rt.namespace("ok").component("no.dots")
        with pytest.raises(InvalidNameError, match="endpoint"):
            rt.namespace("ok").component("ok").endpoint("")
        ep = rt.namespace("ns").component("comp").endpoint("ep")
        assert ep.path == rt.endpoint("dyn://ns.comp.ep").path
        assert ep.component().name == "comp"


async def test_context_stop_reaches_linked_children_once() -> None:
    parent = Context()
    child = Context(parent=parent)
    grandchild = Context(parent=child)
    calls: list[str] = []
    child.add_stop_callback(lambda: calls.append("child"))
    assert child.id == parent.id
    assert not await grandchild.stopped(timeout=0.01)
    parent.stop_generating()
    parent.stop_generating()
    assert child.is_stopped() and grandchild.is_stopped()
    assert await grandchild.stopped(timeout=1)
    assert calls == ["child"]


@pytest.mark.parametrize("plane", ["inproc", "tcp"])
async def test_a_stream_hands_over_items_already_received_without_an_await(plane: str) -> None:
    """`next_ready` gives the items that have arrived, in order, then `NOT_READY`; the stream's
    end or error stays the ``await``'s to raise, after the items (a relay's burst of tokens)."""
    async with await DistributedRuntime.create("memory", plane) as rt:
        release = asyncio.Event()

        async def three(request: dict) -> object:
            for n in range(3):
                yield {"n": n}
            await release.wait()
            raise ValueError("after the items")

        await rt.endpoint("t.ready.generate").serve(three)
        client = await rt.endpoint("t.ready.generate").client()
        await client.wait_for_instances(timeout=5)
        stream = await client.round_robin({})
        first = await stream.__anext__()
        for _ in range(500):  # the other two arrive
            if stream.ready >= 2:
                break
            await asyncio.sleep(0.01)
        assert [first, stream.next_ready(), stream.next_ready()] == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert stream.next_ready() is NOT_READY
        release.set()
        with pytest.raises(RemoteHandlerError, match="after the items"):
            await stream.__anext__()
        assert stream.next_ready() is NOT_READY


async def test_unlinked_child_ignores_parent() -> None:
    parent = Context()
    child = Context(parent=parent)
    child.unlink()
    parent.stop_generating()
    assert not child.is_stopped()


def test_frames_round_trip_in_pieces() -> None:
    frames = [[10, 1, {"text": "héllo", "n": [1, 2.5, None, True]}], [11, 1]]
    data = b"".join(encode_prefixed(f) for f in frames)
    decoder = FrameDecoder()
    out = []
    for i in range(len(data)):
        out += decoder.feed(data[i : i + 1])
    assert out == frames


def test_frames_are_msgpack_not_pickle() -> None:
    data = encode_prefixed([10, 1, {"a": 1}])
    assert msgpack.unpackb(data[4:]) == [10, 1, {"a": 1}]
    with pytest.raises(pickle.UnpicklingError):
        pickle.loads(data[4:])


def test_oversized_frames_are_refused() -> None:
    header = (MAX_FRAME_BYTES + 1).to_bytes(4, "big")
    with pytest.raises(FrameTooLargeError):
        FrameDecoder().feed(header + b"x")


def test_handlers_must_be_async_generators() -> None:
    async def coroutine(request):  # type: ignore[no-untyped-def]
        return request

    def plain(request):  # type: ignore[no-untyped-def]
        return request

    async def no_args():  # type: ignore[no-untyped-def]
        yield 1

    with pytest.raises(InvalidHandlerError, match="use `yield`"):
        adapt_handler(coroutine)
    with pytest.raises(InvalidHandlerError, match="async generator"):
        adapt_handler(plain)
    with pytest.raises(InvalidHandlerError, match=r"\(request\) or \(request, context\)"):
        adapt_handler(no_args)
    with pytest.raises(InvalidHandlerError, match="callable"):
        adapt_handler(42)


async def test_handler_with_or_without_context() -> None:
    seen: list[object] = []

    async def one(request):  # type: ignore[no-untyped-def]
        yield request

    class Worker:
        async def generate(self, request, context):  # type: ignore[no-untyped-def]
            seen.append(context)
            yield request

    ctx = Context()
    assert [x async for x in adapt_handler(one)({"a": 1}, ctx)] == [{"a": 1}]
    assert [x async for x in adapt_handler(Worker().generate)({"b": 2}, ctx)] == [{"b": 2}]
    assert seen == [ctx]


async def test_bad_configurations_say_what_to_change() -> None:
    with pytest.raises(ConfigError, match="discovery='memory'"):
        await DistributedRuntime.create("etcd://127.0.0.1:1", "inproc")
    with pytest.raises(ConfigError, match="nats_url"):
        await DistributedRuntime.create("memory", "nats")
    with pytest.raises(ConfigError, match="unknown discovery"):
        await DistributedRuntime.create("zookeeper://x")
    with pytest.raises(ConfigError, match="etcd://HOST:PORT"):
        await DistributedRuntime.create("etcd://")
    with pytest.raises(ConfigError, match="unknown request plane"):
        await DistributedRuntime.create("memory", "carrier-pigeon")


async def test_unreachable_etcd_and_nats_fail_fast_with_advice() -> None:
    from dynamo_nb.errors import ServiceUnavailableError

    with pytest.raises(ServiceUnavailableError, match="LocalServices"):
        await asyncio.wait_for(DistributedRuntime.create("etcd://127.0.0.1:1", connect_timeout=2), 20)
    with pytest.raises(ServiceUnavailableError, match="LocalServices"):
        await asyncio.wait_for(
            DistributedRuntime.create("static", "nats", "nats://127.0.0.1:1", connect_timeout=2), 20
        )
