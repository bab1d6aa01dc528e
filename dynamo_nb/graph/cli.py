"""``python -m dynamo_nb serve graph.yaml``: check a graph, print its command lines, or start it.

Example::

    python -m dynamo_nb serve graphs/disagg_hf.yaml --dry-run
    python -m dynamo_nb serve graphs/disagg_hf.yaml --set frontend.http-port=8001 --set prefill.replicas=1
    python -m dynamo_nb serve graphs/disagg_hf.yaml --emit k8s --image registry.example/dynamo-nb:0.1 > k8s.yaml
    python -m dynamo_nb serve graphs/disagg_hf.yaml --emit dynamo --image registry.example/dynamo-nb:0.1 > dgd.yaml
    python -m dynamo_nb serve short.yaml --emit k8s --image registry.example/short:1 --build-context image > k8s.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from ..errors import ConfigError
from .commands import apply_overrides, dry_run
from .dynamo_deployment import DYNAMO_IMAGE, dynamo_graph_deployment
from .image import write_build_context
from .kubernetes import DEFAULT_IMAGE, kubernetes_manifests, manifests_yaml, secret_command
from .model import Graph
from .serve import serve

__all__ = ["serve_main"]


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_nb serve",
        description="Start every component of a serving graph (a YAML file).",
    )
    parser.add_argument("graph", type=Path, help="the graph's YAML file, e.g. graphs/agg_hf.yaml")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SERVICE.FLAG=VALUE",
        help="override a flag (or replicas) of one service; wins over the file; repeatable",
    )
    parser.add_argument("--dry-run", action="store_true", help="check the graph and print its command lines")
    parser.add_argument("--quiet", action="store_true", help="do not echo the components' logs")
    kubernetes = parser.add_argument_group("kubernetes")
    kubernetes.add_argument(
        "--emit",
        choices=("k8s", "dynamo"),
        help="print the graph instead of starting it: k8s, its Kubernetes manifests (Deployments, Services, "
        "etcd/NATS); dynamo, a DynamoGraphDeployment for NVIDIA Dynamo's operator (Dynamo's frontend, the "
        "workers on Dynamo's runtime)",
    )
    kubernetes.add_argument(
        "--dynamo-image",
        default=DYNAMO_IMAGE,
        help="with --emit dynamo: the image of Dynamo's frontend (default: %(default)s)",
    )
    kubernetes.add_argument(
        "--image",
        default=DEFAULT_IMAGE,
        help="image holding dynamo_nb and the components (default: %(default)s)",
    )
    kubernetes.add_argument(
        "--build-context",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write the build context of your own image (a Dockerfile FROM --base-image with the "
        "graph's notebooks, programs and policy files) into DIR; name that image with --image",
    )
    kubernetes.add_argument(
        "--base-image",
        default=DEFAULT_IMAGE,
        help="the kit's image your own image is built on (default: %(default)s)",
    )
    kubernetes.add_argument("--namespace", default=None, help="Kubernetes namespace of the objects")
    kubernetes.add_argument(
        "--no-cluster-secret",
        action="store_true",
        help="do not require the cluster secret (by default every component reads DYN_NB_CLUSTER_SECRET "
        "from the Secret <graph>-cluster-secret)",
    )
    return parser


async def _serve_until_signal(graph: Graph, quiet: bool) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):  # from the start: a signal while starting stops it too
        loop.add_signal_handler(signum, stop.set)
    starting = loop.create_task(serve(graph, show_logs=not quiet))
    stopping = loop.create_task(stop.wait())
    await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # stopped before it was up: serve() stops what it started
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        return 0
    stopping.cancel()
    running = starting.result()
    try:
        for row in running.status():
            print(f"{row['replica']:<20} pid {row['pid']:<8} {row['state']}", flush=True)
        if running.url:
            print(f"serving at {running.url}", flush=True)
        await stop.wait()
    finally:
        await running.stop()
    return 0


def serve_main(argv: list[str]) -> int:
    args = serve_parser().parse_args(argv)
    try:
        graph = Graph.from_yaml(args.graph)
        apply_overrides(graph, args.overrides)
        if args.build_context is not None and args.emit is None:
            raise ConfigError(
                "--build-context goes with --emit k8s or --emit dynamo (the manifests run the image it builds)"
            )
        if args.emit is not None:
            if args.build_context is not None:
                if args.image == args.base_image:
                    raise ConfigError(
                        "--build-context builds your own image on --base-image: name it with --image "
                        "(e.g. --image registry.example/my-graph:1), which the manifests then run"
                    )
                dockerfile = write_build_context(graph, args.build_context, base_image=args.base_image)
                print(
                    f"wrote {dockerfile.parent}: docker build -t {args.image} {dockerfile.parent}",
                    file=sys.stderr,
                )
            secret = not args.no_cluster_secret
            if args.emit == "dynamo":
                rendered = dynamo_graph_deployment(
                    graph, image=args.image, dynamo_image=args.dynamo_image, namespace=args.namespace,
                    cluster_secret=secret,
                )  # fmt: skip
                manifests, notes = [rendered.manifest], rendered.notes
            else:
                manifests = kubernetes_manifests(
                    graph, image=args.image, namespace=args.namespace, cluster_secret=secret
                )
                notes = []
            if secret:  # a comment at the top of the YAML, and on stderr
                command = secret_command(graph, args.namespace)
                print(f"# first: {command}")
                print(f"the components require a cluster secret; create it once: {command}", file=sys.stderr)
            for note in notes:
                print(f"# note: {note}")
            print(manifests_yaml(manifests), end="")
            return 0
        if args.dry_run:
            print(dry_run(graph))
            return 0
        return asyncio.run(_serve_until_signal(graph, args.quiet))
    except ConfigError as exc:  # a GraphError, or a graph file that is not there
        print(f"{args.graph}: {exc}", file=sys.stderr)
        return 2
