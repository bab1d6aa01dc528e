"""The HTTP API fuzzed with hypothesis (`dynamo_nb.bench.fuzz`): 2,000 generated chat and
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
async def test_two_thousand_generated_requests_get_no_5xx_and_only_enveloped_errors(tmp_path: Any) -> None:
    server = await launch(
        "-m", "dynamo_nb", "run", "--in", "http", "--out", "echo", "--http-port", 0,
        ready="^READY frontend", cwd=ROOT, log_dir=tmp_path, show_logs=False, timeout=60,
    )  # fmt: skip
    try:
        report = fuzz.fuzz(server.url, "tiny-llama", examples=2000, seed=0)
    finally:
        await server.stop()
    assert report["examples"] == 2000
    assert report["problems"] == [], report["problems"]
    assert report["alive"]
    statuses = report["statuses"]
    # the examples reach both sides of validation: answers, and rejections naming a field
    assert statuses.get("200", 0) > 300 and statuses.get("400", 0) > 300, statuses
