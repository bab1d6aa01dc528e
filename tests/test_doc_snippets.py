"""The Python a reader copies from the docs runs as written: every snippet of the pages below, in
order, each with its own imports (`doc_snippets.run_snippets`). The Dynamo page's are in the
``dynamo`` group (tests/test_on_dynamo.py); the planning page's live ones are ``long``."""

from __future__ import annotations

from pathlib import Path

import pytest
from doc_snippets import python_snippets, run_snippets
from helpers import ROOT

from dynamo_nb.errors import InvalidRequestError
from dynamo_nb.llm import PreprocessedRequest, StopConditions
from dynamo_nb.models import tiny_model_path

DOCS = ROOT / "docs"


async def test_your_own_component_page_runs_as_written() -> None:
    """Each snippet of docs/your-own-component.md with its own imports; the signing wrapper
    (the page's own words: its tokens first, a refusal before any output) on the tiny model."""
    page = DOCS / "your-own-component.md"
    assert len(python_snippets(page)) == 5
    names = await run_snippets(page)
    assert {"Reverse", "ShortAnswers", "Signed", "long_prompts_apart", "policy", "worker"} <= set(names)
    assert names["worker"].name == "short-worker"
    engine = await names["Signed"].load(tiny_model_path())
    try:
        request = PreprocessedRequest(token_ids=[1, 450, 318], stop_conditions=StopConditions(max_tokens=3))
        items = [item async for item in engine.generate(request)]
        assert items[0].token_ids == list(names["PREFIX"]) and len(items) > 1
        too_long = PreprocessedRequest(
            token_ids=[450] * engine.context_length, stop_conditions=StopConditions(max_tokens=3)
        )
        seen = []
        with pytest.raises(InvalidRequestError):
            async for item in engine.generate(too_long):
                seen.append(item)
        assert seen == []  # refused before any output
    finally:
        await engine.close()


@pytest.mark.long
@pytest.mark.processes
async def test_the_planning_page_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each snippet of docs/planning.md with its own imports, given what its prose says the reader
    has: a recorded trace (``path``), a running graph of mocker workers (``running``) behind a
    KV-routing frontend (``url``) that writes ``trace.jsonl`` and takes an admin token."""
    from dynamo_nb import DistributedRuntime, bench
    from dynamo_nb.frontend import Frontend
    from dynamo_nb.frontend.admin import AdminAuth
    from dynamo_nb.graph import Graph, serve

    monkeypatch.chdir(tmp_path)
    path = bench.save_trace(bench.synthetic_trace(30, rate=5.0, seed=3), tmp_path / "recorded.jsonl")
    graph = Graph.from_dict({"name": "docs", "services": {"etcd": "local", "nats": "local"}, "components": {
        "mocker": {"component": str(ROOT / "components" / "mocker_worker.py"), "replicas": 1,
                   "flags": {"speedup-ratio": 10, "context-length": 8192, "log-level": "WARNING"}}}})  # fmt: skip
    running = await serve(graph, show_logs=False)
    runtime = await DistributedRuntime.create(running.services.etcd_url, "tcp", running.services.nats_url)
    token = "a-token-for-the-docs-test"
    frontend = await Frontend.start(
        runtime, port=0, router_mode="kv", request_trace="trace.jsonl", admin=AdminAuth(token)
    )
    try:
        await bench.wait_for_model(frontend.url, "tiny-llama", instances=1, timeout=60)
        given = {"path": path, "url": frontend.url, "admin_token": token, "running": running}
        names = await run_snippets(DOCS / "planning.md", given)
        assert names["df"]["error"].isna().all() and len(names["df"]) == 20
        assert names["answer"].incumbent == names["running_policy"]  # retuned against what runs
        decided = await names["retuner"].step()  # one window of what the frontend recorded
        recorded = len((tmp_path / "trace.jsonl").read_text().splitlines())  # the trace's 20, the profile's
        assert decided["requests"] == recorded > 20, decided
        assert decided["action"] in ("keep", "hold", "applied"), decided
        assert (await names["scaler"].step())["replicas"] == 1
        assert (tmp_path / "mooncake.jsonl").exists()
        from dynamo_nb.engines.mocker_timing import ProfiledTiming, timing_model

        written = names["settings"].planner_profile_data
        assert isinstance(timing_model(written), ProfiledTiming)  # what the snippet wrote
    finally:
        await frontend.stop()
        await runtime.shutdown()
        await running.stop()
