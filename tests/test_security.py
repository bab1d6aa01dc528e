"""Authenticated planes: with a cluster secret the TCP request plane and the bootstrap server
talk only to peers that prove they hold it (a keyed handshake; the secret never crosses the
wire); with TLS files they speak TLS, mutual with a CA. Without either, nothing changes.

A stranger's REQUEST frame to a worker used to stream tokens back; with a secret it gets the
handshake's hello and a closed connection."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from helpers import FRONTEND, HF_WORKER, MOCKER_WORKER, collect, free_port

from dynamo_nb import DisaggregationError, DistributedRuntime, bench
from dynamo_nb.disagg import BootstrapInfo, BootstrapServer, draw_room, draw_token, fetch_kv
from dynamo_nb.errors import AuthenticationError, ConfigError, RequestError
from dynamo_nb.launch import find_binary, launch
from dynamo_nb.runtime.planes.wire import REQUEST
from dynamo_nb.runtime.security import (
    BOOTSTRAP,
    MAGIC,
    TCP_PLANE,
    ClientHandshake,
    ClusterSecret,
    PlaneSecurity,
    ServerHandshake,
    TlsFiles,
)

pytestmark = pytest.mark.timeout(180)

HERE = "10.0.0.7:4000"
SECRET = ClusterSecret(b"a cluster secret for the tests, 41 bytes")
OTHER = ClusterSecret(b"another secret, just as long as the first")
PREFIX = struct.Struct(">I")


async def words(request: Any) -> Any:
    for word in request["text"].split():
        yield {"word": word}


def test_the_handshake_proves_both_sides_and_refuses_a_wrong_secret() -> None:
    server, client = ServerHandshake(SECRET, TCP_PLANE, HERE), ClientHandshake(SECRET, TCP_PLANE, HERE)
    answer, done, _ = client.feed(server.hello())
    assert not done and len(answer) == 64 and SECRET.mac(b"x") not in answer
    result = server.feed(answer + b"first frame")
    assert result is not None and result[1] == b"first frame"
    assert client.feed(result[0] + b"items") == (b"", True, b"items")

    stranger = ClientHandshake(OTHER, TCP_PLANE, HERE)
    server = ServerHandshake(SECRET, TCP_PLANE, HERE)
    answer, _, _ = stranger.feed(server.hello())
    with pytest.raises(AuthenticationError, match="does not know the cluster secret"):
        server.feed(answer)
    impostor = ServerHandshake(OTHER, TCP_PLANE, HERE)  # a server that does not know it either
    client = ClientHandshake(SECRET, TCP_PLANE, HERE)
    answer, _, _ = client.feed(impostor.hello())
    with pytest.raises(AuthenticationError, match="server does not know"):
        client.feed(OTHER.mac(b"server", TCP_PLANE, HERE.encode(), impostor.nonce, client.nonce))
    with pytest.raises(AuthenticationError, match="runs without the secret"):
        ClientHandshake(SECRET, TCP_PLANE, HERE).feed(PREFIX.pack(5) + b"frame")
    # an answer made for one server is refused by another: a stranger that registers an address
    # of its own cannot relay a client's handshake to a real worker (nor the plane's to a bootstrap server)
    for service, address in [(TCP_PLANE, "10.0.0.9:4000"), (BOOTSTRAP, HERE)]:
        real, relayed = ServerHandshake(SECRET, TCP_PLANE, HERE), ClientHandshake(SECRET, service, address)
        answer, _, _ = relayed.feed(real.hello())
        with pytest.raises(AuthenticationError, match=r"dialed another address than 10\.0\.0\.7:4000"):
            real.feed(answer)
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        ClusterSecret(b"short")
    assert repr(SECRET) == "<ClusterSecret>"  # never the secret


async def runtimes(server_security: PlaneSecurity, client_security: PlaneSecurity) -> tuple[Any, Any, Any]:
    server_rt = await DistributedRuntime.create("memory", "tcp", security=server_security)
    client_rt = await DistributedRuntime.create("memory", "tcp", security=client_security)
    server = await server_rt.endpoint("sec.words.generate").serve(words)
    return server_rt, client_rt, server


async def ask(client_rt: Any) -> list[Any]:
    client = await client_rt.endpoint("sec.words.generate").client()
    await client.wait_for_instances(timeout=5)
    return await collect(client.round_robin({"text": "hello there"}))


@pytest.mark.parametrize(
    ("server", "client", "error"),
    [
        (SECRET, SECRET, None),
        (SECRET, OTHER, "holds a different cluster secret"),
        (SECRET, None, "requires the cluster secret"),
        (None, SECRET, "did not start the cluster-secret handshake"),
        (None, None, None),
    ],
    ids=["same secret", "wrong secret", "no secret", "server without", "neither"],
)
async def test_the_tcp_plane_serves_only_peers_with_the_cluster_secret(
    server: ClusterSecret | None, client: ClusterSecret | None, error: str | None
) -> None:
    server_rt, client_rt, _ = await runtimes(PlaneSecurity(server), PlaneSecurity(client))
    try:
        if error is None:
            assert await ask(client_rt) == [{"word": "hello"}, {"word": "there"}]
        else:
            with pytest.raises(RequestError, match=error):
                await ask(client_rt)
    finally:
        await client_rt.shutdown(grace=0)
        await server_rt.shutdown(grace=0)


async def stranger_request(address: str, target: str) -> bytes:
    """What a worker sends a stranger who connects and sends a REQUEST frame at once."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    body = msgpack.packb([REQUEST, 1, target, "r1", {"text": "leak me " * 10}])
    writer.write(PREFIX.pack(len(body)) + body)
    received = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 15):
            received += chunk
    except ConnectionResetError:
        pass
    finally:
        writer.close()
    return received


async def test_a_stranger_gets_the_hello_and_a_closed_connection() -> None:
    server_rt, client_rt, server = await runtimes(PlaneSecurity(SECRET), PlaneSecurity(SECRET))
    try:
        received = await stranger_request(server.address, "sec.words.generate")
        assert received[: len(MAGIC)] == MAGIC and len(received) == len(MAGIC) + 32  # nothing more
        assert await ask(client_rt) == [{"word": "hello"}, {"word": "there"}]  # still serving
    finally:
        await client_rt.shutdown(grace=0)
        await server_rt.shutdown(grace=0)


async def test_the_bootstrap_server_hands_kv_only_to_peers_with_the_secret() -> None:
    server = await BootstrapServer.start(ttl=30, security=PlaneSecurity(SECRET))
    try:
        room, token = draw_room(), draw_token()
        server.park(room, {"format": "x", "payload_bytes": 3}, b"kv!", token)
        info = BootstrapInfo(server.host, server.port, room, token)
        with pytest.raises(DisaggregationError, match="requires the cluster secret"):
            await fetch_kv(info, timeout=2, security=PlaneSecurity())
        with pytest.raises(DisaggregationError, match="holds a different cluster secret"):
            await fetch_kv(info, timeout=2, security=PlaneSecurity(OTHER))
        assert server.parked == 1  # refused fetches leave the room
        header, payload = await fetch_kv(info, timeout=2, security=PlaneSecurity(SECRET))
        assert payload == b"kv!" and header["format"] == "x"
    finally:
        await server.stop()
    plain = await BootstrapServer.start(ttl=30, security=PlaneSecurity())
    try:
        with pytest.raises(DisaggregationError, match="did not start the cluster-secret handshake"):
            await fetch_kv(
                BootstrapInfo(plain.host, plain.port, draw_room()), timeout=2, security=PlaneSecurity(SECRET)
            )
    finally:
        await plain.stop()


# ----------------------------------------------------------------------------- TLS and real processes


def make_certificates(folder: Path) -> dict[str, str]:
    """A CA and a certificate it signs for 127.0.0.1 (server and client use), with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make test certificates")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = lambda *args: subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)  # noqa: E731
    run(
        "req",
        "-x509",
        *key,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=dynamo_nb test CA",
    )
    run("req", *key, "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=node")
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    run(
        "x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "node.pem", "-days", "1", "-extfile", "ext.cnf",
    )  # fmt: skip
    return {"cert": str(folder / "node.pem"), "key": str(folder / "node.key"), "ca": str(folder / "ca.pem")}


@pytest.mark.processes
async def test_tls_on_the_tcp_plane_and_the_bootstrap_server(tmp_path: Path) -> None:
    files = make_certificates(tmp_path)
    tls = PlaneSecurity(SECRET, TlsFiles(files["cert"], files["key"], files["ca"]))
    server_rt, client_rt, _ = await runtimes(tls, tls)
    try:
        assert await ask(client_rt) == [{"word": "hello"}, {"word": "there"}]
        for security in (PlaneSecurity(SECRET), PlaneSecurity(SECRET, TlsFiles(ca=files["ca"]))):
            other = await DistributedRuntime.create("memory", "tcp", security=security)
            try:  # without TLS; with TLS but no client certificate (the server requires one)
                with pytest.raises(RequestError, match=r"unreachable|cut"):
                    await ask(other)
            finally:
                await other.shutdown(grace=0)
    finally:
        await client_rt.shutdown(grace=0)
        await server_rt.shutdown(grace=0)

    bootstrap = await BootstrapServer.start(ttl=30, security=tls)
    try:
        room = draw_room()
        bootstrap.park(room, {"format": "x", "payload_bytes": 2}, b"kv")
        _, payload = await fetch_kv(
            BootstrapInfo(bootstrap.host, bootstrap.port, room), timeout=2, security=tls
        )
        assert payload == b"kv"
    finally:
        await bootstrap.stop()


async def completion(url: str, model: str) -> dict[str, Any]:
    await bench.wait_for_model(url, model)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/v1/completions",
            json={"model": model, "prompt": "hello there", "max_tokens": 4, "ignore_eos": True},
            timeout=aiohttp.ClientTimeout(total=60),
        ) as response:
            text = await response.text()
            assert response.status == 200, text
            return json.loads(text)


async def test_workers_started_with_a_secret_refuse_strangers(
    services: Any, start_worker: Any, tmp_path: Path
) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("a secret shared by the processes of one cluster\n")
    etcd = ["--discovery", services.etcd_url, "--cluster-secret-file", str(secret_file)]
    # a model name of its own: the session's etcd may still hold other tests' tiny-llama cards
    worker = await start_worker(
        *etcd, "--endpoint", "sec.backend.generate", "--model-name", "sec-llama", script=MOCKER_WORKER
    )
    port = free_port()
    await start_worker(*etcd, "--http-port", str(port), script=FRONTEND)
    assert (await completion(f"http://127.0.0.1:{port}", "sec-llama"))["usage"]["completion_tokens"] == 4

    runtime = await DistributedRuntime.create(services.etcd_url, security=PlaneSecurity())
    try:
        client = await runtime.endpoint("sec.backend.generate").client()
        await client.wait_for_instances(timeout=10)
        address = client.instances()[0].transport["address"]
    finally:
        await runtime.shutdown(grace=0)
    received = await stranger_request(address, "sec.backend.generate")
    assert len(received) == len(MAGIC) + 32, received  # the hello, then the connection closed
    for _ in range(50):
        if any("refused a connection" in line for line in worker.logs()):
            break
        await asyncio.sleep(0.1)
    assert any("refused a connection" in line and "does not know" in line for line in worker.logs())

    plain = await start_worker(
        "--discovery", services.etcd_url, "--http-port", str(free_port()), script=FRONTEND
    )  # a frontend without the secret: the worker is unreachable, and it says why
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await bench.wait_for_model(plain.url, "sec-llama")
        async with session.post(
            f"{plain.url}/v1/completions", json={"model": "sec-llama", "prompt": "hi", "max_tokens": 2}
        ) as response:
            assert response.status == 503 and "requires the cluster secret" in await response.text()


async def test_disaggregated_workers_over_mutual_tls_with_a_secret(
    services: Any, start_worker: Any, tmp_path: Path
) -> None:
    files = make_certificates(tmp_path)
    flags = [
        "--discovery", services.etcd_url, "--tls-cert", files["cert"], "--tls-key", files["key"],
        "--tls-ca", files["ca"],
    ]  # fmt: skip
    env = {"DYN_NB_CLUSTER_SECRET": "a secret shared by the processes of one cluster"}
    roles = ["--endpoint", "tls.backend.generate", "--prefill-endpoint", "tls.prefill.generate",
             "--model-name", "tls-llama"]  # fmt: skip
    await start_worker(*flags, *roles, "--mode", "prefill", script=HF_WORKER, env=env)
    await start_worker(*flags, *roles, "--mode", "decode", script=HF_WORKER, env=env)
    port = free_port()
    await start_worker(*flags, "--http-port", str(port), script=FRONTEND, env=env)
    answer = await completion(f"http://127.0.0.1:{port}", "tls-llama")
    assert answer["usage"]["completion_tokens"] == 4  # the KV crossed the bootstrap server over TLS


@pytest.mark.processes
async def test_etcd_and_nats_with_credentials(tmp_path: Path) -> None:
    """etcd with authentication on and nats-server with a user: the URLs carry the credentials
    (never shown in messages); wrong ones fail at once with what to change."""
    nats_port, etcd_port, peer_port = free_port(), free_port(), free_port()
    nats_server = await launch(
        find_binary("nats-server"), "-a", "127.0.0.1", "-p", nats_port, "--user", "app", "--pass", "hunter22",
        ready="Server is ready", show_logs=False, log_dir=tmp_path,
    )  # fmt: skip
    client_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
    etcd = await launch(
        find_binary("etcd"), "--data-dir", tmp_path / "etcd", "--listen-client-urls", client_url,
        "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"default={peer_url}",
        ready="ready to serve client requests|serving client", show_logs=False, log_dir=tmp_path,
    )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:  # a root user, then authentication on
            for path, body in [
                ("user/add", {"name": "root", "password": "rootpw"}),
                ("role/add", {"name": "root"}),
                ("user/grant", {"user": "root", "role": "root"}),
                ("enable", {}),
            ]:
                async with session.post(f"{client_url}/v3/auth/{path}", json=body) as response:
                    assert response.status == 200, await response.text()
        etcd_url = f"etcd://root:rootpw@127.0.0.1:{etcd_port}"
        nats_url = f"nats://app:hunter22@127.0.0.1:{nats_port}"
        with pytest.raises(ConfigError, match=r"NATS at nats://app:\*\*\*@.* refused") as refused:
            await DistributedRuntime.create(etcd_url, "nats", nats_url.replace("hunter22", "wrong"))
        assert "wrong" not in str(refused.value)
        with pytest.raises(ConfigError, match="refused the user and password") as refused:
            await DistributedRuntime.create(etcd_url.replace("rootpw", "nope"), "nats", nats_url)
        assert "nope" not in str(refused.value)
        with pytest.raises(ConfigError, match="refused the user and password"):  # none given
            await DistributedRuntime.create(f"etcd://127.0.0.1:{etcd_port}", "tcp", connect_timeout=2)

        server_rt = await DistributedRuntime.create(etcd_url, "nats", nats_url)
        client_rt = await DistributedRuntime.create(etcd_url, "nats", nats_url)
        try:
            await server_rt.endpoint("sec.words.generate").serve(words)
            assert "rootpw" not in server_rt.discovery.describe()
            assert await ask(client_rt) == [{"word": "hello"}, {"word": "there"}]
        finally:
            await client_rt.shutdown(grace=0)
            await server_rt.shutdown(grace=0)
    finally:
        await etcd.stop()
        await nats_server.stop()


async def echo(request: Any, context: Any) -> Any:
    yield request


async def test_off_loopback_a_plane_without_a_secret_or_tls_refuses_to_listen() -> None:
    plain, trusting = PlaneSecurity(), PlaneSecurity(allow_unauthenticated=True)
    runtime = await DistributedRuntime.create("memory", "tcp", tcp_host="0.0.0.0", security=plain)
    try:
        with pytest.raises(ConfigError, match="--allow-unauthenticated"):
            await runtime.endpoint("open.echo.generate").serve(echo)
    finally:
        await runtime.shutdown(grace=0)
    with pytest.raises(ConfigError, match="the bootstrap server would listen on"):
        await BootstrapServer.start("0.0.0.0", security=plain)
    await (await BootstrapServer.start("0.0.0.0", security=trusting)).stop()
    secret = PlaneSecurity(SECRET)
    await (await BootstrapServer.start("0.0.0.0", security=secret)).stop()
    await (await BootstrapServer.start("127.0.0.1", security=plain)).stop()  # loopback: zero-config


def test_off_loopback_only_a_secret_or_mutual_tls_counts() -> None:
    """TLS that only encrypts (no CA to check clients against), or a CA alone, lets any client in."""
    for tls in (TlsFiles("node.pem", "node.key"), TlsFiles(ca="ca.pem")):
        with pytest.raises(ConfigError, match="no mutual TLS"):
            PlaneSecurity(tls=tls).check_listener("0.0.0.0", "the TCP request plane")
    PlaneSecurity(tls=TlsFiles("node.pem", "node.key", "ca.pem")).check_listener("0.0.0.0", "the plane")
    PlaneSecurity(SECRET).check_listener("0.0.0.0", "the TCP request plane")


@pytest.mark.processes
async def test_a_worker_on_a_wildcard_without_a_secret_refuses_to_start_naming_the_flag(
    tmp_path: Path,
) -> None:
    flags = [
        "--discovery",
        f"file://{tmp_path}",
        "--tcp-host",
        "0.0.0.0",
        "--endpoint",
        "open.backend.generate",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_NB_")}
    refused = await asyncio.create_subprocess_exec(
        sys.executable, str(MOCKER_WORKER), *flags, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = await asyncio.wait_for(refused.communicate(), 60)
    assert refused.returncode == 2, err.decode()[-2000:]
    last = err.decode().strip().splitlines()[-1]
    assert (
        last.startswith("error: the TCP request plane would listen on 0.0.0.0")
        and "--allow-unauthenticated" in last
    )
    worker = await launch(MOCKER_WORKER, *flags, "--allow-unauthenticated", log_dir=tmp_path, show_logs=False)
    try:
        assert worker.instance_id
    finally:
        await worker.stop(timeout=5)
