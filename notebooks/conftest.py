"""nbval runs every notebook here as a test. The vLLM notebook skips, with the reason, without vLLM
and unless ``DYN_NB_VLLM_LONG=1`` (why: ``tests/helpers.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import NEEDS_VLLM, vllm_notebook_skip_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = vllm_notebook_skip_reason()
    if reason is None:
        return
    for item in items:
        if item.path.stem in NEEDS_VLLM:
            item.add_marker(pytest.mark.skip(reason=reason))
