"""`ServingRuntime`: the part of a runtime a component's ``main`` uses, so that the same program
runs on the kit's runtime (`dynamo_nb.DistributedRuntime`) and on NVIDIA Dynamo's
(`dynamo_nb.on_dynamo.DynamoRuntime`): an endpoint served with a handler, shutdown, and the wait
for it. mypy checks that both are one.

Example::

    runtime: ServingRuntime = await runtime_from_args(args)      # --runtime dynamo_nb | dynamo
    server = await runtime.endpoint("demo.echo.generate").serve(handler)
    print(server.instance_id, server.address)
    await runtime.wait_closed()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .names import EndpointPath

if TYPE_CHECKING:
    from .distributed import DistributedRuntime

__all__ = ["ServedInstance", "ServingEndpoint", "ServingRuntime"]


class ServedInstance(Protocol):
    """One endpoint served: its instance id and the address it is reached at."""

    @property
    def instance_id(self) -> int: ...

    @property
    def address(self) -> str: ...


class ServingEndpoint(Protocol):
    """An endpoint of a `ServingRuntime`: its path, and `serve` (a handler: an async generator
    of ``(request, context)``), which returns once the instance is registered."""

    @property
    def path(self) -> EndpointPath: ...

    async def serve(self, handler: Any) -> ServedInstance: ...


class ServingRuntime(Protocol):
    """What a component's ``main`` uses of its runtime, whoever's it is (see the module docstring)."""

    def endpoint(self, path: str) -> ServingEndpoint: ...

    @property
    def is_shutdown(self) -> bool: ...

    async def shutdown(self, grace: float = ...) -> None: ...

    async def wait_closed(self) -> None: ...


if TYPE_CHECKING:

    def _the_kits_runtime_serves(runtime: DistributedRuntime) -> ServingRuntime:
        """mypy checks here that the kit's runtime is a `ServingRuntime`."""
        return runtime
