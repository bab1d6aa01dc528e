"""Who may use the frontend's admin routes (``GET``/``PATCH /router_policy``).

The admin routes are off unless configured (Dynamo's have no authentication at all). When on,
each request must carry one of:

- ``Authorization: Bearer TOKEN``, the token in ``--admin-token-file`` (compared in constant
  time; plain HTTP carries it in clear, so keep it to loopback or a trusted network);
- ``X-Dynamo-NB-Admin-Signature: t=UNIX,n=NONCE,s=HMAC``, an HMAC-SHA256 with the cluster
  secret of the method, the path, the time, a nonce and the body's SHA-256 (`sign_admin_request`
  makes it). A signature more than `MAX_SKEW_SECONDS` old, or one seen before (a replay), is
  refused: the secret never crosses the network.

Anything else is a 401 (no credentials) or a 403 (wrong ones), saying which.

Example:
    >>> from dynamo_nb.runtime.security import ClusterSecret
    >>> secret = ClusterSecret(b"s" * 32)
    >>> auth = AdminAuth(secret=secret)
    >>> header = sign_admin_request(secret, "PATCH", "/router_policy", b"{}")
    >>> auth.check("PATCH", "/router_policy", {"x-dynamo-nb-admin-signature": header}, b"{}")
    'the cluster secret'
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ..errors import AdminAuthError, ConfigError
from ..runtime.security import ClusterSecret

__all__ = ["MAX_SKEW_SECONDS", "SIGNATURE_HEADER", "AdminAuth", "sign_admin_request"]

SIGNATURE_HEADER = "x-dynamo-nb-admin-signature"
MAX_SKEW_SECONDS = 30.0
_CONTEXT = b"dynamo_nb admin request"
_HOW = (
    "send Authorization: Bearer <the token in the frontend's --admin-token-file>, or sign the request "
    f"with the cluster secret in {SIGNATURE_HEADER} (dynamo_nb.frontend.admin.sign_admin_request)"
)


def _mac(secret: ClusterSecret, method: str, path: str, stamp: str, nonce: str, body: bytes) -> str:
    digest = hashlib.sha256(body).digest()
    return secret.mac(
        _CONTEXT, method.upper().encode(), path.encode(), stamp.encode(), nonce.encode(), digest
    ).hex()


def sign_admin_request(
    secret: ClusterSecret, method: str, path: str, body: bytes, *, now: float | None = None
) -> str:
    """The ``X-Dynamo-NB-Admin-Signature`` value for one request (a fresh nonce each call).

    Example::

        headers = {SIGNATURE_HEADER: sign_admin_request(secret, "PATCH", "/router_policy", body)}
    """
    stamp = str(int(time.time() if now is None else now))
    nonce = secrets.token_hex(16)
    return f"t={stamp},n={nonce},s={_mac(secret, method, path, stamp, nonce, body)}"


class AdminAuth:
    """Checks admin requests against a token and/or the cluster secret (at least one).

    Attributes:
        token: the bearer token, or None.
        secret: the cluster secret that signs requests, or None.
    """

    def __init__(
        self,
        token: str | None = None,
        secret: ClusterSecret | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not token and secret is None:
            raise ConfigError(
                "the admin API needs credentials: give --admin-token-file FILE, or a cluster secret "
                "(DYN_NB_CLUSTER_SECRET or --cluster-secret-file) to sign requests with"
            )
        self.token = token or None
        self.secret = secret
        self._clock = clock
        self._nonces: dict[str, float] = {}  # seen within the skew window: a replay is refused

    @classmethod
    def from_token_file(cls, path: str | os.PathLike[str] | None, secret: ClusterSecret | None) -> AdminAuth:
        """With the token in ``path`` (its first line; None: the secret alone)."""
        token = None
        if path is not None:
            try:
                token = next(iter(Path(path).read_text().splitlines()), "").strip()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read --admin-token-file {str(path)!r}: {exc.strerror or exc}"
                ) from None
            if len(token) < 16:
                raise ConfigError(
                    f"the admin token in {str(path)!r} is shorter than 16 characters: use a longer one"
                )
        return cls(token, secret)

    def check(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> str:
        """Who sent this request (``"the admin token"`` or ``"the cluster secret"``); else
        `AdminAuthError` (401 without credentials, 403 with wrong, stale or replayed ones)."""
        authorization = headers.get("authorization")
        signature = headers.get(SIGNATURE_HEADER)
        if authorization is None and signature is None:
            raise AdminAuthError(401, f"{method} {path} is an admin route and needs credentials: {_HOW}")
        if authorization is not None:
            scheme, _, token = authorization.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():  # e.g. the token alone: not echoed
                raise AdminAuthError(
                    401,
                    f"the Authorization header of {method} {path} must read 'Bearer <token>' (the word "
                    f"Bearer, a space, then the token): {_HOW}",
                )
            if self.token is None:
                raise AdminAuthError(
                    403,
                    f"this frontend has no admin token (started without --admin-token-file): sign {path} "
                    f"with the cluster secret in {SIGNATURE_HEADER} (dynamo_nb.frontend.admin.sign_admin_request)",
                )
            if not hmac.compare_digest(token.strip().encode(), self.token.encode()):
                raise AdminAuthError(403, f"wrong admin token for {method} {path}")
            return "the admin token"
        return self._check_signature(method, path, signature or "", body)

    def _check_signature(self, method: str, path: str, signature: str, body: bytes) -> str:
        if self.secret is None:
            raise AdminAuthError(403, f"this frontend has no cluster secret to check {SIGNATURE_HEADER} with")
        fields = dict(part.partition("=")[::2] for part in signature.split(","))
        stamp, nonce, mac = fields.get("t", ""), fields.get("n", ""), fields.get("s", "")
        if not (stamp.isdigit() and 16 <= len(nonce) <= 64 and mac):
            raise AdminAuthError(403, f"{SIGNATURE_HEADER} must be t=UNIX,n=NONCE,s=HMAC")
        expected = _mac(self.secret, method, path, stamp, nonce, body)
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            raise AdminAuthError(
                403,
                f"the signature of {method} {path} does not match: signed with another secret, or altered",
            )
        now = self._clock()
        age = now - int(stamp)
        if abs(age) > MAX_SKEW_SECONDS:
            raise AdminAuthError(
                403,
                f"the signature is {age:.0f} s old (at most {MAX_SKEW_SECONDS:.0f}): sign each request when it is sent",
            )
        self._nonces = {n: t for n, t in self._nonces.items() if now - t <= 2 * MAX_SKEW_SECONDS}
        if nonce in self._nonces:
            raise AdminAuthError(403, "this signature was used before (a replay): sign each request anew")
        self._nonces[nonce] = now
        return "the cluster secret"
