"""What a component declares about its own deployment, read from its file without running it.

A component program may assign a literal ``DEPLOYMENT`` mapping at module level::

    DEPLOYMENT = {"name": "sglang-worker", "namespace": "dynamo", "resources": {"gpu": 1}, "needs": ["sglang"]}

A graph service that names no ``resources`` gets the component's; its ``name`` and
``namespace`` label the Kubernetes objects; ``needs`` names the packages it imports beyond the
kit (``serve --dry-run`` warns where this host lacks one; a real start refuses). The file is parsed (`ast`), never imported, so
reading it needs none of the component's dependencies.

Example:
    >>> defaults_from_source('DEPLOYMENT = {"name": "w", "resources": {"gpu": 1}}', "w.py").resources.gpu
    1
    >>> defaults_from_source('DEPLOYMENT = {"needs": ["vllm"]}', "w.py").needs
    ('vllm',)
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
    needs: tuple[str, ...] = ()


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
            unknown = sorted(set(data) - {"name", "namespace", "resources", "needs"})
            if unknown:
                raise GraphError(
                    f"{where}: DEPLOYMENT has unknown key {unknown[0]!r}; use name, namespace, resources, needs"
                )
            needs = data.get("needs", [])
            if not isinstance(needs, list) or not all(isinstance(module, str) for module in needs):
                raise GraphError(f"{where}: DEPLOYMENT.needs must be a list of package names, got {needs!r}")
            return ComponentDefaults(
                name=data.get("name"),
                namespace=data.get("namespace"),
                resources=Resources.from_dict(data.get("resources"), f"{where}: DEPLOYMENT.resources"),
                needs=tuple(needs),
            )
    return ComponentDefaults()
