"""``python -m dynamo_nb <command>``.

Commands:
    serve         start a serving graph from its YAML file (see serve --help)
    run           serve an LLM: frontend + worker in one process, or either alone (see run --help)
    demo          the runtime demo: serve and call endpoints in one process, then across processes
    demo-worker   the demo's worker (started by ``demo``; runtime flags as every component)
    install       install an extra (vllm or dynamo) and leave an environment where it imports
                  (see install --help)
    profile       measure the engine behind a kit frontend into a timing model (Dynamo's
                  profile-data layout) for the mocker and replay (see profile --help)
    dynamo-frontend
                  NVIDIA Dynamo's frontend for --runtime dynamo workers, its settings matching
                  theirs (see dynamo-frontend --help)
"""

from __future__ import annotations

import argparse
import asyncio
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["run"]:
        from .run import run
        from .runtime.program import run_program

        return run_program(lambda: run(argv[1:]))
    if argv[:1] == ["serve"]:
        from .graph.cli import serve_main

        return serve_main(argv[1:])
    if argv[:1] == ["install"]:
        from .install import main as install_main

        return install_main(argv[1:])
    if argv[:1] == ["dynamo-frontend"]:
        from .on_dynamo.frontend import main as dynamo_frontend_main

        return dynamo_frontend_main(argv[1:])
    if argv[:1] == ["profile"]:
        from .bench.profile import main as profile_main

        return profile_main(argv[1:])
    if argv[:1] == ["demo-worker"]:  # its own flags: the runtime flags every component takes
        from .demo import serve_worker

        return asyncio.run(serve_worker(argv[1:]))
    parser = argparse.ArgumentParser(
        prog="python -m dynamo_nb", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "command", choices=("serve", "run", "demo", "demo-worker", "install", "profile", "dynamo-frontend")
    )
    parser.add_argument(
        "--in-process-only", action="store_true", help="demo: skip the part that starts etcd/NATS"
    )
    args = parser.parse_args(argv)
    from .demo import run_demo

    return asyncio.run(run_demo(args.in_process_only))


if __name__ == "__main__":
    sys.exit(main())
