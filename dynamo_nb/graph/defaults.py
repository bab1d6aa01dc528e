"""What a component declares about its own deployment, read from its file without running it.

A component program may assign a literal ``DEPLOYMENT`` mapping at module level::

    DEPLOYMENT = {"name": "sglang-worker", "namespace": "dynamo", "resources": {"gpu": 1}}

A graph service that names no ``resources`` gets the component's; its ``name`` and
``namespace`` label the Kubernetes objects. The file is parsed (`ast`), never imported, so
reading it needs none of the component's dependencies.

Example:
    >>> defaults_from_source('DEPLOYMENT = {"name": "w", "resources": {"gpu": 1}}', "w.py").resources.gpu
    1
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from .model import GraphError, Resources

__all__ = ["ComponentDefaults", "component_defaults", "defaults_from_source"]


@dataclass(frozen=True)
class ComponentDefaults:
    """A component's own deployment defaults (all empty when it declares none)."""

    name: str | None = None
    namespace: str | None = None
    resources: Resources = field(default_factory=Resources)


_CACHE: dict[Path, ComponentDefaults] = {}


def component_defaults(program: Path) -> ComponentDefaults:
    """The ``DEPLOYMENT`` a component file declares (parsed once per file)."""
    if program not in _CACHE:
        _CACHE[program] = defaults_from_source(program.read_text(), str(program))
    return _CACHE[program]


def defaults_from_source(source: str, where: str) -> ComponentDefaults:
    """`ComponentDefaults` from a component's source text; a `GraphError` when ``DEPLOYMENT`` is not a literal."""
    for node in ast.parse(source, filename=where).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "DEPLOYMENT" for target in node.targets
        ):
            try:
                data = ast.literal_eval(node.value)
            except ValueError:
                raise GraphError(
                    f"{where}: DEPLOYMENT must be a literal mapping (no names or calls)"
                ) from None
            if not isinstance(data, dict):
                raise GraphError(f"{where}: DEPLOYMENT must be a mapping, got {type(data).__name__}")
            unknown = sorted(set(data) - {"name", "namespace", "resources"})
            if unknown:
                raise GraphError(
                    f"{where}: DEPLOYMENT has unknown key {unknown[0]!r}; use name, namespace, resources"
                )
            return ComponentDefaults(
                name=data.get("name"),
                namespace=data.get("namespace"),
                resources=Resources.from_dict(data.get("resources"), f"{where}: DEPLOYMENT.resources"),
            )
    return ComponentDefaults()
