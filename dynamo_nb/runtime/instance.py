"""`Instance`: one server of an endpoint, as published in discovery."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, ProtocolError
from .names import EndpointPath

__all__ = ["Instance", "format_instance_id", "instance_key", "instances_prefix", "parse_instance_id"]

INSTANCES_ROOT = "v1/instances"


def format_instance_id(instance_id: int) -> str:
    """An instance id as people read it everywhere (READY lines, ``/health``, errors, tables): hex.

    Example:
        >>> format_instance_id(0x5204A7F7DE91D30B)
        '5204a7f7de91d30b'
    """
    return f"{instance_id:x}"


def parse_instance_id(value: int | str) -> int:
    """An instance id given either way: an int (as Dynamo's JSON carries it) or its hex string
    (as the kit prints it; ``0x`` optional). Raises `ConfigError` (a `ValueError`) naming both
    forms otherwise.

    Example:
        >>> parse_instance_id("5204a7f7de91d30b") == parse_instance_id(0x5204A7F7DE91D30B)
        True
        >>> parse_instance_id("0x2a")
        42
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        text = value.strip().lower().removeprefix("0x")
        if text and all(c in "0123456789abcdef" for c in text):
            return int(text, 16)
    raise ConfigError(
        f"{value!r} is not an instance id: give it as /health and READY lines print it (hex, "
        "e.g. '5204a7f7de91d30b') or as an integer"
    )


def instances_prefix(path: EndpointPath) -> str:
    """Discovery prefix under which the instances of ``path`` live."""
    return f"{INSTANCES_ROOT}/{path.namespace}/{path.component}/{path.endpoint}/"


def instance_key(path: EndpointPath, instance_id: int) -> str:
    """``v1/instances/{ns}/{comp}/{ep}/{instance_id:x}``."""
    return f"{instances_prefix(path)}{instance_id:x}"


@dataclass(frozen=True)
class Instance:
    """One process (or in-process server) serving an endpoint.

    ``transport`` says how to reach it: ``{"kind": "tcp"|"nats"|"inproc", "address": ..., "target": ...}``.

    Example:
        >>> i = Instance("demo", "echo", "generate", 0x2A, {"kind": "tcp", "address": "127.0.0.1:9"})
        >>> Instance.from_json(i.to_json()) == i
        True
    """

    namespace: str
    component: str
    endpoint: str
    instance_id: int
    transport: dict[str, str] = field(default_factory=dict, compare=True, hash=False)

    @property
    def path(self) -> EndpointPath:
        return EndpointPath(self.namespace, self.component, self.endpoint)

    @property
    def target(self) -> str:
        """What the server dispatches on: ``ns.comp.ep/{id:x}`` (``ns.comp.ep`` when static)."""
        return self.transport.get("target", "")

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "namespace": self.namespace,
                "component": self.component,
                "endpoint": self.endpoint,
                "instance_id": self.instance_id,
                "transport": self.transport,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Instance:
        """Parse a discovery value; raises ValueError if it is not an instance record."""
        record: Any = json.loads(data)
        try:
            return cls(
                str(record["namespace"]),
                str(record["component"]),
                str(record["endpoint"]),
                int(record["instance_id"]),
                {str(k): str(v) for k, v in dict(record["transport"]).items()},
            )
        except (KeyError, TypeError) as exc:
            raise ProtocolError(f"not an instance record: {record!r}") from exc

    def describe(self) -> str:
        """``ns.comp.ep/1a2b via tcp 127.0.0.1:4567``."""
        return f"{self.path}/{self.instance_id:x} via {self.transport.get('kind')} {self.transport.get('address')}"
