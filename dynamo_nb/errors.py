"""The one error hierarchy of dynamo_nb.

Every error the library raises on purpose derives from `DynamoNBError`; each also derives
from the built-in it behaves like, so ``except ValueError`` or ``except TimeoutError`` keeps
working. Each class carries the HTTP answer it becomes at the frontend (``http_status``,
OpenAI's error ``openai_type`` and ``code``), so the status never depends on a class name::

    DynamoNBError                                      500 server_error
    ├── ConfigError (ValueError)                       a setting, flag or URL that cannot work
    │   ├── InvalidNameError                           a namespace/component/endpoint name
    │   └── MissingExtraError                          an optional extra that is not installed
    ├── InvalidHandlerError (TypeError)                a handler that is not an async generator
    ├── AdminAuthError                                 401 / 403 an admin route's request, without or with wrong credentials
    ├── ProtocolError (ValueError)                     a message that breaks the protocol
    │   ├── FrameTooLargeError                         a wire frame over the size limit
    │   └── AuthenticationError                        a peer without the cluster secret
    ├── ProcessError                                   a child process
    │   ├── ProcessStartError                          it exited or was not ready in time
    │   │   ├── ServiceStartError                      (also a ServiceError) a local etcd / nats-server
    │   │   └── LaunchError                            a component started with `dynamo_nb.launch`
    │   └── ProcessTimeoutError (TimeoutError)         it still ran when a wait ended
    ├── ServiceError                                   etcd / NATS: missing, failed to start, unreachable
    │   ├── BinaryNotFoundError
    │   ├── ServiceStartError
    │   └── ServiceUnavailableError (ConnectionError)  503
    ├── RequestError                                   a request that did not complete
    │   ├── InvalidRequestError (ValueError)           400 invalid_request_error
    │   │   ├── ModelNotFoundError (LookupError)       404 not_found_error, code model_not_found
    │   │   └── RouteOffError (LookupError)            404 not_found_error: a route turned off here
    │   ├── NoInstancesError (TimeoutError)            503 nobody serves it (within the timeout)
    │   │   └── InstanceNotFoundError                  `direct()` to an id that is not serving
    │   ├── OverloadedError                            503 workers and queue full (Retry-After)
    │   ├── RoutingError                               500 a router could not place the request
    │   ├── InstanceDownError (ConnectionError)        503 refused, cut mid-stream, or silent
    │   ├── NotReadyError                              503 a worker whose registration is not done
    │   ├── RemoteHandlerError                         the handler raised: the remote error's status
    │   ├── DisaggregationError                        503 a prefill → decode handoff failed
    │   └── EngineError                                500 an engine failed
    │       └── WorkerUnavailableError                 503 its server is down: the caller moves the request
    ├── RuntimeClosedError                             503 the runtime was shut down
    └── ClaimError (AssertionError)                    a notebook's measured sentence its numbers do not bear out

Example:
    >>> from dynamo_nb.errors import ModelNotFoundError, NoInstancesError
    >>> issubclass(NoInstancesError, TimeoutError), NoInstancesError.http_status
    (True, 503)
    >>> ModelNotFoundError("model 'x' not found").http_status, ModelNotFoundError.code
    (404, 'model_not_found')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

__all__ = [
    "AdminAuthError",
    "AuthenticationError",
    "BinaryNotFoundError",
    "ClaimError",
    "ConfigError",
    "DisaggregationError",
    "DynamoNBError",
    "EngineError",
    "FrameTooLargeError",
    "InstanceDownError",
    "InstanceNotFoundError",
    "InvalidHandlerError",
    "InvalidNameError",
    "InvalidRequestError",
    "LaunchError",
    "MissingExtraError",
    "ModelNotFoundError",
    "NoInstancesError",
    "NotReadyError",
    "OverloadedError",
    "ProcessError",
    "ProcessStartError",
    "ProcessTimeoutError",
    "ProtocolError",
    "RemoteHandlerError",
    "RequestError",
    "RouteOffError",
    "RoutingError",
    "RuntimeClosedError",
    "ServiceError",
    "ServiceStartError",
    "ServiceUnavailableError",
    "WorkerUnavailableError",
    "error_details",
]


class DynamoNBError(Exception):
    """Base class of every error dynamo_nb raises on purpose.

    Attributes:
        http_status: the HTTP status the frontend answers with when this error ends a request.
        openai_type: the ``type`` of the OpenAI error envelope.
        code: the envelope's ``code`` (None: the status is used).
        param: the request field at fault, when one is (OpenAI's ``param``).
    """

    http_status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    code: ClassVar[str | None] = None
    param: str | None = None


class ConfigError(DynamoNBError, ValueError):
    """A setting, flag or URL that cannot work; the message says what to change."""


class InvalidNameError(ConfigError):
    """A namespace, component or endpoint name with characters outside ``[a-z0-9_-]``."""


class MissingExtraError(ConfigError):
    """A part that needs an optional extra (vLLM, SGLang, torch) runs where it is not installed;
    the message names the extra to install (`dynamo_nb.extras.require_extra`)."""


class InvalidHandlerError(DynamoNBError, TypeError):
    """A handler that is not an async generator ``handler(request[, context])``."""


class ProtocolError(DynamoNBError, ValueError):
    """A message from another process that is not what the protocol says (a frame, an instance
    record, a model card, a KV event); the message says what was wrong."""


class FrameTooLargeError(ProtocolError):
    """A wire frame over `dynamo_nb.runtime.planes.wire.MAX_FRAME_BYTES`."""


class AuthenticationError(ProtocolError):
    """A peer that does not know the cluster secret (`dynamo_nb.runtime.security`), or that
    expects one this process was not given; the message says which and what to set."""


class AdminAuthError(DynamoNBError):
    """An admin route's request without credentials (401) or with wrong ones (403)."""

    openai_type = "authentication_error"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.http_status = status  # type: ignore[misc]  # 401 or 403, per request


class ProcessError(DynamoNBError):
    """A child process (a component, etcd, nats-server) did not do what was expected."""


class ProcessStartError(ProcessError):
    """A child process exited or did not become ready in time.

    Attributes:
        log_tail: the last lines the process wrote (they end the message too).
        returncode: its exit status, or None when it was still running (and was stopped).
        errors: the exception lines it printed, however early (in the message before the tail).
    """

    def __init__(
        self, message: str, log_tail: str = "", returncode: int | None = None, errors: Sequence[str] = ()
    ) -> None:
        found = "".join(f"\n  {line}" for line in errors)
        super().__init__(
            message
            + (f"\n--- exceptions in its log ---{found}" if found else "")
            + (f"\n--- last log lines ---\n{log_tail}" if log_tail else "")
        )
        self.log_tail = log_tail
        self.returncode = returncode
        self.errors = list(errors)


class ProcessTimeoutError(ProcessError, TimeoutError):
    """A child process still ran when a wait for its exit ended."""


class ServiceError(DynamoNBError):
    """etcd or NATS could not be found, started or reached."""


class BinaryNotFoundError(ServiceError):
    """The etcd or nats-server executable is not installed."""


class ServiceStartError(ServiceError, ProcessStartError):
    """A local etcd or nats-server exited or did not answer in time."""


class LaunchError(ProcessStartError):
    """A program started with `dynamo_nb.launch` exited, or was not ready within its timeout."""


class ServiceUnavailableError(ServiceError, ConnectionError):
    """etcd or NATS did not answer at the configured address."""

    http_status = 503
    openai_type = "service_unavailable_error"


class RequestError(DynamoNBError):
    """A request to an endpoint did not complete.

    Attributes:
        endpoint: the endpoint path, ``ns.comp.ep``.
        instance_id: the instance the request went to, when one was chosen.
    """

    def __init__(self, message: str, *, endpoint: str = "", instance_id: int | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.instance_id = instance_id


class InvalidRequestError(RequestError, ValueError):
    """A request whose fields cannot be served; the message says what to change.

    Attributes:
        param: the offending field, e.g. ``"temperature"`` (OpenAI's ``param``), or None.
    """

    http_status = 400
    openai_type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ModelNotFoundError(InvalidRequestError, LookupError):
    """A request named a model that no worker has ever registered here."""

    http_status = 404
    openai_type = "not_found_error"
    code = "model_not_found"


class RouteOffError(InvalidRequestError, LookupError):
    """A route this server has but does not serve as configured (the admin routes of a frontend
    started without admin credentials): a 404 that says how to turn it on.

    Example:
        >>> RouteOffError("/router_policy is off here").http_status
        404
    """

    http_status = 404
    openai_type = "not_found_error"


class NoInstancesError(RequestError, TimeoutError):
    """Nobody serves the endpoint, or nobody started serving it within the timeout."""

    http_status = 503
    openai_type = "service_unavailable_error"


class OverloadedError(RequestError):
    """The model's workers are full and the frontend's queue is too (or a wait for a slot ran
    out): answered at once with 503 (or the frontend's ``--overload-status``) and
    ``Retry-After`` (seconds, ``retry_after``).

    Attributes:
        reason: which limit was hit (``queue_full``, ``queue_timeout``).
        measured: the value that hit it (requests waiting, seconds waited).
        threshold: the limit itself (``--max-queue``, ``--queue-timeout``).
    """

    http_status = 503
    openai_type = "service_unavailable_error"
    code = "overloaded"
    retry_after = 1

    def __init__(
        self, message: str, *, reason: str = "overloaded", measured: float = 0, threshold: float = 0
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.measured = measured
        self.threshold = threshold


class RoutingError(RequestError):
    """A router could not place the request: a routing function written by a user raised, or
    picked an instance that does not serve the endpoint (a 500 naming the function)."""


class InstanceNotFoundError(NoInstancesError):
    """`Client.direct` named an instance id that does not serve the endpoint."""


class InstanceDownError(RequestError, ConnectionError):
    """The instance refused the connection, cut the stream before its end, or went silent.

    The client marks the instance down at once, so the next request goes elsewhere.
    """

    http_status = 503
    openai_type = "service_unavailable_error"


class NotReadyError(RequestError):
    """A worker got a request before its registration completed, and it did not complete in time."""

    http_status = 503
    openai_type = "service_unavailable_error"


class RemoteHandlerError(RequestError):
    """The remote handler raised; its exception type and message are carried here.

    When the handler raised one of ours, its HTTP answer travels too: ``http_status``,
    ``openai_type``, ``code`` and ``param`` are the remote error's (a worker's
    `InvalidRequestError` is a 400 at the frontend).

    Attributes:
        error_type: the class name of the handler's exception, e.g. ``"KeyError"``.
        remote_message: its message.
    """

    def __init__(
        self,
        error_type: str,
        remote_message: str,
        *,
        endpoint: str = "",
        instance_id: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        where = f" (instance {instance_id:x} of {endpoint})" if instance_id is not None else ""
        super().__init__(
            f"handler raised {error_type}: {remote_message}{where}",
            endpoint=endpoint,
            instance_id=instance_id,
        )
        self.error_type = error_type
        self.remote_message = remote_message
        details = details or {}
        status = details.get("status")
        if isinstance(status, int) and 400 <= status < 600:
            self.http_status = status  # type: ignore[misc]  # the remote error's answer
        for name in ("openai_type", "code", "param"):
            value = details.get(name)
            if isinstance(value, str):
                setattr(self, name, value)


class DisaggregationError(RequestError):
    """A prefill → decode handoff failed: malformed ``disaggregated_params`` or ``bootstrap_info``,
    a KV fetch that timed out or was refused, a prefill that failed, or a KV payload that does
    not fit the model. The message names what is wrong."""

    http_status = 503
    openai_type = "service_unavailable_error"
    code = "disaggregation_failed"


class EngineError(RequestError):
    """An engine failed: a model step raised, or a stream ended without its output."""


class WorkerUnavailableError(EngineError):
    """The server behind this worker cannot serve now (an upstream engine's server refused the
    connection, answered 5xx or cut the stream): another instance may. Raised in a handler, the
    caller sees the instance down (`InstanceDownError`): it skips the instance for a while and the
    frontend moves the request on (migration).

    Example:
        >>> WorkerUnavailableError("the upstream server http://127.0.0.1:8001 refused the connection").http_status
        503
    """

    http_status = 503
    openai_type = "service_unavailable_error"


class RuntimeClosedError(DynamoNBError):
    """The runtime was shut down; create a new one with `DistributedRuntime.create`."""

    http_status = 503
    openai_type = "service_unavailable_error"


class ClaimError(DynamoNBError, AssertionError):
    """A sentence `dynamo_nb.notebook.claims.claim` was asked to state that the measured values do not
    bear out (its message is the sentence and the values)."""


def error_details(exc: BaseException) -> dict[str, Any] | None:
    """What travels with a handler's error so the caller answers as the worker meant:
    the status, OpenAI type, code and param of one of our errors (None for any other).

    Example:
        >>> error_details(InvalidRequestError("bad", param="top_k"))
        {'status': 400, 'openai_type': 'invalid_request_error', 'code': None, 'param': 'top_k'}
        >>> error_details(KeyError("x")) is None
        True
    """
    if not isinstance(exc, DynamoNBError):
        return None
    return {"status": exc.http_status, "openai_type": exc.openai_type, "code": exc.code, "param": exc.param}
