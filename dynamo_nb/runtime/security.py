"""Who may talk to a worker: a cluster secret (a keyed handshake) and TLS, for the TCP request
plane and the bootstrap server.

- **Cluster secret** (`ClusterSecret`): every process of a cluster is given the same secret, in
  ``$DYN_NB_CLUSTER_SECRET`` or a file (``$DYN_NB_CLUSTER_SECRET_FILE``, ``--cluster-secret-file``).
  A server then requires a handshake at connection time before it reads a single frame:

      server → client   MAGIC, server nonce (32 bytes)
      client → server   client nonce (32), HMAC-SHA256(key, "client", service, address, both nonces)
      server → client   HMAC-SHA256(key, "server", service, address, both nonces)

  Both sides prove they hold the secret; the secret never crosses the wire and a recorded
  handshake cannot be replayed (fresh nonces). The MACs name the service (the TCP plane or
  the bootstrap server) and the server's advertised address, the one its clients dial, so an
  answer made for one server is worth nothing at another: a stranger who registers an address
  of its own in discovery cannot relay a client's handshake to a real worker. A connection
  that fails it is closed.
- **TLS** (`TlsFiles`): with a certificate and key the listeners speak TLS (standard library
  `ssl`); clients always verify the server's certificate, against the CA given (else the
  system's CAs), and with a CA servers require a client certificate signed by it (mutual
  TLS). The handshake above then runs inside TLS.

Without either (the default) nothing changes: the local zero-config path has no handshake. One
process serves one cluster: `configure` sets what its runtimes, bootstrap servers and KV
fetches use; by default it is read from the environment (`PlaneSecurity.from_env`).

Example:
    >>> secret = ClusterSecret(b"correct horse battery staple")
    >>> server = ServerHandshake(secret, TCP_PLANE, "10.0.0.7:4000")
    >>> client = ClientHandshake(secret, TCP_PLANE, "10.0.0.7:4000")
    >>> answer, done, rest = client.feed(server.hello())
    >>> proof, rest = server.feed(answer)
    >>> client.feed(proof)
    (b'', True, b'')
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from ..errors import AuthenticationError, ConfigError
from .addresses import is_loopback

__all__ = [
    "BOOTSTRAP",
    "MAGIC",
    "TCP_PLANE",
    "ClientHandshake",
    "ClusterSecret",
    "PlaneSecurity",
    "ServerHandshake",
    "TlsFiles",
    "accept_peer",
    "configure",
    "current_security",
    "introduce_to_peer",
    "redact_url",
    "without_secret_hint",
]

MAGIC = b"DNBAUTH1"
TCP_PLANE = b"tcp request plane"
BOOTSTRAP = b"bootstrap server"
_NONCE = 32
_MAC = 32
HANDSHAKE_TIMEOUT = 10.0
SECRET_HINT = (
    "give every process of the cluster the same secret: $DYN_NB_CLUSTER_SECRET, or a file in "
    "$DYN_NB_CLUSTER_SECRET_FILE / --cluster-secret-file"
)


class ClusterSecret:
    """The secret every process of a cluster shares (at least 16 bytes; kept as a derived key).

    Example:
        >>> ClusterSecret(b"too short")
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: a cluster secret needs at least 16 bytes, got 9; make one with `python -c "import secrets; print(secrets.token_urlsafe(32))"`
    """

    __slots__ = ("_key",)

    def __init__(self, secret: bytes) -> None:
        secret = secret.strip()
        if len(secret) < 16:
            raise ConfigError(
                f"a cluster secret needs at least 16 bytes, got {len(secret)}; make one with "
                '`python -c "import secrets; print(secrets.token_urlsafe(32))"`'
            )
        self._key = hashlib.sha256(b"dynamo_nb cluster secret\0" + secret).digest()

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ClusterSecret:
        """The secret in file ``path`` (surrounding whitespace ignored)."""
        try:
            return cls(Path(path).read_bytes())
        except OSError as exc:
            raise ConfigError(f"cannot read the cluster secret file {os.fspath(path)!r}: {exc}") from None

    def mac(self, *parts: bytes) -> bytes:
        """HMAC-SHA256 of ``parts``, each length-prefixed (no two lists of parts read the same)."""
        message = b"".join(len(part).to_bytes(4, "big") + part for part in parts)
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def __repr__(self) -> str:
        return "<ClusterSecret>"  # never the secret


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS: this process's certificate and key, and the CA its peers' certificates
    are checked against (with a CA, servers also require client certificates: mutual TLS)."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    def server_context(self) -> ssl.SSLContext | None:
        """The listeners' context (built once); None without a certificate."""
        return self._server

    def client_context(self) -> ssl.SSLContext | None:
        """The connecting side's context (built once; verifies servers against the CA); None
        without TLS."""
        return self._client

    @functools.cached_property
    def _server(self) -> ssl.SSLContext | None:
        if not self.cert:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.ca)
        self._load_chain(context)
        if self.ca:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    @functools.cached_property
    def _client(self) -> ssl.SSLContext | None:
        if not self.cert and not self.ca:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        if self.cert:
            self._load_chain(context)
        return context

    def _load_chain(self, context: ssl.SSLContext) -> None:
        try:
            context.load_cert_chain(self.cert or "", self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"cannot load the TLS certificate {self.cert!r} and key {self.key!r}: {exc}"
            ) from None


@dataclass(frozen=True)
class PlaneSecurity:
    """What the TCP request plane and the bootstrap server require of a peer.

    Example:
        >>> PlaneSecurity().enabled
        False
    """

    secret: ClusterSecret | None = None
    tls: TlsFiles | None = None
    allow_unauthenticated: bool = False  # listen off loopback with neither (a trusted network)

    @property
    def enabled(self) -> bool:
        return self.secret is not None or self.tls is not None

    @property
    def authenticates_peers(self) -> bool:
        """Whether a stranger is refused: a cluster secret, or mutual TLS (a certificate and a CA
        that clients' certificates are checked against). TLS without a CA only encrypts.

        Example:
            >>> PlaneSecurity(tls=TlsFiles("cert.pem", "key.pem")).authenticates_peers
            False
        """
        return self.secret is not None or (self.tls is not None and bool(self.tls.cert and self.tls.ca))

    def check_listener(self, host: str, what: str) -> None:
        """Refuse (`ConfigError`) to listen on ``host`` when it is not loopback and nothing
        authenticates peers: anyone who reaches the port could make the worker generate. As
        Redis's protected mode: loopback stays zero-config, and ``allow_unauthenticated`` (the
        ``--allow-unauthenticated`` flag, ``DYN_NB_ALLOW_UNAUTHENTICATED=1``) opts out.

        Example:
            >>> PlaneSecurity().check_listener("127.0.0.1", "the TCP plane")
            >>> PlaneSecurity().check_listener("0.0.0.0", "the TCP plane")
            Traceback (most recent call last):
            ...
            dynamo_nb.errors.ConfigError: the TCP plane would listen on 0.0.0.0 with no cluster secret and no mutual TLS, so anyone who reaches it could use it: set DYN_NB_CLUSTER_SECRET (or --cluster-secret-file FILE, or --tls-cert, --tls-key and --tls-ca) on every process of the cluster, or pass --allow-unauthenticated on a network you trust
        """
        if self.authenticates_peers or self.allow_unauthenticated or is_loopback(host.strip("[]")):
            return
        raise ConfigError(
            f"{what} would listen on {host} with no cluster secret and no mutual TLS, so anyone who reaches "
            "it could use it: set DYN_NB_CLUSTER_SECRET (or --cluster-secret-file FILE, or --tls-cert, "
            "--tls-key and --tls-ca) on every process of the cluster, or pass --allow-unauthenticated on a "
            "network you trust"
        )

    @classmethod
    def from_settings(
        cls,
        secret_file: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_ca: str | None = None,
        allow_unauthenticated: bool = False,
    ) -> PlaneSecurity:
        """From flags (a secret file, TLS files), else ``$DYN_NB_CLUSTER_SECRET``; checked now,
        so a wrong path fails at start with what to change. ``allow_unauthenticated`` (or
        ``$DYN_NB_ALLOW_UNAUTHENTICATED=1``): listen off loopback without either."""
        secret = None
        if secret_file:
            secret = ClusterSecret.from_file(secret_file)
        elif os.environ.get("DYN_NB_CLUSTER_SECRET"):
            secret = ClusterSecret(os.environ["DYN_NB_CLUSTER_SECRET"].encode())
        if bool(tls_cert) != bool(tls_key):
            raise ConfigError(
                "TLS needs both a certificate and its key: give --tls-cert and --tls-key together"
            )
        tls = TlsFiles(tls_cert, tls_key, tls_ca) if (tls_cert or tls_ca) else None
        if tls is not None:
            tls.server_context()
            tls.client_context()
        allowed_by_env = os.environ.get("DYN_NB_ALLOW_UNAUTHENTICATED", "").strip().lower()
        allow = allow_unauthenticated or allowed_by_env in ("1", "true", "yes", "on")
        return cls(secret, tls, allow)

    @classmethod
    def from_env(cls) -> PlaneSecurity:
        """From ``DYN_NB_CLUSTER_SECRET`` / ``DYN_NB_CLUSTER_SECRET_FILE`` and ``DYN_NB_TLS_CERT``
        / ``DYN_NB_TLS_KEY`` / ``DYN_NB_TLS_CA``."""
        env = os.environ.get
        return cls.from_settings(
            env("DYN_NB_CLUSTER_SECRET_FILE"),
            env("DYN_NB_TLS_CERT"),
            env("DYN_NB_TLS_KEY"),
            env("DYN_NB_TLS_CA"),
        )

    def server_ssl(self) -> ssl.SSLContext | None:
        return self.tls.server_context() if self.tls is not None else None

    def client_ssl(self) -> ssl.SSLContext | None:
        return self.tls.client_context() if self.tls is not None else None


_CURRENT: PlaneSecurity | None = None


def configure(security: PlaneSecurity | None) -> None:
    """Set what this process's runtimes, bootstrap servers and KV fetches require (None: read
    the environment again). A component's flags call this at start."""
    global _CURRENT
    _CURRENT = security


def current_security() -> PlaneSecurity:
    """What `configure` set, else `PlaneSecurity.from_env` (read once)."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = PlaneSecurity.from_env()
    return _CURRENT


def redact_url(url: str) -> str:
    """``url`` with its password (or a token in place of a user) replaced by ``***``, for logs and
    messages: etcd and NATS URLs may carry credentials (``nats://user:password@host:4222``).

    Example:
        >>> redact_url("nats://app:hunter22@nats:4222"), redact_url("etcd://app:pa/ss@etcd:2379")
        ('nats://app:***@nats:4222', 'etcd://app:***@etcd:2379')
        >>> redact_url("etcd://127.0.0.1:2379")
        'etcd://127.0.0.1:2379'
    """
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")  # not urlsplit: a password may hold / ? or #
    if not sep or not at:
        return url
    user = userinfo.split(":", 1)[0] if ":" in userinfo else ""
    return f"{scheme}://{user}:***@{host}" if user else f"{scheme}://***@{host}"


# ----------------------------------------------------------------------------- the handshake


class ServerHandshake:
    """The listening side of the handshake (no I/O: feed it bytes, send what it returns), for
    ``service`` (`TCP_PLANE`, `BOOTSTRAP`) at the ``address`` it advertises (``host:port``)."""

    def __init__(self, secret: ClusterSecret, service: bytes, address: str) -> None:
        self.secret = secret
        self.bound = (service, address.encode())
        self.nonce = os.urandom(_NONCE)
        self._buffer = b""

    def hello(self) -> bytes:
        """What to send as soon as a connection is accepted."""
        return MAGIC + self.nonce

    def feed(self, data: bytes) -> tuple[bytes, bytes] | None:
        """None until the client's answer is complete; then (the proof to send, bytes after the
        answer: the first frames). Raises `AuthenticationError` for a wrong answer."""
        self._buffer += data
        if len(self._buffer) < _NONCE + _MAC:
            return None
        client_nonce, mac = self._buffer[:_NONCE], self._buffer[_NONCE : _NONCE + _MAC]
        rest = self._buffer[_NONCE + _MAC :]
        if not hmac.compare_digest(mac, self.secret.mac(b"client", *self.bound, self.nonce, client_nonce)):
            raise AuthenticationError(
                f"a peer does not know the cluster secret (or dialed another address than "
                f"{self.bound[1].decode()}); {SECRET_HINT}"
            )
        return self.secret.mac(b"server", *self.bound, self.nonce, client_nonce), rest


class ClientHandshake:
    """The connecting side of the handshake (no I/O), to ``service`` at ``address``: the
    ``host:port`` it dials, as discovery advertises it."""

    def __init__(self, secret: ClusterSecret, service: bytes, address: str) -> None:
        self.secret = secret
        self.bound = (service, address.encode())
        self.nonce = os.urandom(_NONCE)
        self._buffer = b""
        self._server_nonce: bytes | None = None

    @property
    def answered(self) -> bool:
        """Whether the server's hello came and was answered (a close now means: wrong secret)."""
        return self._server_nonce is not None

    def feed(self, data: bytes) -> tuple[bytes, bool, bytes]:
        """(bytes to send, whether the server is proven, bytes after the handshake). Raises
        `AuthenticationError` when the server does not speak it or does not know the secret."""
        self._buffer += data
        out = b""
        if self._server_nonce is None:
            if len(self._buffer) < len(MAGIC) + _NONCE:
                if not MAGIC.startswith(self._buffer[: len(MAGIC)]):
                    raise AuthenticationError(
                        f"the server did not start the cluster-secret handshake: it runs without the secret; {SECRET_HINT}"
                    )
                return b"", False, b""
            if self._buffer[: len(MAGIC)] != MAGIC:
                raise AuthenticationError(
                    f"the server did not start the cluster-secret handshake: it runs without the secret; {SECRET_HINT}"
                )
            self._server_nonce = self._buffer[len(MAGIC) : len(MAGIC) + _NONCE]
            self._buffer = self._buffer[len(MAGIC) + _NONCE :]
            out = self.nonce + self.secret.mac(b"client", *self.bound, self._server_nonce, self.nonce)
        if len(self._buffer) < _MAC:
            return out, False, b""
        proof, rest = self._buffer[:_MAC], self._buffer[_MAC:]
        if not hmac.compare_digest(
            proof, self.secret.mac(b"server", *self.bound, self._server_nonce, self.nonce)
        ):
            raise AuthenticationError(f"the server does not know the cluster secret; {SECRET_HINT}")
        return out, True, rest


def without_secret_hint(first_bytes: bytes) -> str | None:
    """Why a connection made without a secret failed, when its server asked for one (its first
    bytes are the handshake's hello), else None.

    Example:
        >>> without_secret_hint(MAGIC + bytes(32))[:44]
        'the server requires the cluster secret; give'
    """
    if first_bytes.startswith(MAGIC[:4]):
        return f"the server requires the cluster secret; {SECRET_HINT}"
    return None


async def accept_peer(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handshake: ServerHandshake,
    timeout: float = HANDSHAKE_TIMEOUT,
) -> None:
    """The server side of ``handshake`` on a stream; raises `AuthenticationError` (or a timeout)."""
    writer.write(handshake.hello())
    await writer.drain()
    answer = await asyncio.wait_for(reader.readexactly(_NONCE + _MAC), timeout)
    result = handshake.feed(answer)
    assert result is not None
    writer.write(result[0])
    await writer.drain()


async def introduce_to_peer(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handshake: ClientHandshake,
    timeout: float = HANDSHAKE_TIMEOUT,
) -> None:
    """The client side of ``handshake`` on a stream; raises `AuthenticationError`, or
    `asyncio.TimeoutError` when the server says nothing (it runs without the secret)."""
    hello = await asyncio.wait_for(reader.readexactly(len(MAGIC) + _NONCE), timeout)
    answer, _done, _rest = handshake.feed(hello)
    writer.write(answer)
    await writer.drain()
    try:
        proof = await asyncio.wait_for(reader.readexactly(_MAC), timeout)
    except asyncio.IncompleteReadError:
        raise AuthenticationError(
            "the server closed the connection after our handshake: it holds a different cluster "
            "secret, or advertises another address than the one dialed"
        ) from None
    except asyncio.TimeoutError:
        raise AuthenticationError(f"the server did not answer the handshake within {timeout:g} s") from None
    _answer, done, _rest = handshake.feed(proof)
    if not done:
        raise AuthenticationError("the cluster-secret handshake did not complete")
