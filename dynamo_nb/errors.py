"""The one error hierarchy of dynamo_nb.

Every error the library raises on purpose derives from `DynamoNBError`; each also derives
from the built-in it behaves like, so ``except ValueError`` or ``except TimeoutError`` keeps
working::

    DynamoNBError
    ├── ConfigError (ValueError)             a setting, flag or URL that cannot work
    │   └── InvalidNameError                 a namespace/component/endpoint name
    ├── InvalidHandlerError (TypeError)      a handler that is not an async generator
    ├── ProcessStartError                    a child process exited or was not ready in time
    │   ├── ServiceStartError                (also a ServiceError) a local etcd / nats-server
    │   └── LaunchError                      a component started with `dynamo_nb.launch`
    ├── ServiceError                         etcd / NATS: missing, failed to start, unreachable
    │   ├── BinaryNotFoundError
    │   ├── ServiceStartError
    │   └── ServiceUnavailableError (ConnectionError)
    ├── RequestError                         a request that did not complete
    │   ├── InvalidRequestError (ValueError) a request whose fields cannot be served (HTTP 400)
    │   ├── NoInstancesError (TimeoutError)  nobody serves the endpoint (within the timeout)
    │   │   └── InstanceNotFoundError        `direct()` to an id that is not serving
    │   ├── InstanceDownError (ConnectionError)
    │   │                                    refused, cut mid-stream, or silent past the heartbeat timeout
    │   ├── RemoteHandlerError               the handler raised; its type and message came back
    │   └── DisaggregationError              a prefill → decode handoff failed (bad params, KV fetch)
    └── RuntimeClosedError                   the runtime was shut down

Example:
    >>> from dynamo_nb.errors import NoInstancesError
    >>> issubclass(NoInstancesError, TimeoutError)
    True
"""

from __future__ import annotations

__all__ = [
    "BinaryNotFoundError",
    "ConfigError",
    "DisaggregationError",
    "DynamoNBError",
    "InstanceDownError",
    "InstanceNotFoundError",
    "InvalidHandlerError",
    "InvalidNameError",
    "InvalidRequestError",
    "LaunchError",
    "NoInstancesError",
    "ProcessStartError",
    "RemoteHandlerError",
    "RequestError",
    "RuntimeClosedError",
    "ServiceError",
    "ServiceStartError",
    "ServiceUnavailableError",
]


class DynamoNBError(Exception):
    """Base class of every error dynamo_nb raises on purpose."""


class ConfigError(DynamoNBError, ValueError):
    """A setting, flag or URL that cannot work; the message says what to change."""


class InvalidNameError(ConfigError):
    """A namespace, component or endpoint name with characters outside ``[a-z0-9_-]``."""


class InvalidHandlerError(DynamoNBError, TypeError):
    """A handler that is not an async generator ``handler(request[, context])``."""


class ServiceError(DynamoNBError):
    """etcd or NATS could not be found, started or reached."""


class BinaryNotFoundError(ServiceError):
    """The etcd or nats-server executable is not installed."""


class ProcessStartError(DynamoNBError):
    """A child process exited or did not become ready in time.

    Attributes:
        log_tail: the last lines the process wrote (they end the message too).
        returncode: its exit status, or None when it was still running (and was stopped).
    """

    def __init__(self, message: str, log_tail: str = "", returncode: int | None = None) -> None:
        super().__init__(message + (f"\n--- last log lines ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail
        self.returncode = returncode


class ServiceStartError(ServiceError, ProcessStartError):
    """A local etcd or nats-server exited or did not answer in time."""


class LaunchError(ProcessStartError):
    """A program started with `dynamo_nb.launch` exited, or was not ready within its timeout."""


class ServiceUnavailableError(ServiceError, ConnectionError):
    """etcd or NATS did not answer at the configured address."""


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

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class NoInstancesError(RequestError, TimeoutError):
    """Nobody serves the endpoint, or nobody started serving it within the timeout."""


class InstanceNotFoundError(NoInstancesError):
    """`Client.direct` named an instance id that does not serve the endpoint."""


class InstanceDownError(RequestError, ConnectionError):
    """The instance refused the connection, cut the stream before its end, or went silent.

    The client marks the instance down at once, so the next request goes elsewhere.
    """


class RemoteHandlerError(RequestError):
    """The remote handler raised; its exception type and message are carried here.

    Attributes:
        error_type: the class name of the handler's exception, e.g. ``"KeyError"``.
        remote_message: its message.
    """

    def __init__(
        self, error_type: str, remote_message: str, *, endpoint: str = "", instance_id: int | None = None
    ) -> None:
        where = f" (instance {instance_id:x} of {endpoint})" if instance_id is not None else ""
        super().__init__(
            f"handler raised {error_type}: {remote_message}{where}",
            endpoint=endpoint,
            instance_id=instance_id,
        )
        self.error_type = error_type
        self.remote_message = remote_message


class DisaggregationError(RequestError):
    """A prefill → decode handoff failed: malformed ``disaggregated_params`` or ``bootstrap_info``,
    a KV fetch that timed out or was refused, a prefill that failed, or a KV payload that does
    not fit the model. The message names what is wrong."""


class RuntimeClosedError(DynamoNBError):
    """The runtime was shut down; create a new one with `DistributedRuntime.create`."""
