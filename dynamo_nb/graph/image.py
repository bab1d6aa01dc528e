"""Your own image for a graph: the build context of an image that holds the graph's own files
(your notebooks, programs and routing policies) on top of the kit's image, so that the manifests
of ``--emit k8s --image NAME`` run them in a cluster.

`own_files` lists what a graph names that the kit's image does not hold: each service's program
(``component: FILE`` or ``FILE:NAME``) and each ``router-policy`` file, unless it is one of the
kit's components or notebooks. `write_build_context` copies them into a folder at the paths the
graph uses (relative to the folder ``serve`` runs from, which becomes the image's ``/app``) and
writes a ``Dockerfile`` ``FROM`` the kit's image.

Example::

    python -m dynamo_nb serve short.yaml --emit k8s --image registry.example/short:1 --build-context image > k8s.yaml
    docker build -t registry.example/short:1 image && docker push registry.example/short:1
    kubectl apply -f k8s.yaml
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ..errors import ConfigError
from ..launch.declarations import split_reference
from ..launch.paths import resolve_program
from .model import Graph, GraphError

__all__ = ["POLICY_FLAGS", "own_files", "write_build_context"]

POLICY_FLAGS = ("router-policy", "router_policy")
"""The flags whose value names a file (``FILE`` or ``FILE:NAME``) a component loads."""

_KIT = Path(__file__).resolve().parents[2]
_KIT_FOLDERS = (_KIT / "components", _KIT / "notebooks", Path(sys.prefix) / "share" / "dynamo_nb")
"""Where the kit's own programs live (in its image too): files there are not copied."""


def _is_kit_file(path: Path) -> bool:
    return any(path.is_relative_to(folder) for folder in _KIT_FOLDERS)


def own_files(graph: Graph, cwd: Path) -> list[Path]:
    """The files ``graph`` names that the kit's image does not hold, relative to ``cwd`` (each
    must lie under it: the image keeps them at the same paths under its working folder).

    Example::

        own_files(Graph.from_yaml("short.yaml"), Path.cwd())  # [PosixPath('short.ipynb')]
    """
    cwd = cwd.resolve()
    named: list[tuple[str, str]] = []
    for service in graph.services.values():
        if service.server is not None:  # a server's command: nothing of the graph's own to copy
            continue
        named.append((f"components.{service.name}.component", service.component))
        for flag in POLICY_FLAGS:
            if service.flags.get(flag):
                named.append((f"components.{service.name}.flags.{flag}", str(service.flags[flag])))
    found: list[Path] = []
    for where, reference in named:
        file, _ = split_reference(reference)
        try:
            path = resolve_program(file, cwd).resolve()
        except ConfigError as exc:
            raise GraphError(f"{where}: {exc}") from None
        if _is_kit_file(path):
            continue
        if not path.is_relative_to(cwd):
            raise GraphError(
                f"{where}: {file} is outside {cwd}: keep the graph's own files under the folder you run "
                "serve from (the image holds them at the same paths), and name them relative to it"
            )
        relative = path.relative_to(cwd)
        if relative not in found:
            found.append(relative)
    return found


def write_build_context(
    graph: Graph, directory: Path, *, base_image: str, cwd: Path | None = None, workdir: str = "/app"
) -> Path:
    """Copy the graph's own files (`own_files`) into ``directory`` at their paths and write its
    ``Dockerfile``: ``FROM base_image``, the files under ``workdir``. Returns the Dockerfile.

    Example::

        write_build_context(graph, Path("image"), base_image="dynamo-nb:0.1.0")
        # docker build -t registry.example/short:1 image
    """
    cwd = (cwd or Path.cwd()).resolve()
    files = own_files(graph, cwd)
    directory.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# The graph {graph.name}'s own files on the kit's image (python -m dynamo_nb serve --build-context).",
        f"FROM {base_image}",
        f"WORKDIR {workdir}",
    ]
    for relative in files:
        target = directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cwd / relative, target)
        lines.append(f"COPY {relative.as_posix()} {workdir}/{relative.as_posix()}")
    dockerfile = directory / "Dockerfile"
    dockerfile.write_text("\n".join(lines) + "\n")
    return dockerfile
