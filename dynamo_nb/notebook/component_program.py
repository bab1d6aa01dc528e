"""Say what a notebook's component is — a handler, an engine, or a routing policy — and it is a program.

One declaration, written in an exported cell (not tagged ``notebook-only``), serves in the kernel
at once and, after a plain ``jupyter nbconvert --to script``, is the program of a worker with the
shape of ``components/hf_worker.py``: one parser (the runtime flags, the model and engine flags
of an LLM worker, then the component's own, declared once), a READY line, SIGTERM / Ctrl-C, exit
codes (0 done, 2 a flag or setting that cannot work).

- `HandlerProgram(handler, endpoint=…)`: an async generator served at ``--endpoint``;
- `EngineProgram(MyEngine)`: an `dynamo_nb.engines.Engine` class served as an LLM worker behind
  the frontend (its model card, ``--mode`` roles, KV events, stats), built with
  ``await MyEngine.from_args(args, model_path, kv_events=…)`` from the parsed flags;
- `RoutingPolicy(pick)`: a function ``pick(request, instance_ids) -> instance_id`` that a
  frontend loads with ``--router-policy FILE:NAME`` (a ``.py`` file or a notebook).

The deployment (name, namespace, resources) is a literal ``DEPLOYMENT = {...}`` beside it, which
a graph reads without running anything (`dynamo_nb.graph.defaults`). A notebook's exported cells
then read top to bottom::

    DEPLOYMENT = {"name": "shout-worker", "namespace": "dynamo", "resources": {"cpu": 1, "memory": "2Gi"}}

    def add_shout_flags(parser):
        parser.add_argument("--shout-every", type=int, default=2, help="upper-case every Nth word")

    worker = EngineProgram(ShoutEngine, deployment=DEPLOYMENT, flags=add_shout_flags, model_name="shout")

    if __name__ == "__main__" and not in_notebook():
        sys.exit(worker.run())

In the kernel, ``await worker.serve(runtime, "--shout-every", 3)`` serves it on a runtime of the
notebook's. A graph service or a frontend flag that names the notebook finds its one declaration
(`find_component`); none, or two where one is expected, is a `ConfigError` naming the notebook.

Example:
    >>> async def words(request, context):
    ...     for word in request["text"].split():
    ...         yield {"word": word}
    >>> program = HandlerProgram(words, endpoint="demo.words.generate")
    >>> args = program.parse_args(["--discovery", "etcd://127.0.0.1:2379"])
    >>> args.endpoint, args.discovery
    ('demo.words.generate', 'etcd://127.0.0.1:2379')
    >>> find_component({"program": program, "words": words}, "demo.py") is program
    True
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from ..errors import ConfigError
from ..flags import add_endpoint_arg, add_engine_args, add_model_args, component_parser
from ..launch.declarations import pick_declaration, split_reference
from ..launch.paths import resolve_program
from ..launch.programs import declarations, export_notebook, import_program
from ..runtime.program import (
    announce_ready,
    configure_logging,
    run_program,
    runtime_from_args,
    shutdown_on_signals,
)

if TYPE_CHECKING:
    from ..engines.base import EngineClass
    from ..engines.engine_worker import EngineWorker
    from ..llm.protocol import PreprocessedRequest
    from ..runtime.serving import ServedInstance, ServingRuntime

__all__ = [
    "ComponentProgram",
    "EngineProgram",
    "HandlerProgram",
    "RoutingPolicy",
    "find_component",
    "load_component",
    "load_router_policy",
]

AddFlags = Callable[[argparse.ArgumentParser], None]
"""Adds a component's own flags to its parser: ``def add_flags(parser): parser.add_argument(...)``."""

Argv = Sequence["str | int | float | os.PathLike[str]"]

logger = logging.getLogger("dynamo_nb.component")


class ComponentProgram:
    """What every declaration has: its deployment, its parser, ``main`` and ``run`` (see the module docstring).

    Attributes:
        kind: ``handler``, ``engine`` or ``routing policy``.
        deployment: the component's ``DEPLOYMENT`` mapping (name, namespace, resources), or {}.
        description: the ``--help`` text.
        smoke: an optional ``async def smoke() -> None`` that checks the component in one process;
            it adds ``--smoke`` (run it, print ``smoke ok``, exit 0).
    """

    kind: ClassVar[str] = "component"
    runnable: ClassVar[bool] = True  # a program of its own (a routing policy is loaded by a frontend)

    def __init__(
        self,
        *,
        deployment: Mapping[str, Any] | None = None,
        description: str | None = None,
        flags: AddFlags | None = None,
        smoke: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        self.deployment = dict(deployment or {})
        self.description = description
        self.own_flags = flags
        self.smoke = smoke

    @property
    def name(self) -> str:
        """The deployment's ``name`` (its program name in ``--help``)."""
        return str(self.deployment.get("name") or self.kind.replace(" ", "-"))

    def _add_kind_flags(self, parser: argparse.ArgumentParser) -> None:
        """The flags every component of this kind takes (after the runtime flags)."""

    def build_parser(self) -> argparse.ArgumentParser:
        """Every flag of the program: the runtime flags, its kind's, its own, ``--log-level``.

        A flag defined twice (its own flags against each other or against the kind's) is a
        `ConfigError` that names it."""

        def own(parser: argparse.ArgumentParser) -> None:
            if self.own_flags is not None:
                self.own_flags(parser)
            if self.smoke is not None:
                parser.add_argument(
                    "--smoke", action="store_true", help="check the component in one process, then exit"
                )

        try:
            return component_parser(self.name, self.description, self._add_kind_flags, own)
        except argparse.ArgumentError as exc:
            raise ConfigError(
                f"{self.name}: the flag {exc.argument_name or ''} is defined twice ({exc.message}); "
                f"define each flag once (every {self.kind} program already has the runtime flags"
                f"{' and the model and engine flags' if self.kind == 'engine' else ''}{self._engine_flags_note()}: "
                "see --help)"
            ) from None

    def _engine_flags_note(self) -> str:
        """For an engine whose class adds flags of its own: which, so the user drops a copy."""
        return ""

    def parse_args(self, argv: Argv | None = None) -> argparse.Namespace:
        """The parsed flags (``argv``: strings, numbers or paths; None: the command line's)."""
        if argv is None:
            return self.build_parser().parse_args()
        return self.build_parser().parse_args(
            [str(a) if isinstance(a, (int, float)) else os.fspath(a) for a in argv]
        )

    async def main(self, argv: Argv | None = None) -> int:
        """Parse the flags and serve until SIGTERM / Ctrl-C (with ``--smoke``: check and exit)."""
        args = self.parse_args(argv)
        if self.smoke is not None and args.smoke:
            await self.smoke()
            print("smoke ok", flush=True)
            return 0
        configure_logging(args.log_level)
        runtime = await runtime_from_args(args)
        try:
            served = await self._serve_args(runtime, args)
            shutdown_on_signals(runtime)  # SIGTERM / Ctrl-C → runtime.shutdown(), before READY says so
            self._announce(served, args)
            await runtime.wait_closed()
        finally:
            await runtime.shutdown()
        await self._close(served)
        return 0

    def run(self) -> int:
        """``main`` as a program (on uvloop when installed): ``sys.exit(program.run())``."""
        return run_program(self.main)

    async def _serve_args(self, runtime: ServingRuntime, args: argparse.Namespace) -> Any:
        raise NotImplementedError

    def _announce(self, served: Any, args: argparse.Namespace) -> None:
        """Print the READY line of what ``_serve_args`` started."""
        raise NotImplementedError

    async def _close(self, served: Any) -> None:
        """Release what serving held (an engine's model)."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class HandlerProgram(ComponentProgram):
    """A handler (an async generator ``handler(request, context)``) served at ``--endpoint``.

    Its program prints ``READY <endpoint> instance=<id> address=<address>`` once it serves.

    Example::

        program = HandlerProgram(generate, endpoint="tutorial.words.generate", deployment=DEPLOYMENT)
        server = await program.serve(runtime)            # in the kernel
        sys.exit(program.run())                          # as a program
    """

    kind = "handler"

    def __init__(self, handler: Callable[..., Any], *, endpoint: str, **options: Any) -> None:
        super().__init__(**options)
        self.handler = handler
        self.endpoint = endpoint

    @property
    def name(self) -> str:
        return str(self.deployment.get("name") or getattr(self.handler, "__name__", "handler"))

    def _add_kind_flags(self, parser: argparse.ArgumentParser) -> None:
        add_endpoint_arg(parser, self.endpoint)

    async def serve(self, runtime: ServingRuntime, *argv: str | int | float) -> ServedInstance:
        """Serve the handler on ``runtime`` (at ``--endpoint``, as ``argv`` sets it); returns at
        once (on the kit's runtime, with its `dynamo_nb.EndpointServer`)."""
        return await self._serve_args(runtime, self.parse_args(list(argv)))

    async def _serve_args(self, runtime: ServingRuntime, args: argparse.Namespace) -> ServedInstance:
        return await runtime.endpoint(args.endpoint).serve(self.handler)

    def _announce(self, served: ServedInstance, args: argparse.Namespace) -> None:
        announce_ready(args.endpoint, instance=f"{served.instance_id:x}", address=served.address)


class EngineProgram(ComponentProgram):
    """An `dynamo_nb.engines.Engine` class served as an LLM worker (see the module docstring).

    Its flags are every engine worker's (``--model-path``, ``--model-name``, ``--endpoint``,
    ``--max-num-seqs``, ``--kv-cache-block-size``, ``--mode`` …), the engine class's own (its
    classmethod ``add_args(parser)`` where it has one: `dynamo_nb.engines.HFEngine`'s ``--device``,
    ``--dtype`` …, so a subclass of it takes them too) and the program's; the engine is
    built with ``await engine_class.from_args(args, model_path, kv_events=sink)``, and served
    in its ``--mode`` role by `dynamo_nb.engines.engine_worker.serve_engine`. It prints
    ``READY <endpoint> instance=<id> address=<address> model=<name>``.

    Args:
        engine_class: the engine (with a ``from_args`` classmethod coroutine).
        model_name: the served name when ``--model-name`` is not given (default:
            ``DYN_NB_MODEL_NAME``, else the model folder's, ``tiny-llama`` for the built-in model).
    """

    kind = "engine"

    def __init__(self, engine_class: EngineClass, *, model_name: str | None = None, **options: Any) -> None:
        super().__init__(**options)
        if not callable(getattr(engine_class, "from_args", None)):
            raise ConfigError(
                f"EngineProgram({getattr(engine_class, '__name__', engine_class)!r}): the engine needs a "
                "classmethod coroutine from_args(args, model_path, *, kv_events=None) that builds it "
                "(see dynamo_nb.engines.base)"
            )
        self.engine_class = engine_class
        self.model_name = model_name

    @property
    def name(self) -> str:
        return str(self.deployment.get("name") or getattr(self.engine_class, "__name__", "engine"))

    def _engine_flags_note(self) -> str:
        name = getattr(self.engine_class, "__name__", "the engine")
        if not callable(getattr(self.engine_class, "add_args", None)):
            return ""
        return f", and {name}.add_args adds the engine's own (drop flags= that adds them again, e.g. add_hf_args)"

    def _add_kind_flags(self, parser: argparse.ArgumentParser) -> None:
        add_model_args(parser)
        add_engine_args(parser)
        add_own_args = getattr(self.engine_class, "add_args", None)
        if callable(add_own_args):  # the engine's flags: HFEngine's --device, …, inherited by a subclass
            add_own_args(parser)
        if self.model_name is not None:
            parser.set_defaults(model_name=self.model_name)

    async def serve(self, runtime: ServingRuntime, *argv: str | int | float) -> EngineWorker:
        """Build the engine from ``argv`` (this program's flags) and serve it on ``runtime``, with
        its model card published; returns the `EngineWorker` at once (``await worker.engine.close()``
        when done)."""
        return await self._serve_args(runtime, self.parse_args(list(argv)))

    async def _serve_args(self, runtime: ServingRuntime, args: argparse.Namespace) -> EngineWorker:
        from ..disagg.modes import WorkerRole
        from ..engines.engine_worker import serve_engine
        from ..llm import model_from_args

        model_path, model_name = model_from_args(args)
        worker = await serve_engine(
            runtime,
            WorkerRole.from_args(args),
            model_path,
            model_name,
            lambda kv_events: self.engine_class.from_args(args, model_path, kv_events=kv_events),
        )
        return worker

    def _announce(self, served: EngineWorker, args: argparse.Namespace) -> None:
        logger.info("%s serves %s with %s", served.server, served.endpoint, served.engine)
        served.announce()

    async def _close(self, served: EngineWorker) -> None:
        await served.engine.close()


class RoutingPolicy(ComponentProgram):
    """A routing function ``pick(request, instance_ids) -> instance_id``, declared as a component.

    A frontend loads it with ``--router-policy FILE:NAME`` (FILE a ``.py`` file or a notebook,
    NAME this object's variable; without ``:NAME``, the file's one `RoutingPolicy`), and routes
    every model's requests with it (`dynamo_nb.router.FunctionRouter`). It is callable as the
    function itself, so ``frontend.set_router(model, policy)`` works in the kernel.

    Example:
        >>> policy = RoutingPolicy(lambda request, ids: min(ids))
        >>> policy(None, [7, 3, 5])
        3
    """

    kind = "routing policy"
    runnable = False

    def __init__(self, pick: Callable[[PreprocessedRequest, list[int]], int], **options: Any) -> None:
        super().__init__(**options)
        if not callable(pick):
            raise ConfigError(f"RoutingPolicy takes a function pick(request, instance_ids), got {pick!r}")
        self.pick = pick
        self.__name__ = getattr(pick, "__name__", "policy")

    def __call__(self, request: PreprocessedRequest, instance_ids: list[int]) -> int:
        return self.pick(request, instance_ids)

    async def main(self, argv: Argv | None = None) -> int:
        raise ConfigError(
            f"{self.name} is a routing policy, not a program: start components/frontend.py with "
            "--router-policy FILE:NAME to route with it"
        )


def find_component(
    namespace: Mapping[str, Any], where: str, *, runnable: bool | None = None, name: str | None = None
) -> ComponentProgram:
    """The `ComponentProgram` among ``namespace``'s values (a module's globals) that is wanted:
    ``name``, else the one of its kind (``runnable``: True a handler or engine, False a routing
    policy, None any), by `pick_declaration`'s rule.

    A `ConfigError` names ``where`` (the notebook or file) and what to change.
    """
    if name is not None and name in namespace:
        named = namespace[name]
        if not isinstance(named, ComponentProgram):
            raise ConfigError(
                f"{where}: {name} is a {type(named).__name__}, not a component declaration "
                "(HandlerProgram, EngineProgram or RoutingPolicy)"
            )
        pick_declaration(
            {name: named.kind}, where, runnable=runnable, name=name
        )  # its kind is the one wanted
        return named
    declared: dict[str, ComponentProgram] = {}
    for key, value in namespace.items():
        if isinstance(value, ComponentProgram) and not key.startswith("_"):
            if all(value is not seen for seen in declared.values()):  # one object under two names: once
                declared[key] = value
    picked = pick_declaration(
        {key: value.kind for key, value in declared.items()}, where, runnable=runnable, name=name
    )
    return declared[picked]


def load_component(
    reference: str, *, runnable: bool | None = None, cwd: Path | None = None
) -> ComponentProgram:
    """The component ``FILE`` or ``FILE:NAME`` declares (FILE a ``.py`` file or a notebook, found
    as `dynamo_nb.launch` finds programs), imported once; its ``__main__`` part does not run.
    Errors name the notebook (not its export) and say what to change.

    Example::

        policy = load_component("notebooks/06_kv_aware_routing.ipynb:prefix_policy", runnable=False)
    """
    file, name = split_reference(reference)
    path = resolve_program(file, cwd or Path.cwd())
    source_path = export_notebook(path) if path.suffix == ".ipynb" else path
    declared = declarations(source_path.read_text(), file)
    if runnable is not None and (name is None or name in declared):  # checked before anything runs
        pick_declaration(declared, file, runnable=runnable, name=name)
    module = import_program(source_path, file)
    return find_component(vars(module), file, runnable=runnable, name=name)


def load_router_policy(reference: str, *, cwd: Path | None = None) -> RoutingPolicy:
    """The `RoutingPolicy` ``--router-policy FILE[:NAME]`` names (a ``.py`` file or a notebook:
    found, exported and checked), loaded before anything starts; a `ConfigError` naming the flag.

    Example::

        policy = load_router_policy("notebooks/06_kv_aware_routing.ipynb:prefix_policy")
        frontend = await Frontend.start(runtime, config, router_policy=policy)
    """
    try:
        return cast(RoutingPolicy, load_component(reference, runnable=False, cwd=cwd))
    except ConfigError as exc:
        raise ConfigError(f"--router-policy {reference}: {exc}") from None
