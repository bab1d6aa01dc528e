"""Endpoint paths: ``namespace.component.endpoint``, also written ``dyn://namespace.component.endpoint``."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidNameError

__all__ = ["ALLOWED_CHARACTERS", "DEFAULT_WORKER_ENDPOINT", "EndpointPath", "validate_name"]

DEFAULT_WORKER_ENDPOINT = "dynamo.backend.generate"
"""Where a worker serves when no ``--endpoint`` is given (Dynamo's examples' default)."""

ALLOWED_CHARACTERS = "lowercase letters a-z, digits 0-9, '-' and '_'"
_NAME = re.compile(r"[a-z0-9_-]+")
_SCHEME = "dyn://"


def validate_name(kind: str, name: object, *, path: str | None = None) -> str:
    """Return ``name`` if it is a valid namespace/component/endpoint name, else raise.

    Example:
        >>> validate_name("component", "backend")
        'backend'
    """
    where = f" in endpoint path {path!r}" if path is not None else ""
    if not isinstance(name, str):
        raise InvalidNameError(f"{kind} name must be a string, got {type(name).__name__}{where}")
    if not name:
        raise InvalidNameError(f"{kind} name is empty{where}: use one or more of {ALLOWED_CHARACTERS}")
    if _NAME.fullmatch(name) is None:
        bad = " and ".join(repr(ch) for ch in dict.fromkeys(ch for ch in name if _NAME.fullmatch(ch) is None))
        raise InvalidNameError(
            f"invalid {kind} name {name!r}{where}: {bad} not allowed; use only {ALLOWED_CHARACTERS}"
        )
    return name


@dataclass(frozen=True)
class EndpointPath:
    """The address of an endpoint: namespace, component and endpoint names.

    Example:
        >>> p = EndpointPath.parse("dyn://demo.echo.generate")
        >>> p.component, str(p), p.url
        ('echo', 'demo.echo.generate', 'dyn://demo.echo.generate')
    """

    namespace: str
    component: str
    endpoint: str

    def __post_init__(self) -> None:
        validate_name("namespace", self.namespace)
        validate_name("component", self.component)
        validate_name("endpoint", self.endpoint)

    @classmethod
    def parse(cls, text: str) -> EndpointPath:
        """Parse ``ns.comp.ep`` or ``dyn://ns.comp.ep``; a bad part raises `InvalidNameError`."""
        if not isinstance(text, str):
            raise InvalidNameError(f"endpoint path must be a string, got {type(text).__name__}")
        body = text[len(_SCHEME) :] if text.startswith(_SCHEME) else text
        parts = body.split(".")
        if len(parts) != 3:
            raise InvalidNameError(
                f"invalid endpoint path {text!r}: expected 'namespace.component.endpoint' "
                f"(three names joined by '.', optionally prefixed with 'dyn://'), got {len(parts)} part(s)"
            )
        for kind, name in zip(("namespace", "component", "endpoint"), parts, strict=True):
            validate_name(kind, name, path=text)
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.namespace}.{self.component}.{self.endpoint}"

    @property
    def url(self) -> str:
        """The path with its ``dyn://`` scheme."""
        return f"{_SCHEME}{self}"
