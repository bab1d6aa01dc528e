"""Optional extras: what a part needs installed beyond the core, and the one-line error that
names the extra when it is missing.

Example:
    >>> require_extra("json", "the demo")  # importable: nothing happens
    >>> try:
    ...     require_extra("playwright_that_is_not_here", "the browser test", extra="browser")
    ... except MissingExtraError as exc:
    ...     print(exc)
    the browser test needs playwright_that_is_not_here, which is not installed here: pip install -e ".[browser]" (in a checkout) or pip install "dynamo-nb[browser]"
"""

from __future__ import annotations

import importlib.util

from .errors import MissingExtraError
from .install import EXTRAS

__all__ = ["broken_extra_error", "extra_installed", "require_extra"]


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
    if extra in EXTRAS:  # pip alone does not leave it importable: the kit's install step does
        raise MissingExtraError(
            f"{what} needs {module}, which is not installed here: python3 -m dynamo_nb install {extra}"
        )
    raise MissingExtraError(
        f'{what} needs {module}, which is not installed here: pip install -e ".[{extra}]" '
        f'(in a checkout) or pip install "dynamo-nb[{extra}]"'
    )


def broken_extra_error(
    module: str, what: str, error: BaseException, *, extra: str | None = None
) -> MissingExtraError:
    """The one-line error for ``module`` installed but failing to import with ``error``: it names
    the package to fix (a torch companion built for another torch, found by importing each in a
    fresh interpreter) and the command that fixes it.

    Example::

        raise broken_extra_error("vllm", "the vLLM worker", exc) from exc
        # error: the vLLM worker needs vllm, which does not import because torchvision 0.28.0 does
        # not load beside torch 2.13.0+cpu (…): python3 -m dynamo_nb install vllm removes torchvision …
    """
    from .install import companion_problems

    extra = extra or module
    problems = companion_problems()
    if problems:
        names = " and ".join(problem.package for problem in problems)
        return MissingExtraError(
            f"{what} needs {module}, which does not import because "
            + "; ".join(problem.sentence() for problem in problems)
            + f": python3 -m dynamo_nb install {extra} removes {names} (not needed for text models), "
            f"or install {names} built for this torch"
        )
    return MissingExtraError(
        f"{what} needs {module}, which is installed but does not import ({type(error).__name__}: {error}): "
        f"python3 -m dynamo_nb install {extra} checks and repairs the environment"
    )
