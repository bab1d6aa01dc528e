"""The test groups, by pytest marker, for the whole suite (``tests/`` and ``notebooks/``).

- ``processes``: starts etcd, nats-server or a child process (a notebook kernel, a worker).
  Tests that use a fixture which starts one are marked here; any other test that starts a
  process fails and says to mark it. ``pytest -m "not processes"`` is the fast run.
- ``vllm``, ``sglang``, ``dynamo``, ``gpu``: needs that extra (or a CUDA device). Skipped with the reason
  where it is missing; asked for by name (``-m vllm``, or ``DYN_NB_REQUIRE=vllm,gpu``) a missing
  one fails the test instead, so a run that asks for them cannot pass without them.
- ``long``, ``exports``, ``browser``, ``netns``: opt-in groups, run only when asked for by marker
  (``-m long``) or by their environment variable (``DYN_NB_VLLM_LONG=1``, ``DYN_NB_EXPORT_ALL=1``,
  ``DYN_NB_BROWSER=1``, ``DYN_NB_NETNS=1``); ``.ci/run``'s second step asks for them.
  ``netns`` (hosts in network namespaces) also needs root, ``ip`` and ``/dev/net/tun``: asked
  for where they are missing, its tests fail.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dynamo_nb.extras import extra_installed
from dynamo_nb.testing.hosts import netns_unavailable

PROCESS_FIXTURES = {"services", "start_worker", "private_services", "lab"}
"""Fixtures that start etcd, nats-server or child processes: a test using one is a process test."""

PLATFORM_PROBES = {"file", "uname"}
"""Programs the standard library's ``platform`` module runs to describe the host (vLLM's import
asks ``file -b python``): short probes, not services, so any test may run them."""

SERVICE_MODES = ("etcd", "nats")
"""Parts of a ``mode`` parameter (``"etcd-tcp"``, ``"file-nats"``) that need the local services."""


def _cuda() -> bool:
    if not extra_installed("torch"):
        return False
    import torch

    return bool(torch.cuda.is_available())


NEEDS: dict[str, tuple[Callable[[], bool], str | Callable[[], str]]] = {
    "vllm": (lambda: extra_installed("vllm"), "vLLM is not installed (python3 -m dynamo_nb install vllm)"),
    "sglang": (
        lambda: extra_installed("sglang"),
        "SGLang is not installed (pip install --no-deps sglang==0.5.23 reads its API; "
        "pip install -e '.[sglang]' on a GPU host)",
    ),
    "dynamo": (
        lambda: extra_installed("dynamo"),
        "NVIDIA Dynamo's Python packages are not installed (python3 -m dynamo_nb install dynamo)",
    ),
    "gpu": (_cuda, "needs a CUDA device (and torch built for it)"),
    "netns": (
        lambda: netns_unavailable() is None,
        lambda: f"hosts in network namespaces: {netns_unavailable()}",
    ),
}
"""Marker → (whether it is there, why the test is skipped when not: a text, or a function giving it)."""

OPT_IN: dict[str, tuple[str, str]] = {
    "long": (
        "DYN_NB_VLLM_LONG",
        "the long runs (vLLM's engine starts, ~5 min on 2 cores; an LLM notebook re-run at another model; "
        "migration over NATS; notebook 09's rate sweeps; the slowest process tests, so that the default run keeps "
        "under 12 min)",
    ),
    "exports": ("DYN_NB_EXPORT_ALL", "every notebook's exported program (the quick ones run by default)"),
    "browser": ("DYN_NB_BROWSER", "the notebooks in JupyterLab with Playwright and Chromium"),
    "netns": ("DYN_NB_NETNS", "the tests across hosts (network namespaces, as root)"),
}
"""Opt-in marker → (the environment variable that also turns it on, what the group is)."""


def asked_for(config: pytest.Config, marker: str) -> bool:
    """Whether this run asks for ``marker``'s tests by name: ``-m`` names it, not after ``not``
    (``-m vllm``, ``-m "vllm or long"`` and ``-m "long and exports"`` do; ``-m "not vllm"`` does
    not), or ``DYN_NB_REQUIRE`` lists it.

    Example:
        >>> class Run:
        ...     def getoption(self, name, default=None):
        ...         return "not processes and (vllm or long)"
        >>> [asked_for(Run(), name) for name in ("processes", "vllm", "long", "browser")]
        [False, True, True, False]
    """
    if marker in os.environ.get("DYN_NB_REQUIRE", "").replace(" ", "").split(","):
        return True
    words = re.findall(r"[\w-]+", config.getoption("markexpr", default="") or "")
    return any(word == marker and (i == 0 or words[i - 1] != "not") for i, word in enumerate(words))


def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "processes: starts etcd, nats-server or a child process (-m 'not processes' is the fast run)",
        "vllm: needs vLLM (skipped without it; fails without it when asked for with -m vllm)",
        "sglang: needs SGLang's package (its API; skipped without it)",
        "dynamo: needs NVIDIA Dynamo's packages (skipped without them; fails without them when asked for "
        "with -m dynamo)",
        "gpu: needs a CUDA device (skipped without one; fails without one when asked for with -m gpu)",
        "long: opt-in, the long runs: vLLM's, and slow cases kept out of the default run's 12 minutes "
        "(-m long or DYN_NB_VLLM_LONG=1)",
        "exports: opt-in, every notebook's exported program (-m exports or DYN_NB_EXPORT_ALL=1)",
        "browser: opt-in, the notebooks in JupyterLab (-m browser or DYN_NB_BROWSER=1)",
        "netns: opt-in, hosts in network namespaces; needs root (-m netns or DYN_NB_NETNS=1)",
    ):
        config.addinivalue_line("markers", line)


def _needs_services(item: pytest.Item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    mode = params.get("mode")
    return isinstance(mode, str) and any(part in mode.split("-") for part in SERVICE_MODES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", [])
        if "make_runtime" in fixtures and _needs_services(item) and "services" not in fixtures:
            # started before the test, so make_runtime finds it ready (a list of this item's own:
            # the parametrized items of one function share theirs)
            item.fixturenames = fixtures = [*fixtures, "services"]  # type: ignore[attr-defined]
        if set(fixtures) & PROCESS_FIXTURES:
            item.add_marker(pytest.mark.processes)


def pytest_runtest_setup(item: pytest.Item) -> None:
    markers = {mark.name for mark in item.iter_markers()}
    asked = {name for name in markers & (set(OPT_IN) | set(NEEDS)) if asked_for(item.config, name)}
    for name in sorted(markers & set(OPT_IN)):  # each opt-in group of the test asked for itself
        variable, what = OPT_IN[name]
        if name not in asked and os.environ.get(variable) != "1":
            pytest.skip(f"{what}: opt-in, run with -m {name} (or {variable}=1)")
    for name in sorted(markers & set(NEEDS)):
        available, why = NEEDS[name]
        if available():
            continue
        reason = why() if callable(why) else why
        if name in asked:
            pytest.fail(f"asked for the {name} tests (-m {name} or DYN_NB_REQUIRE), but {reason}")
        pytest.skip(reason)


@pytest.fixture(autouse=True)
def _processes_only_where_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test not marked ``processes`` that starts a process fails, saying so (the fast run
    stays fast and needs no service)."""
    if request.node.get_closest_marker("processes") is not None:
        yield
        return
    original = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    nodeid = request.node.nodeid

    def refuse(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        program = os.path.basename(str(args[0] if isinstance(args, (list, tuple)) else args).split()[0])
        if program in PLATFORM_PROBES:
            return original(self, args, *rest, **kwargs)
        raise AssertionError(f"{nodeid} starts a process ({args!r}): mark it @pytest.mark.processes")

    subprocess.Popen._execute_child = refuse  # type: ignore[attr-defined]
    try:
        yield
    finally:
        subprocess.Popen._execute_child = original  # type: ignore[attr-defined]
