"""nbval runs every notebook here as a test; a notebook that needs vLLM skips (with the reason) without it."""

from __future__ import annotations

import importlib.util

import pytest

NEEDS_VLLM = ("06_serving_with_vllm",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vLLM is not installed (pip install -e '.[vllm]')")
    for item in items:
        if item.path.stem in NEEDS_VLLM:
            item.add_marker(skip)
