"""A machine without an optional extra: graphs that use it are still checked and written as
manifests (the component's declared flags stand in for the engine's), and running the part
that needs it prints one line naming the extra. vLLM is hidden from each program
(``sys.modules["vllm"] = None``), so these run whether it is installed or not."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from helpers import ROOT

from dynamo_nb.errors import ConfigError, MissingExtraError
from dynamo_nb.extras import extra_installed, require_extra

pytestmark = pytest.mark.timeout(120)

HIDE_VLLM = "import sys, runpy; sys.modules['vllm'] = None; "


def without_vllm(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a Python where vLLM cannot be imported, with ``args`` as its argv."""
    command = [sys.executable, "-c", HIDE_VLLM + code, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=90, cwd=ROOT)


def test_require_extra_names_the_pip_install() -> None:
    require_extra("json", "the demo")  # importable: nothing happens
    with pytest.raises(MissingExtraError, match=r'pip install -e "\.\[browser\]"') as caught:
        require_extra("no_such_module_here", "the browser test", extra="browser")
    assert isinstance(caught.value, ConfigError) and "\n" not in str(caught.value)
    with pytest.raises(
        MissingExtraError, match=r"needs no_such_module_here, .*: python3 -m dynamo_nb install vllm$"
    ):
        require_extra("no_such_module_here", "the vLLM worker", extra="vllm")  # pip alone is not enough
    assert extra_installed("json") and not extra_installed("no_such_module_here")


@pytest.mark.processes
def test_the_vllm_worker_without_vllm_says_which_extra_in_one_line() -> None:
    done = without_vllm(
        "sys.argv = ['vllm_worker.py', '--mode', 'decode']; "
        "runpy.run_path('components/vllm_worker.py', run_name='__main__')"
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: the vLLM worker needs vllm, which is not installed here: python3 -m dynamo_nb install vllm"
    ]


@pytest.mark.processes
def test_vllm_graphs_check_and_emit_manifests_without_vllm() -> None:
    serve = "sys.argv = ['dynamo_nb', *sys.argv[1:]]; runpy.run_module('dynamo_nb', run_name='__main__')"
    dry = without_vllm(serve, "serve", "graphs/disagg_vllm.yaml", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "components/vllm_worker.py --mode prefill --max-model-len 1024" in dry.stdout
    emitted = without_vllm(serve, "serve", "graphs/agg_vllm.yaml", "--emit", "k8s")
    assert emitted.returncode == 0, emitted.stderr
    manifests = list(yaml.safe_load_all(emitted.stdout))
    deployments = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Deployment"}
    container = deployments["agg-vllm-vllm"]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python3", "components/vllm_worker.py"]
    assert container["args"][:2] == ["--max-model-len", "1024"]
    bad = without_vllm(serve, "serve", "graphs/agg_vllm.yaml", "--dry-run", "--set", "vllm.max-model-len=x")
    assert bad.returncode == 2 and "--max-model-len: invalid int value" in bad.stderr


@pytest.mark.processes
def test_the_vllm_workers_flags_without_vllm_are_the_declared_ones() -> None:
    done = without_vllm(
        "from dynamo_nb.flags import vllm_worker_parser; "
        "a = vllm_worker_parser().parse_args(['--mode', 'prefill', '--max-model-len', '1024', '--enforce-eager']); "
        "print(a.mode, a.max_model_len, a.enforce_eager, a.block_size)"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["prefill", "1024", "True", "None"]
