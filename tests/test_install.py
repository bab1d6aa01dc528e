"""``python -m dynamo_nb install vllm``: the torch companions that do not load beside the installed
torch are found by importing each in a fresh interpreter, and the vLLM worker names the one to fix.

The package that fails to load here is our own (written into a folder on PYTHONPATH, with the
metadata pip would leave), so these tests run where torch and vLLM are not installed; the
`vllm` group checks the environment the README's command built, for real.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

from dynamo_nb import install, launch
from dynamo_nb.errors import ConfigError, MissingExtraError
from dynamo_nb.extras import broken_extra_error, extra_installed

pytestmark = pytest.mark.processes  # each import is checked in a fresh interpreter

BROKEN = "fakevision"


@pytest.fixture
def broken_companion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed package (``fakevision`` 9.9.0) whose import fails as torchvision's CUDA build
    does beside a CPU torch; it counts as a torch companion for the test."""
    package = tmp_path / BROKEN
    package.mkdir()
    (package / "__init__.py").write_text('raise RuntimeError("operator fakevision::nms does not exist")\n')
    metadata = tmp_path / f"{BROKEN}-9.9.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {BROKEN}\nVersion: 9.9.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # its metadata, for this process
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the package, for the checking interpreters
    monkeypatch.setattr(install, "TORCH_COMPANIONS", (*install.TORCH_COMPANIONS, BROKEN))
    return tmp_path


def test_import_error_gives_the_last_line_of_a_failed_import(broken_companion: Path) -> None:
    assert install.import_error("json") is None
    assert install.import_error(BROKEN) == "RuntimeError: operator fakevision::nms does not exist"
    assert install.import_error("no_such_module_here") == (
        "ModuleNotFoundError: No module named 'no_such_module_here'"
    )


def test_a_companion_that_does_not_load_is_found_with_its_version_and_error(broken_companion: Path) -> None:
    problems = install.companion_problems()
    assert [(p.package, p.version, p.error) for p in problems if p.package == BROKEN] == [
        (BROKEN, "9.9.0", "RuntimeError: operator fakevision::nms does not exist")
    ]
    assert install.companion_problems(("json_is_no_distribution",)) == []  # not installed: skipped


def test_a_broken_extra_names_the_package_to_fix_and_the_command(broken_companion: Path) -> None:
    error = broken_extra_error(
        "vllm", "the vLLM worker", RuntimeError("operator fakevision::nms does not exist")
    )
    assert isinstance(error, MissingExtraError)
    message = str(error)
    assert "\n" not in message
    assert "fakevision 9.9.0 does not load beside torch" in message
    assert "python3 -m dynamo_nb install vllm removes fakevision" in message


def test_an_extra_that_imports_with_no_broken_companion_gets_the_generic_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(install, "TORCH_COMPANIONS", ())
    message = str(broken_extra_error("vllm", "the vLLM worker", OSError("libfoo.so: cannot open")))
    assert message == (
        "the vLLM worker needs vllm, which is installed but does not import (OSError: libfoo.so: cannot "
        "open): python3 -m dynamo_nb install vllm checks and repairs the environment"
    )


@pytest.mark.skipif(extra_installed("vllm"), reason="vLLM is installed here")
def test_the_check_without_vllm_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install, "TORCH_COMPANIONS", ())
    with pytest.raises(
        ConfigError, match=r"^vllm is not installed: python3 -m dynamo_nb install vllm installs it$"
    ):
        install.install_extra("vllm", skip_pip=True)


@pytest.mark.skipif(extra_installed("dynamo"), reason="Dynamo's packages are installed here")
def test_the_check_without_dynamo_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install, "TORCH_COMPANIONS", ())
    with pytest.raises(
        ConfigError, match=r"^dynamo is not installed: python3 -m dynamo_nb install dynamo installs it$"
    ):
        install.install_extra("dynamo", skip_pip=True)


def test_dynamo_comes_without_its_unbuildable_requirement() -> None:
    """ai-dynamo's packages install with --no-deps after the extra, pinned to the tested release."""
    check = install.EXTRAS["dynamo"]
    assert check.without_deps == ("ai-dynamo==1.6.1", "ai-dynamo-runtime==1.6.1")
    assert check.deep_import == "dynamo.llm"


@pytest.mark.dynamo
def test_the_readme_install_leaves_dynamo_importing() -> None:
    """Where Dynamo's packages are installed (CI installs them with the README's command), its
    bindings and its frontend's module import, at the tested release."""
    assert install.import_error("dynamo.llm") is None
    assert install.import_error("dynamo.frontend") is None
    assert install._installed_version("ai-dynamo-runtime") == install.DYNAMO_VERSION


def test_the_command_refuses_an_extra_it_has_no_step_for() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dynamo_nb", "install", "vlm"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2
    assert "invalid choice: 'vlm'" in done.stderr and "vllm" in done.stderr.splitlines()[-1]


@pytest.mark.vllm
def test_the_readme_install_leaves_vllm_importing_beside_its_torch() -> None:
    """Where vLLM is installed (CI installs it with the README's command), what the worker imports
    loads, and no torch companion that fails to load is left behind."""
    assert install.import_error("vllm.engine.arg_utils") is None
    assert install.companion_problems() == []


@pytest.mark.vllm
def test_the_vllm_worker_names_a_companion_that_does_not_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package vLLM imports that fails to load (here a fake torchvision shadowing the real one,
    or the missing one) makes the worker exit 2 with one line naming it and the fix."""
    shadow = tmp_path / "torchvision"
    shadow.mkdir()
    (shadow / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    info = tmp_path / "torchvision-0.28.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    done = subprocess.run(
        [sys.executable, "components/vllm_worker.py", "--discovery", f"file://{tmp_path / 'discovery'}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(
        "error: the vLLM worker needs vllm, which does not import because torchvision 0.28.0"
    ), line
    assert "python3 -m dynamo_nb install vllm removes" in line


@pytest.mark.vllm
async def test_the_vllm_worker_reaches_ready_over_file_discovery(tmp_path: Path) -> None:
    """The README's sequence: vLLM installed with its command, then the worker over a folder as
    discovery reaches its READY line, and SIGTERM ends it cleanly."""
    worker = await launch(
        "components/vllm_worker.py", "--discovery", f"file://{tmp_path / 'discovery'}",
        cwd=ROOT, log_dir=tmp_path, show_logs=False, timeout=240,
    )  # fmt: skip
    try:
        assert any(line.startswith("READY dynamo.backend.generate") for line in worker.logs()), worker.tail()
    finally:
        assert await worker.stop(timeout=60) == 0, worker.tail()


def test_the_commands_help_names_every_extra_install_takes() -> None:
    import dynamo_nb.__main__ as entry
    from dynamo_nb.install import EXTRAS

    install_line = next(
        line for line in (entry.__doc__ or "").splitlines() if line.strip().startswith("install")
    )
    assert all(extra in install_line for extra in EXTRAS), (install_line, sorted(EXTRAS))
    assert "dynamo-frontend" in (entry.__doc__ or "")
