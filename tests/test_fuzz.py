"""The HTTP API fuzzed with hypothesis (`dynamo_nb.bench.fuzz`): 600 (2,000 in the long run) generated chat and
completion requests — valid ones, valid ones with one field replaced by any JSON value,
arbitrary JSON and raw bytes — against a frontend process serving the echo engine. No answer
is a 5xx, every error is in OpenAI's envelope, every 200 is a completion or an SSE stream that
ends in ``[DONE]``, and the server keeps serving. Repeatable: the examples come from a fixed seed."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import ROOT

from dynamo_nb.bench import fuzz
from dynamo_nb.launch import launch

pytestmark = pytest.mark.timeout(300)


@pytest.mark.processes
@pytest.mark.parametrize("examples", [600, pytest.param(2000, marks=pytest.mark.long)])
async def test_generated_requests_get_no_5xx_and_only_enveloped_errors(tmp_path: Any, examples: int) -> None:
    """Requests hypothesis generates (600 in the default run, 2000 in the long one), valid and
    not, get no 5xx, only OpenAI error envelopes, and the server stays up."""
    server = await launch(
        "-m", "dynamo_nb", "run", "--in", "http", "--out", "echo", "--http-port", 0,
        ready="^READY frontend", cwd=ROOT, log_dir=tmp_path, show_logs=False, timeout=60,
    )  # fmt: skip
    try:
        report = fuzz.fuzz(server.url, "tiny-llama", examples=examples, seed=0)
    finally:
        await server.stop()
    assert report["examples"] == examples
    assert report["problems"] == [], report["problems"]
    assert report["alive"]
    statuses = report["statuses"]
    # the examples reach both sides of validation: answers, and rejections naming a field
    assert statuses.get("200", 0) > examples // 7 and statuses.get("400", 0) > examples // 7, statuses
