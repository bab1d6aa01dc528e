"""Which component a file declares: the one rule that a graph, a frontend's ``--router-policy``,
`dynamo_nb.launch` and the export check share, whether they read a module's objects or its source.

A notebook (or ``.py`` file) may declare one worker (a `HandlerProgram` or an `EngineProgram`)
*and* routing policies; a reference ``FILE:NAME`` picks a declaration by name, ``FILE`` alone the
only one of the kind wanted there.

Example:
    >>> split_reference("notebooks/mine.ipynb:long_first")
    ('notebooks/mine.ipynb', 'long_first')
    >>> split_reference("components/hf_worker.py")
    ('components/hf_worker.py', None)
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError

__all__ = ["DECLARED_KINDS", "RUNNABLE_KINDS", "pick_declaration", "split_reference"]

WANTED = {None: "component", True: "worker (HandlerProgram or EngineProgram)", False: "RoutingPolicy"}

DECLARED_KINDS = {"HandlerProgram": "handler", "EngineProgram": "engine", "RoutingPolicy": "routing policy"}
"""Each declaration's class name → its kind, as `ComponentProgram.kind` says it."""

RUNNABLE_KINDS = frozenset({"handler", "engine"})
"""The kinds that run as programs (a routing policy is loaded by a frontend)."""


def pick_declaration(
    declared: Mapping[str, str], where: str, *, runnable: bool | None = None, name: str | None = None
) -> str:
    """The one name among ``declared`` (name → kind: ``"handler"``, ``"engine"``, ``"routing
    policy"``) that is wanted: ``name`` itself, else the only one of the wanted kind (``runnable``:
    True a handler or engine, False a routing policy, None any). One rule for every caller: a
    notebook may declare one worker *and* routing policies, and ``FILE:NAME`` picks among several.

    A `ConfigError` names ``where`` and what to change: no declaration of that kind, several
    (name one, ``FILE:NAME``), a ``name`` it does not declare, or one of the other kind.

    Example:
        >>> declared = {"worker": "engine", "long_first": "routing policy"}
        >>> pick_declaration(declared, "mine.ipynb", runnable=True), pick_declaration(declared, "mine.ipynb", runnable=False)
        ('worker', 'long_first')
        >>> pick_declaration(declared, "mine.ipynb", name="long_first")
        'long_first'
    """
    listed = ", ".join(f"{key} ({kind})" for key, kind in declared.items()) or "nothing"
    wanted = WANTED[runnable]
    if name is not None:
        if name not in declared:
            raise ConfigError(f"{where} declares no {name!r} (it declares {listed})")
        if runnable is not None and (declared[name] in RUNNABLE_KINDS) != runnable:
            hint = (
                "a frontend loads a routing policy with --router-policy FILE:NAME"
                if runnable
                else "a worker runs as a program: a graph's component, or launch()"
            )
            raise ConfigError(f"{where}: {name} is a {declared[name]}; a {wanted} is expected here ({hint})")
        return name
    matching = [
        key for key, kind in declared.items() if runnable is None or (kind in RUNNABLE_KINDS) == runnable
    ]
    if not matching:
        also = f" (it declares {listed})" if declared else ""
        example = "policy = RoutingPolicy(pick)" if runnable is False else "worker = EngineProgram(MyEngine)"
        raise ConfigError(
            f"{where} defines no {wanted}{also}: declare one in a cell that is exported (not tagged "
            f"notebook-only), e.g. {example}"
        )
    if len(matching) > 1:
        picked = ", ".join(f"{key} ({declared[key]})" for key in matching)
        raise ConfigError(
            f"{where} declares {len(matching)} of the kind wanted here ({picked}): name one, "
            f"{where}:{matching[0]}"
        )
    return matching[0]


def split_reference(reference: str) -> tuple[str, str | None]:
    """``FILE:NAME`` → ``(FILE, NAME)``; ``FILE`` → ``(FILE, None)``. Only a ``.py`` or ``.ipynb``
    file takes a name, so a Windows drive (``C:\\x.py``) or a ``-m`` module is left whole."""
    file, sep, name = reference.rpartition(":")
    if sep and name.isidentifier() and file.endswith((".py", ".ipynb")):
        return file, name
    return reference, None
