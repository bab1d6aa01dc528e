"""Optional extras: what a part needs installed beyond the core, and the one-line error that
names the extra when it is missing.

Example:
    >>> require_extra("json", "the demo")  # importable: nothing happens
    >>> try:
    ...     require_extra("vllm_that_is_not_here", "the vLLM worker", extra="vllm")
    ... except MissingExtraError as exc:
    ...     print(exc)
    the vLLM worker needs vllm_that_is_not_here, which is not installed here: pip install -e ".[vllm]" (in a checkout) or pip install "dynamo-nb[vllm]"
"""

from __future__ import annotations

import importlib.util

from .errors import MissingExtraError

__all__ = ["extra_installed", "require_extra"]


def extra_installed(module: str) -> bool:
    """Whether ``module`` (a top-level package such as ``vllm``) can be imported here, without
    importing it.

    Example:
        >>> extra_installed("json"), extra_installed("no_such_package_here")
        (True, False)
    """
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require_extra(module: str, what: str, *, extra: str | None = None) -> None:
    """Raise `MissingExtraError` (one line: what needs it and the ``pip install`` that brings it)
    when ``module`` is not installed; ``extra`` is the package extra that installs it (default:
    ``module``)."""
    if extra_installed(module):
        return
    extra = extra or module
    raise MissingExtraError(
        f'{what} needs {module}, which is not installed here: pip install -e ".[{extra}]" '
        f'(in a checkout) or pip install "dynamo-nb[{extra}]"'
    )
