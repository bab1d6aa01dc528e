"""The parsers of every component, assembled from flags each defined once (docs/design.md §4b).

Most flags are declared on the config field they set (`dynamo_nb.settings`): the runtime's on
`dynamo_nb.runtime.RuntimeConfig`, the frontend's on `dynamo_nb.frontend.FrontendConfig` (with the
KV router's and its policy's), the worker role's on `dynamo_nb.disagg.modes.WorkerRole` (and
``--kv-timeout``), every engine worker's block size and running-request limit on
`dynamo_nb.engines.base.EngineLimits`, the model's on `dynamo_nb.models.folders.ModelChoice`, the
hf engine's on `dynamo_nb.engines.hf.HFSettings`, the mocker's on its settings and the SGLang
stand-in's on `dynamo_nb.engines.sglang_fake.StandInSettings`. What is still written here:
``--endpoint`` (each program sets its default), the logging flags (read before the parser runs),
the SGLang worker's ``--model-name`` (SGLang's ``--served-model-name`` comes first), and the flags
vLLM and SGLang define where they are not installed. The parsers are importable, so a standalone
program, a graph launcher and a notebook all read the same flags.

Each flag may take its default from a ``DYN_NB_*`` environment variable; a flag given on the
command line always wins, and ``--help`` shows every default.

Example:
    >>> args = hf_worker_parser().parse_args(["--discovery", "etcd://127.0.0.1:2379", "--mode", "prefill"])
    >>> args.discovery, args.request_plane, args.mode, args.max_num_seqs
    ('etcd://127.0.0.1:2379', None, 'prefill', 64)
    >>> mocker_worker_parser().parse_args([]).max_num_seqs   # the mocker's own default, as Dynamo's
    256
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
from collections.abc import Callable
from typing import Any, NoReturn

from .disagg.modes import DEFAULT_PREFILL_ENDPOINT, WorkerRole
from .engines.base import EngineLimits
from .extras import broken_extra_error, extra_installed
from .frontend.config import FrontendConfig
from .models.folders import ModelChoice
from .runtime.names import DEFAULT_WORKER_ENDPOINT
from .runtime.program import RuntimeConfig
from .settings import add_settings, env_default

__all__ = [
    "DEFAULT_PREFILL_ENDPOINT",
    "DEFAULT_WORKER_ENDPOINT",
    "add_disagg_args",
    "add_endpoint_arg",
    "add_engine_args",
    "add_event_loop_arg",
    "add_frontend_args",
    "add_hf_args",
    "add_logging_args",
    "add_mocker_args",
    "add_model_args",
    "add_runtime_args",
    "add_sglang_args",
    "add_upstream_args",
    "component_parser",
    "echo_worker_parser",
    "frontend_parser",
    "hf_worker_parser",
    "mocker_worker_parser",
    "sglang_worker_parser",
    "upstream_worker_parser",
    "vllm_worker_parser",
]

DEFAULT_ECHO_ENDPOINT = "dynamo.echo.generate"

AddFlags = Callable[[argparse.ArgumentParser], None]


def add_runtime_args(parser: argparse.ArgumentParser) -> None:
    """Add the runtime's flags: every field of `dynamo_nb.runtime.program.RuntimeConfig`
    (``--runtime``, ``--discovery``, ``--request-plane``, ``--nats-url``, ``--connect-timeout``,
    ``--lease-ttl``, ``--static``, the TCP plane's host and port, what peers must present: the
    cluster secret and TLS, and the system status server's host and port), declared there."""
    add_settings(parser, RuntimeConfig, group="runtime")


def add_endpoint_arg(parser: argparse._ActionsContainer, default: str) -> None:
    """Add ``--endpoint ns.comp.ep`` with ``default``."""
    parser.add_argument(
        "--endpoint",
        default=env_default("ENDPOINT", default),
        help="endpoint to serve, ns.comp.ep (default: %(default)s)",
    )


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--log-level`` and ``--no-uvloop`` (read before the parser runs, by `run_program`)."""
    parser.add_argument(
        "--log-level",
        default=env_default("LOG_LEVEL", "INFO"),
        help="logging level: DEBUG | INFO | WARNING | ERROR (env DYN_NB_LOG_LEVEL; default: %(default)s)",
    )
    add_event_loop_arg(parser)


def add_event_loop_arg(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-uvloop`` (`dynamo_nb.runtime.program.run_program` reads it before parsing)."""
    parser.add_argument(
        "--no-uvloop",
        action="store_true",
        help="run on asyncio's own event loop even when uvloop is installed (env DYN_NB_UVLOOP=0)",
    )


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--model-path`` (default: the built-in tiny model) and ``--model-name``: the fields of
    `dynamo_nb.models.folders.ModelChoice`, declared there."""
    add_settings(parser, ModelChoice, group="model")


def add_frontend_args(parser: argparse.ArgumentParser) -> None:
    """Add the frontend's flags: every field of `dynamo_nb.frontend.config.FrontendConfig`
    (HTTP address and limits, router, admission, migration, static mode), declared there."""
    add_settings(parser, FrontendConfig, group="frontend")


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add what every engine worker takes: ``--endpoint``, the KV block size, the running-request
    limit, and its ``--mode`` (disaggregated serving)."""
    add_endpoint_arg(parser, DEFAULT_WORKER_ENDPOINT)
    add_settings(parser, EngineLimits, "engine")
    add_disagg_args(parser)


def _set_unused_bootstrap_defaults(parser: argparse.ArgumentParser) -> None:
    """An engine whose KV moves by its own means (vLLM's connector, SGLang's bootstrap server)
    has no flags for our bootstrap server: its `WorkerRole` gets the role's defaults (unused)."""
    parser.set_defaults(
        bootstrap_host=WorkerRole.bootstrap_host,
        bootstrap_port=WorkerRole.bootstrap_port,
        bootstrap_advertise_host=WorkerRole.bootstrap_advertise_host,
        kv_ttl=WorkerRole.kv_ttl,
        kv_timeout=WorkerRole.kv_timeout,
        no_bootstrap_endpoint=False,
    )


def add_disagg_args(parser: argparse.ArgumentParser, *, bootstrap: bool = True) -> None:
    """Add ``--mode`` and the disaggregated-serving flags (an engine worker's role: the fields of
    `dynamo_nb.disagg.modes.WorkerRole`, declared there); with ``bootstrap`` False only ``--mode``
    and ``--prefill-endpoint`` (an engine whose own KV connector moves the KV, such as vLLM)."""
    if not bootstrap:
        add_settings(parser, WorkerRole, only=("mode", "prefill_endpoint"))
        _set_unused_bootstrap_defaults(parser)
        return
    add_settings(parser, WorkerRole)


def add_hf_args(parser: argparse.ArgumentParser) -> None:
    """Add the ``hf`` engine's flags: device, dtype, its prefix cache and its step's token
    budget (declared beside the engine: `dynamo_nb.engines.hf.HFEngine.add_args`)."""
    from .engines.hf import HFEngine

    HFEngine.add_args(parser)


def add_mocker_args(parser: argparse.ArgumentParser) -> None:
    """Add the mocker engine's own flags (its simulated KV pool, scheduler and timing; declared
    beside the engine: `dynamo_nb.engines.mocker.MockerEngine.add_args`); its ``--max-num-seqs``
    defaults to 256, as Dynamo's mocker."""
    from .engines.mocker import MockerEngine

    MockerEngine.add_args(parser)


class SuggestFlags:
    """An `argparse.ArgumentParser` mix-in: a flag it does not know gets the known flags close to
    it, as the graph checker suggests them (``--max-num-seq: did you mean --max-num-seqs?``)."""

    def error(self, message: str) -> NoReturn:
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            known = [option for action in self._actions for option in action.option_strings]  # type: ignore[attr-defined]  # the ArgumentParser this mix-in is part of has _actions
            hints = []
            for word in message[len(prefix) :].split():
                flag = word.split("=", 1)[0]
                close = difflib.get_close_matches(flag, known, n=2) if flag.startswith("--") else []
                if close:
                    hints.append(f"{flag}: did you mean {' or '.join(close)}?")
            if hints:
                message += " (" + "; ".join(hints) + ")"
        super().error(message)  # type: ignore[misc]  # argparse's error; this is a mix-in of its parser
        raise AssertionError("unreachable: ArgumentParser.error exits")


class FlagParser(SuggestFlags, argparse.ArgumentParser):
    """The parser of every component: `argparse.ArgumentParser` that suggests close flags.

    Example:
        >>> import contextlib, io
        >>> parser = FlagParser(prog="demo")
        >>> _ = parser.add_argument("--max-num-seqs", type=int)
        >>> err = io.StringIO()
        >>> with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
        ...     parser.parse_args(["--max-num-sequences", "4"])
        >>> err.getvalue().splitlines()[-1]
        'demo: error: unrecognized arguments: --max-num-sequences 4 (--max-num-sequences: did you mean --max-num-seqs?)'
    """


def component_parser(prog: str, description: str | None, *groups: AddFlags) -> argparse.ArgumentParser:
    """A component's parser: the runtime flags, then ``groups``, then ``--log-level``."""
    parser = FlagParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_runtime_args(parser)
    for add in groups:
        add(parser)
    add_logging_args(parser)
    return parser


def echo_worker_parser(prog: str = "echo_worker", description: str | None = None) -> argparse.ArgumentParser:
    """Every flag of the echo worker (components/echo_worker.py)."""
    return component_parser(prog, description, lambda parser: add_endpoint_arg(parser, DEFAULT_ECHO_ENDPOINT))


def hf_worker_parser(prog: str = "hf_worker", description: str | None = None) -> argparse.ArgumentParser:
    """Every flag of the ``hf`` engine worker (components/hf_worker.py)."""
    return component_parser(prog, description, add_model_args, add_engine_args, add_hf_args)


def add_upstream_args(parser: argparse.ArgumentParser) -> None:
    """Add the upstream worker's own flags (the server to serve: declared beside the engine,
    `dynamo_nb.engines.upstream.UpstreamSettings`)."""
    from .engines.upstream import UpstreamEngine

    UpstreamEngine.add_args(parser)


def upstream_worker_parser(
    prog: str = "upstream_worker", description: str | None = None
) -> argparse.ArgumentParser:
    """Every flag of the upstream worker (components/upstream_worker.py): a running
    OpenAI-compatible server served as an engine."""
    return component_parser(prog, description, add_model_args, add_engine_args, add_upstream_args)


def mocker_worker_parser(
    prog: str = "mocker_worker", description: str | None = None
) -> argparse.ArgumentParser:
    """Every flag of the mocker engine worker (components/mocker_worker.py)."""
    return component_parser(prog, description, add_model_args, add_engine_args, add_mocker_args)


VLLM_FLAGS: list[tuple[str, dict[str, object]]] = [
    ("--model", {"default": None, "help": "model folder (as --model-path)"}),
    ("--served-model-name", {"nargs": "+", "default": None, "help": "name the model is served as"}),
    ("--max-model-len", {"type": int, "default": None, "help": "longest prompt + output"}),
    ("--block-size", {"type": int, "default": None, "help": "tokens per KV block"}),
    ("--max-num-seqs", {"type": int, "default": None, "help": "requests in a batch"}),
    ("--max-num-batched-tokens", {"type": int, "default": None, "help": "tokens in a step"}),
    ("--dtype", {"default": "auto", "help": "weights' data type"}),
    ("--enforce-eager", {"action": "store_true", "help": "no CUDA graphs"}),
    ("--kv-cache-memory-bytes", {"type": int, "default": None, "help": "KV cache size in bytes"}),
    ("--gpu-memory-utilization", {"type": float, "default": 0.9, "help": "share of GPU memory used"}),
    ("--tensor-parallel-size", {"type": int, "default": 1, "help": "tensor parallel size"}),
    ("--kv-transfer-config", {"default": None, "help": "KV connector for disaggregated serving, as JSON"}),
    ("--kv-events-config", {"default": None, "help": "KV event publisher, as JSON"}),
    ("--seed", {"type": int, "default": None, "help": "random seed"}),
    ("--log-level", {"default": "info", "help": "logging level"}),
]
"""The vLLM engine flags the vLLM worker and its graphs use, as vLLM 0.32 defines them: the worker's
parser falls back to these where vLLM is not installed, so a graph is checked and its manifests
written without vLLM (the contract test checks them against vLLM's own parser)."""


def _add_declared_flags(
    parser: argparse.ArgumentParser, engine: str, declared: list[tuple[str, dict[str, object]]]
) -> None:
    """Where ``engine`` is not installed: the flags of it that its worker reads (``declared``)."""
    group = parser.add_argument_group(f"{engine} (not installed here: only the flags its worker reads)")
    for flag, options in declared:
        group.add_argument(flag, **options)  # type: ignore[arg-type]  # options are add_argument's keywords, written out in the declarations


def _from_vllm(module: str, name: str) -> Any:
    """``name`` from vLLM's ``module``; None where vLLM is not installed. Where it is installed
    but does not import (a package it imports does not load), the one-line error that says which.

    Reading vLLM's flags imports vLLM's kernel helpers, whose note on a CPU host ("Triton is
    installed, but doesn't include CPU backend") is about running vLLM, not its flags: it is left
    out here (a vLLM worker still logs it)."""
    triton_note = logging.getLogger("vllm.triton_utils.importing")
    level = triton_note.level
    triton_note.setLevel(logging.ERROR)
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as exc:
        if isinstance(exc, ImportError) and not extra_installed("vllm"):
            return None
        raise broken_extra_error("vllm", "the vLLM worker", exc) from exc
    finally:
        triton_note.setLevel(level)


def add_vllm_args(parser: argparse.ArgumentParser) -> None:
    """Add **vLLM's own** engine arguments (``AsyncEngineArgs.add_cli_args``: ``--max-model-len``,
    ``--block-size``, ``--dtype``, ``--kv-transfer-config``, … with vLLM's help; on a host without
    CUDA the defaults its CPU backend needs, `dynamo_nb.engines.vllm.cpu_engine_defaults`), or, where
    vLLM is not installed, the ones its worker and graphs use (`VLLM_FLAGS`)."""
    engine_args = _from_vllm("vllm.engine.arg_utils", "AsyncEngineArgs")
    if engine_args is None:  # not installed: the flags the worker reads, enough to check a graph
        _add_declared_flags(parser, "vLLM", VLLM_FLAGS)
        return
    from vllm.platforms import current_platform

    from .engines.vllm import cpu_engine_defaults

    engine_args.add_cli_args(parser)  # its --log-level is ours too: one level for both
    if current_platform.is_cpu():
        parser.set_defaults(**cpu_engine_defaults())


def vllm_worker_parser(prog: str = "vllm_worker", description: str | None = None) -> argparse.ArgumentParser:
    """Every flag of the vLLM worker (components/vllm_worker.py): ours (runtime, ``--model-path``,
    ``--model-name``, ``--endpoint``, ``--mode``) and **vLLM's own engine arguments**
    (`add_vllm_args`). Without vLLM it parses the flags its worker and graphs use (`VLLM_FLAGS`),
    so graphs are checked and manifests written; running the worker needs ``python3 -m dynamo_nb install vllm``.

    Example:
        >>> args = vllm_worker_parser().parse_args(["--mode", "prefill", "--max-model-len", "1024"])
        >>> args.mode, args.max_model_len
        ('prefill', 1024)
    """
    flexible = _from_vllm("vllm.utils.argparse_utils", "FlexibleArgumentParser")
    parser_class = FlagParser if flexible is None else type("VllmFlagParser", (SuggestFlags, flexible), {})
    parser = parser_class(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_runtime_args(parser)
    add_model_args(parser)
    add_endpoint_arg(parser, DEFAULT_WORKER_ENDPOINT)
    add_disagg_args(parser, bootstrap=False)
    add_vllm_args(parser)
    add_event_loop_arg(parser)
    parser.set_defaults(log_level=env_default("LOG_LEVEL", "INFO"), model=None)  # --model: as --model-path
    return parser


SGLANG_FLAGS: list[tuple[str, dict[str, object]]] = [
    ("--model-path", {"default": None, "help": "model folder"}),
    ("--served-model-name", {"default": None, "help": "name the model is served as"}),
    ("--host", {"default": "127.0.0.1", "help": "host of SGLang's servers (its bootstrap server too)"}),
    ("--context-length", {"type": int, "default": None, "help": "the model's context length"}),
    ("--page-size", {"type": int, "default": None, "help": "tokens per KV page (default: 1)"}),
    ("--tp-size", {"type": int, "default": 1, "help": "tensor parallel size"}),
    ("--kv-events-config", {"default": None, "help": "KV event publisher, as JSON"}),
    ("--dist-init-addr", {"default": None, "help": "HOST:PORT for multi-node setups"}),
    (
        "--disaggregation-mode",
        {"choices": ["null", "prefill", "decode"], "default": "null", "help": "null, prefill or decode"},
    ),
    (
        "--disaggregation-bootstrap-port",
        {"type": int, "default": 8998, "help": "prefill: bootstrap server port"},
    ),
    (
        "--disaggregation-transfer-backend",
        {
            "choices": ["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"],
            "default": "mooncake",
            "help": "how the KV moves between engines",
        },
    ),
    ("--log-level", {"default": "info", "help": "logging level"}),
]
"""The SGLang flags the SGLang worker reads, as SGLang 0.5.23 defines them: its parser falls back
to these where SGLang is not installed (the contract test checks them against SGLang's own)."""


def add_sglang_args(parser: argparse.ArgumentParser) -> None:
    """Add **SGLang's own** ``ServerArgs`` flags (``ServerArgs.add_cli_args``: ``--disaggregation-mode``,
    ``--disaggregation-bootstrap-port``, ``--tp-size``, ``--page-size``, ``--kv-events-config``, …
    with SGLang's help), or, where SGLang is not installed, the ones the worker reads
    (`SGLANG_FLAGS`); then the recording stand-in's flags (``--fake-engine``, for hosts without a GPU)."""
    try:
        from sglang.srt.server_args import ServerArgs
    except Exception:  # not installed (or not importable here): the flags the worker reads
        _add_declared_flags(parser, "SGLang", SGLANG_FLAGS)
    else:
        ServerArgs.add_cli_args(parser)
        for action in parser._actions:  # SGLang requires it; the worker defaults to the tiny model
            if action.dest == "model_path":
                action.required = False
    from .engines.sglang_fake import StandInSettings  # only the SGLang worker needs it

    add_settings(parser, StandInSettings)


def sglang_worker_parser(
    prog: str = "sglang_worker", description: str | None = None
) -> argparse.ArgumentParser:
    """Every flag of the SGLang worker (components/sglang_worker.py): ours (runtime, ``--model-name``,
    ``--endpoint``, ``--prefill-endpoint``, ``--no-bootstrap-endpoint``) and **SGLang's own server
    arguments** (`add_sglang_args`). Its role is SGLang's ``--disaggregation-mode`` (``null`` is
    aggregated); ``--model-path`` defaults to the built-in tiny model.

    Example:
        >>> args = sglang_worker_parser().parse_args(["--disaggregation-mode", "prefill"])
        >>> args.disaggregation_mode, args.disaggregation_bootstrap_port, args.model_path
        ('prefill', 8998, None)
    """
    parser = FlagParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_runtime_args(parser)
    ours = parser.add_argument_group("model and endpoints")
    ours.add_argument(  # not ModelChoice's: SGLang's own --served-model-name comes first
        "--model-name",
        default=env_default("MODEL_NAME", None),
        help="name the model is served as (default: --served-model-name, else the folder's name)",
    )
    add_endpoint_arg(ours, DEFAULT_WORKER_ENDPOINT)
    add_settings(ours, WorkerRole, only=("prefill_endpoint", "publish_handoff"))
    _set_unused_bootstrap_defaults(parser)
    add_sglang_args(parser)
    add_event_loop_arg(parser)
    parser.set_defaults(
        log_level=env_default("LOG_LEVEL", "INFO"), model_path=env_default("MODEL_PATH", None)
    )
    return parser


def frontend_parser(prog: str = "frontend", description: str | None = None) -> argparse.ArgumentParser:
    """Every flag of the OpenAI frontend (components/frontend.py)."""
    # static mode's model flags (FrontendConfig's) never come from the environment: a notebook
    # exports DYN_NB_MODEL_PATH for its workers, and a frontend with discovery must not take it up
    return component_parser(prog, description, add_frontend_args)
