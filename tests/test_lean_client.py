"""The load generator's HTTP/1.1 client against raw socket servers: each way an answer's body
can end (chunked, a length, the close), interim answers, kept-alive connections reused or a new
one each, what it sends, a closed idle connection dropped, a request lost on a kept-alive
connection as it closed sent again once, an early close, bytes that
are not HTTP, a body read in pieces as it comes, a bounded wait, and TLS."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from dynamo_nb.bench.http_client import send_request
from dynamo_nb.errors import ConfigError, DynamoNBError
from dynamo_nb.http.lean_client import LeanHttpClient, ServerAnswerError, fetch

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]
"""Given a request's head and body, writes an answer; True keeps the connection open."""


class RawServer:
    """A socket server answering each request with ``answer``; it records heads and connections."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.heads: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await asyncio.sleep(0.01)  # the handlers see their connections close and return

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                body = await reader.readexactly(length)
                if not await self.answer(reader, writer, body):
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()


async def _answer_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # an interim answer first: skipped
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Request-Id: r1\r\n\r\n")
    for piece in (b"data: one\n\n", b"data: " + body + b"\n\n"):
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        await asyncio.sleep(0.01)
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    return True


async def _answer_length(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
    writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    return True


async def _answer_until_close(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes
) -> bool:
    writer.write(b"HTTP/1.0 200 OK\r\n\r\nall of it " + body)
    await writer.drain()
    return False


@pytest.fixture
async def client() -> AsyncIterator[LeanHttpClient]:
    async with LeanHttpClient() as lean:
        yield lean


@pytest.mark.parametrize(
    ("answer", "status", "body"),
    [
        (_answer_chunked, 200, b"data: one\n\ndata: hello\n\n"),
        (_answer_length, 201, b"hello"),
        (_answer_until_close, 200, b"all of it hello"),
    ],
)
async def test_each_way_a_body_ends_is_read_whole(
    client: LeanHttpClient, answer: Answer, status: int, body: bytes
) -> None:
    async with RawServer(answer) as server:
        for _ in range(2):
            got = await client.request("POST", server.url + "/v1/x?a=1", b"hello")
            assert (got.status, await got.read()) == (status, body)
        # a kept-alive answer leaves its connection for the next request; one that ends with
        # the close (HTTP/1.0, no length) cannot
        assert server.connections == (2 if answer is _answer_until_close else 1)
        head = server.heads[0]
        assert head.startswith(b"POST /v1/x?a=1 HTTP/1.1\r\n") and b"\r\nContent-Length: 5\r\n" in head
        assert b"Host: 127.0.0.1:" in head and b"Connection" not in head


async def test_a_chunked_body_is_handed_over_as_it_arrives(client: LeanHttpClient) -> None:
    async with RawServer(_answer_chunked) as server:
        answer = await client.request("POST", server.url, b"x")
        assert answer.headers["x-request-id"] == "r1"
        assert [piece async for piece in answer] == [b"data: one\n\n", b"data: x\n\n"]


async def test_lines_split_pieces_at_line_ends_whatever_the_chunks() -> None:
    async def split_oddly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b"data: o", b"ne\n\ndata: two\n", b"\nlast"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        return True

    async with RawServer(split_oddly) as server, LeanHttpClient() as client:
        answer = await client.request("GET", server.url)
        assert [line async for line in answer.lines()] == [
            b"data: one\n",
            b"\n",
            b"data: two\n",
            b"\n",
            b"last",
        ]


async def test_each_new_connection_starts_from_the_socket_factorys_socket() -> None:
    made: list[socket.socket] = []

    def factory() -> socket.socket:
        made.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        return made[-1]

    async with RawServer(_answer_length) as server:
        url = server.url
        status, body = await fetch(url, method="POST", body=b"hi", socket_factory=factory)
        assert (status, body, len(made)) == (201, b"hi", 1)
        async with LeanHttpClient(socket_factory=factory) as client:
            for _ in range(2):  # kept alive: one more socket for both
                assert await (await client.request("POST", server.url, b"a")).read() == b"a"
        assert len(made) == 2 and server.connections == 2
    with pytest.raises(ServerAnswerError, match="could not connect"):
        await fetch(url, socket_factory=factory)  # the server has gone
    assert all(sock.fileno() == -1 for sock in made)  # each closed, the refused one too


async def test_new_connection_mode_says_close_and_opens_one_per_request() -> None:
    async with RawServer(_answer_length) as server, LeanHttpClient(new_connection=True) as client:
        for _ in range(3):
            assert await (await client.request("POST", server.url, b"a")).read() == b"a"
        assert server.connections == 3
        assert all(b"\r\nConnection: close\r\n" in head for head in server.heads)


async def test_headers_given_to_the_client_and_to_a_request_are_sent() -> None:
    async with RawServer(_answer_length) as server:
        async with LeanHttpClient(headers={"Authorization": "Bearer k"}) as client:
            await (await client.request("POST", server.url, b"", {"Accept": "text/event-stream"})).read()
        assert (
            b"Authorization: Bearer k\r\n" in server.heads[0]
            and b"Accept: text/event-stream\r\n" in server.heads[0]
        )
    with pytest.raises(ConfigError, match="has a line break"):
        LeanHttpClient(headers={"X": "a\r\nInjected: b"})


async def test_an_idle_connection_the_server_closed_is_not_reused(client: LeanHttpClient) -> None:
    """The server said keep-alive but closed: once its close arrives the connection leaves the
    pool, and the next request opens a new one."""
    served = 0

    async def answer_then_close_quietly(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes
    ) -> bool:
        nonlocal served
        served += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # says keep-alive…
        await writer.drain()
        return False  # …but closes

    async with RawServer(answer_then_close_quietly) as server:
        assert await (await client.request("POST", server.url, b"")).read() == b"ok"
        await asyncio.sleep(0.05)  # the close arrives; the idle connection is dropped
        assert await (await client.request("POST", server.url, b"")).read() == b"ok"
        assert server.connections == 2 and served == 2


async def test_a_reused_connection_closed_on_arrival_is_sent_again(client: LeanHttpClient) -> None:
    """The close and the request cross on the wire: the kept-alive connection looks open when
    taken, and the request is lost; it goes again on a new connection."""
    requests = 0

    async def first_answers_then_drops(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes
    ) -> bool:
        nonlocal requests
        requests += 1
        if requests == 2:
            return False  # the second request on the first connection: closed unanswered
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        return True

    async with RawServer(first_answers_then_drops) as server:
        assert await (await client.request("POST", server.url, b"")).read() == b"ok"
        assert await (await client.request("POST", server.url, b"")).read() == b"ok"
        assert (requests, server.connections) == (3, 2)


async def test_a_body_cut_short_or_bytes_that_are_not_http_are_errors_that_say_so(
    client: LeanHttpClient,
) -> None:
    async def cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        return False

    async def not_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        return True

    async def bad_chunk(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        await writer.drain()
        return True

    async with RawServer(cut_short) as server:
        answer = await client.request("POST", server.url, b"")
        with pytest.raises(ServerAnswerError, match="closed the connection before its answer's end"):
            await answer.read()
    async with RawServer(not_http) as server:
        with pytest.raises(ServerAnswerError, match=r"not HTTP/1\.1: Expected HTTP/"):
            await client.request("POST", server.url, b"")
    async with RawServer(bad_chunk) as server:
        answer = await client.request("POST", server.url, b"")
        with pytest.raises(ServerAnswerError, match=r"not HTTP/1\.1: Invalid character in chunk size"):
            await answer.read()
    assert issubclass(ServerAnswerError, DynamoNBError) and issubclass(ServerAnswerError, ConnectionError)


async def test_refused_connections_and_bad_urls_say_what_is_wrong(client: LeanHttpClient) -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(ServerAnswerError, match=f"could not connect to 127.0.0.1:{port}"):
        await client.request("GET", f"http://127.0.0.1:{port}/")
    with pytest.raises(ConfigError, match="url must be http://"):
        await client.request("GET", "ftp://127.0.0.1/")


async def test_a_request_record_says_when_the_answer_did_not_come_in_time(client: LeanHttpClient) -> None:
    """`send_request` bounds the whole request; a server that never answers is an error row, and
    the connection it held is closed."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        await reader.read()  # until the client leaves
        return False

    async with RawServer(silent) as server:
        record: dict = {"output_tokens": None, "error": None, "path": None}
        await send_request(client, server.url, b"{}", record, stream=True, timeout=0.2, origin=0.0)
        assert record["error"] == "no complete answer within 0.2 s" and 0.2 <= record["e2e_s"] < 2
        await asyncio.sleep(0.01)  # the abort's close is reported in the next loop iteration
        assert not client._open  # the connection was closed, not left to the pool


async def test_a_cancelled_request_closes_its_connection(client: LeanHttpClient) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bool:
        await reader.read()
        return False

    async with RawServer(silent) as server:
        task = asyncio.ensure_future(client.request("POST", server.url, b""))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.01)
        assert not client._open


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by the ``openssl`` command."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.mark.processes  # openssl makes the certificate
async def test_https_goes_through_tls_with_the_given_context(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_tls)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x"
    try:
        trusted = ssl.create_default_context(cafile=str(cert))
        async with LeanHttpClient(ssl=trusted) as client:
            assert await (await client.request("POST", url, b"{}")).read() == b"secret"
        assert heads[0].startswith(b"POST /v1/x HTTP/1.1\r\n")
        async with LeanHttpClient() as client:  # the system's trust store does not know it
            with pytest.raises(ServerAnswerError, match=r"could not connect.*CERTIFICATE_VERIFY_FAILED"):
                await client.request("POST", url, b"{}")
    finally:
        server.close()
