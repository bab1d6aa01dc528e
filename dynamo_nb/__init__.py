"""dynamo_nb: distributed LLM serving in the style of NVIDIA Dynamo, made for Jupyter.

Example:
    >>> import dynamo_nb
    >>> async def generate(request, context):
    ...     for word in request["text"].split():
    ...         yield {"word": word}
    >>> async def main():
    ...     async with await dynamo_nb.DistributedRuntime.create() as rt:
    ...         endpoint = rt.namespace("demo").component("echo").endpoint("generate")
    ...         await endpoint.serve(generate)
    ...         client = await endpoint.client()
    ...         return [item async for item in client.round_robin({"text": "hello world"})]
    >>> import asyncio; asyncio.run(main())
    [{'word': 'hello'}, {'word': 'world'}]
"""

from __future__ import annotations

from . import errors
from ._client import Client, ResponseStream
from ._context import Context
from ._instance import Instance
from ._names import EndpointPath
from ._server import EndpointServer
from .errors import (
    ConfigError,
    DisaggregationError,
    DynamoNBError,
    InstanceDownError,
    InstanceNotFoundError,
    InvalidHandlerError,
    InvalidNameError,
    LaunchError,
    NoInstancesError,
    RemoteHandlerError,
    RequestError,
    RuntimeClosedError,
    ServiceError,
)
from .launch import ManagedProcess, launch, launched
from .notebook import in_notebook
from .runtime import Component, DistributedRuntime, Endpoint, Namespace
from .services import LocalServices
from .worker import dynamo_worker

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Component",
    "ConfigError",
    "Context",
    "DisaggregationError",
    "DistributedRuntime",
    "DynamoNBError",
    "Endpoint",
    "EndpointPath",
    "EndpointServer",
    "Instance",
    "InstanceDownError",
    "InstanceNotFoundError",
    "InvalidHandlerError",
    "InvalidNameError",
    "LaunchError",
    "LocalServices",
    "ManagedProcess",
    "Namespace",
    "NoInstancesError",
    "RemoteHandlerError",
    "RequestError",
    "ResponseStream",
    "RuntimeClosedError",
    "ServiceError",
    "dynamo_worker",
    "errors",
    "in_notebook",
    "launch",
    "launched",
]

for _name in __all__:
    _obj = globals()[_name]
    if (
        isinstance(_obj, type)
        and _obj.__module__.startswith("dynamo_nb.")
        and _obj.__module__ != "dynamo_nb.errors"
    ):
        _obj.__module__ = "dynamo_nb"
del _name, _obj
