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
from .errors import (
    ConfigError,
    DisaggregationError,
    DynamoNBError,
    EngineError,
    InstanceDownError,
    InstanceNotFoundError,
    InvalidHandlerError,
    InvalidNameError,
    InvalidRequestError,
    LaunchError,
    ModelNotFoundError,
    NoInstancesError,
    OverloadedError,
    RemoteHandlerError,
    RequestError,
    RoutingError,
    RuntimeClosedError,
    ServiceError,
)
from .jupyter import in_notebook
from .launch.launcher import ManagedProcess, launch, launched
from .launch.services import LocalServices
from .notebook.claims import claim
from .notebook.component_program import EngineProgram, HandlerProgram, RoutingPolicy
from .runtime.client import Client, ResponseStream
from .runtime.context import Context
from .runtime.distributed import Component, DistributedRuntime, Endpoint, Namespace
from .runtime.instance import Instance
from .runtime.names import EndpointPath
from .runtime.program import dynamo_worker
from .runtime.server import EndpointServer

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
    "EngineError",
    "EngineProgram",
    "HandlerProgram",
    "Instance",
    "InstanceDownError",
    "InstanceNotFoundError",
    "InvalidHandlerError",
    "InvalidNameError",
    "InvalidRequestError",
    "LaunchError",
    "LocalServices",
    "ManagedProcess",
    "ModelNotFoundError",
    "Namespace",
    "NoInstancesError",
    "OverloadedError",
    "RemoteHandlerError",
    "RequestError",
    "ResponseStream",
    "RoutingError",
    "RoutingPolicy",
    "RuntimeClosedError",
    "ServiceError",
    "claim",
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
