"""The load generator: records against a stub with injected delays, our frontend's worker ids, charts, CLI."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pandas as pd
import pytest
from helpers import free_port

from dynamo_nb import ConfigError, DistributedRuntime, launch
from dynamo_nb.bench import (
    RECORD_COLUMNS,
    Chart,
    latency_cdf,
    live,
    load_json,
    multi_turn_prompts,
    path_chart,
    per_worker_chart,
    prompt_set,
    random_prompts,
    run,
    save_json,
    shared_prefix_prompts,
    summary,
    throughput_chart,
    ttft_itl_chart,
    wait_for_model,
)
from dynamo_nb.engines import EchoEngine
from dynamo_nb.frontend import Frontend
from dynamo_nb.llm import serve_llm
from dynamo_nb.testing import StubServer

TTFT, ITL, TOKENS = 0.05, 0.01, 8
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
async def slow_stub() -> AsyncIterator[StubServer]:
    async with await StubServer.start(ttft=TTFT, itl=ITL, workers=2) as stub:
        yield stub


@pytest.fixture(scope="module")
async def sweep(slow_stub: StubServer) -> pd.DataFrame:
    return await run(
        slow_stub.url, "stub", prompts=random_prompts(5, words=6), concurrency=[1, 4], requests=8,
        max_tokens=TOKENS, progress=False,
    )  # fmt: skip


async def test_records_have_every_column_and_the_injected_delays(sweep: pd.DataFrame) -> None:
    assert list(sweep.columns) == RECORD_COLUMNS
    assert len(sweep) == 16 and sweep["error"].isna().all() and (sweep["status"] == 200).all()
    assert sweep.groupby("concurrency").size().to_dict() == {1: 8, 4: 8}
    assert sorted(sweep[sweep.concurrency == 4]["index"]) == list(range(8))
    assert sweep["prompt"].iloc[:5].tolist() == [f"random-{i}" for i in range(5)]
    # a token cannot arrive before the server sends it: the injected delays are lower bounds
    assert (sweep["ttft_s"] >= TTFT).all()
    assert sweep["ttft_s"].median() < TTFT * 3  # loose: a busy host delays, it does not triple
    gaps = [g for gaps in sweep["itl_s"] for g in gaps]
    assert all(len(g) == TOKENS - 1 for g in sweep["itl_s"])
    assert ITL / 2 < statistics.median(gaps) < ITL * 3  # gaps between tokens, not sums or zeros
    assert (sweep["e2e_s"] >= sweep["ttft_s"] + sweep["itl_s"].map(sum) - 1e-6).all()
    assert (sweep["output_tokens"] == TOKENS).all() and (sweep["input_tokens"] == 8).all()
    assert set(sweep["worker"]) == {"5eed0000", "5eed0001"} and set(sweep["path"]) == {"aggregated"}
    assert sweep["prefill_worker"].isna().all()
    assert (sweep["sent_s"].diff().dropna()[sweep.concurrency.iloc[1:] == 1] > 0).all()


async def test_summary_percentiles_and_throughput(sweep: pd.DataFrame) -> None:
    table = summary(sweep)
    assert table.index.name == "concurrency" and table.index.tolist() == [1, 4]
    assert table["requests"].tolist() == [8, 8] and table["errors"].tolist() == [0, 0]
    for level, row in table.iterrows():
        assert row["ttft_p50_ms"] <= row["ttft_p90_ms"] <= row["ttft_p99_ms"]
        assert TTFT * 1000 <= row["ttft_p50_ms"] < TTFT * 1000 * 3
        assert ITL * 1000 / 2 < row["itl_p50_ms"] < ITL * 1000 * 3
        group = sweep[sweep.concurrency == level]
        wall = (group.sent_s + group.e2e_s).max() - group.sent_s.min()
        assert row["req_per_s"] == pytest.approx(8 / wall)
        assert row["output_tok_per_s"] == pytest.approx(8 * TOKENS / wall)
    # closed loop: at most `concurrency` requests in flight, and at 4 the first four overlap
    assert {level: most_in_flight(sweep[sweep.concurrency == level]) for level in (1, 4)} == {1: 1, 4: 4}


def most_in_flight(group: pd.DataFrame) -> int:
    """The most requests in flight at any request's send time (each runs from sent_s to sent_s + e2e_s)."""
    ends = group.sent_s + group.e2e_s
    return max(int(((group.sent_s <= sent) & (ends > sent)).sum()) for sent in group.sent_s)


async def test_labels_group_the_summary(sweep: pd.DataFrame) -> None:
    both = pd.concat([sweep.assign(label="a"), sweep.assign(label="b")], ignore_index=True)
    table = summary(both)
    assert table.index.names == ["label", "concurrency"] and len(table) == 4
    assert table.loc[("a", 1), "ttft_p50_ms"] == table.loc[("b", 1), "ttft_p50_ms"]


async def test_unary_and_completions_requests(slow_stub: StubServer) -> None:
    unary = await run(
        slow_stub.url, "stub", concurrency=2, requests=4, max_tokens=5, stream=False, progress=False
    )
    assert unary["error"].isna().all() and (unary["output_tokens"] == 5).all()
    assert (unary["ttft_s"] <= unary["e2e_s"]).all() and unary["itl_s"].map(len).eq(0).all()
    completions = await run(
        slow_stub.url + "/v1/", "stub", concurrency=1, requests=2, max_tokens=3, endpoint="completions",
        worker_ids=False, progress=False,
    )  # fmt: skip
    assert completions["error"].isna().all() and (completions["output_tokens"] == 3).all()
    assert completions["worker"].isna().all()  # not asked for, not reported


async def test_server_errors_are_rows_not_exceptions(slow_stub: StubServer) -> None:
    wrong_model = await run(slow_stub.url, "nope", concurrency=2, requests=3, progress=False)
    assert (wrong_model["status"] == 404).all()
    assert wrong_model["error"].str.contains("model 'nope' not found").all()
    assert wrong_model["ttft_s"].isna().all()
    refused = await run(f"http://127.0.0.1:{free_port()}", "x", concurrency=1, requests=1, progress=False)
    assert "Connect" in refused["error"].iloc[0] and pd.isna(refused["status"].iloc[0])
    slow = await run(
        slow_stub.url, "stub", concurrency=1, requests=1, max_tokens=50, timeout=0.2, progress=False
    )
    assert slow["error"].iloc[0] == "no complete answer within 0.2 s"
    assert summary(slow)["errors"].iloc[0] == 1 and math.isnan(summary(slow)["ttft_p50_ms"].iloc[0])


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"concurrency": 0}, "concurrency must be a positive integer"),
        ({"concurrency": [1, "8"]}, "concurrency"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"requests": -1}, "requests"),
        ({"endpoint": "embeddings"}, "endpoint must be one of chat, completions"),
        ({"prompts": []}, "prompts is empty"),
        ({"prompts": [42]}, "prompts[0] must be"),
    ],
)
async def test_bad_arguments_say_what_to_change(kwargs: dict, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        await run("http://127.0.0.1:1", "m", progress=False, **kwargs)
    assert says in str(caught.value)
    with pytest.raises(ConfigError, match="http://"):
        await run("127.0.0.1:8000", "m")


async def test_wait_for_model_on_any_openai_server(slow_stub: StubServer) -> None:
    assert await wait_for_model(slow_stub.url + "/v1", "stub", timeout=5) == ["stub"]
    with pytest.raises(TimeoutError, match=r"'other' was not ready .* models \['stub'\]"):
        await wait_for_model(slow_stub.url, "other", timeout=0.3)
    with pytest.raises(TimeoutError, match="ServerAnswerError: could not connect"):
        await wait_for_model(f"http://127.0.0.1:{free_port()}", "x", timeout=0.3)


def test_prompt_sets_are_deterministic_and_shaped_for_their_use() -> None:
    assert random_prompts(3, seed=7) == random_prompts(3, seed=7) != random_prompts(3, seed=8)
    assert all(len(p.text.split()) == 64 for p in random_prompts(3))
    shared = shared_prefix_prompts(4, system_words=20, user_words=5)
    assert len({p.messages[0]["content"] for p in shared}) == 1 and len({p.text for p in shared}) == 4
    conversations = multi_turn_prompts(conversations=3, turns=3, words=5)
    assert len(conversations) == 9
    by_name = {p.name: p for p in conversations}
    for conv in range(3):
        for turn in (1, 2):
            earlier, later = by_name[f"conv{conv}-turn{turn - 1}"], by_name[f"conv{conv}-turn{turn}"]
            assert later.messages[: len(earlier.messages)] == earlier.messages  # a growing shared prefix
            assert [m["role"] for m in later.messages[-2:]] == ["assistant", "user"]
    assert prompt_set("multi-turn", conversations=2, turns=1) == multi_turn_prompts(conversations=2, turns=1)
    with pytest.raises(ConfigError, match="unknown prompt set"):
        prompt_set("poems")
    with pytest.raises(ConfigError, match="words must be a positive integer"):
        random_prompts(2, words=0)


def test_charts_render_to_png_headless(sweep: pd.DataFrame, tmp_path: Path) -> None:
    labelled = pd.concat([sweep.assign(label="a"), sweep.assign(label="b")], ignore_index=True)
    figures = [ttft_itl_chart(labelled), throughput_chart(sweep), per_worker_chart(labelled)]
    figures += [latency_cdf(sweep, metric) for metric in ("ttft", "itl", "e2e")]
    for figure in figures:
        assert isinstance(figure, Chart) and figure._repr_png_().startswith(PNG)
    ttft_axes = figures[0].axes[0]
    assert len(ttft_axes.lines) == 6  # p50/p90/p99 for two labels
    assert list(ttft_axes.lines[0].get_xdata()) == [1, 4]
    counts = [bar.get_height() for bar in figures[2].axes[0].patches]
    assert sorted(counts) == [8, 8, 8, 8]  # two workers × two labels, 8 requests each
    figures[0].savefig(tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes().startswith(PNG)
    paths = sweep.assign(path=["fast", "fallback"] * (len(sweep) // 2))
    by_path = path_chart(paths)
    assert [t.get_text() for t in by_path.axes[0].get_xticklabels()] == ["fast", "fallback"]
    assert [bar.get_height() for bar in by_path.axes[0].patches] == pytest.approx(
        [paths[paths.path == p]["ttft_s"].median() * 1000 for p in ("fast", "fallback")]
    )
    assert "did not report one" in path_chart(sweep.assign(path=None)).axes[0].texts[0].get_text()
    no_ids = per_worker_chart(sweep.assign(worker=None))
    assert "did not report" in no_ids.axes[0].texts[0].get_text()
    with pytest.raises(ConfigError, match="metric must be one of"):
        latency_cdf(sweep, "tpot")


def test_charts_name_workers_by_role_and_zoom_on_the_tail(sweep: pd.DataFrame) -> None:
    workers = sorted(sweep["worker"].dropna().unique())
    roles = dict(zip(workers, ["fast", "slow"], strict=True))
    by_role = per_worker_chart(sweep, roles=roles)
    assert [t.get_text() for t in by_role.axes[0].get_xticklabels()] == ["fast", "slow"]
    assert by_role.axes[0].get_xlabel() == "worker"
    tail = latency_cdf(sweep, "itl", tail=0.9).axes[0]
    assert tail.get_ylim()[0] == pytest.approx(0.9) and tail.get_xscale() == "log"
    # gaps of 0.06 ms with a tail to 70 ms: the zoomed axis spans the tail, not the empty decades below
    spread = sweep.assign(itl_s=[[0.00006] * 95 + [0.01 + 0.012 * i for i in range(5)]] * len(sweep))
    low, high = latency_cdf(spread, "itl", tail=0.95).axes[0].get_xlim()
    assert 5 < low < 10 and 58 < high < 100, (low, high)
    assert "slowest 10%" in tail.get_title()
    with pytest.raises(ConfigError, match="tail is a share from 0 to below 1"):
        latency_cdf(sweep, "itl", tail=1.5)


async def test_live_chart_redraws_during_a_run(slow_stub: StubServer, tmp_path: Path) -> None:
    view = live("throughput", every=0.1, path=tmp_path / "live.png")
    df = await run(
        slow_stub.url, "stub", concurrency=[1, 2], requests=6, max_tokens=4, live=view, progress=False
    )
    assert len(df) == 12 and view.redraws >= 2
    assert view.last_png is not None and (tmp_path / "live.png").read_bytes() == view.last_png
    with pytest.raises(ConfigError, match="unknown chart"):
        live("pie")


async def test_json_round_trip(sweep: pd.DataFrame, tmp_path: Path) -> None:
    path = save_json(sweep, tmp_path / "deep" / "run.json", url="http://x", model="stub")
    document = json.loads(path.read_text())
    assert document["config"] == {"url": "http://x", "model": "stub"}
    assert [row["concurrency"] for row in document["summary"]] == [1, 4]
    back = load_json(path)
    assert list(back.columns) == RECORD_COLUMNS and len(back) == len(sweep)
    flat = [gap for gaps in back["itl_s"] for gap in gaps]
    assert flat == pytest.approx([gap for gaps in sweep["itl_s"] for gap in gaps])
    pd.testing.assert_frame_equal(summary(back), summary(sweep))
    tagged = save_json(sweep.assign(repeat=sweep.index % 2, speed="fast"), tmp_path / "tagged.json")
    again = load_json(tagged)  # a run's own columns come back beside the records' (a spread needs them)
    assert list(again.columns) == [*RECORD_COLUMNS, "repeat", "speed"]
    assert again["repeat"].tolist() == (sweep.index % 2).tolist() and set(again["speed"]) == {"fast"}


async def test_our_frontend_reports_the_serving_worker_of_each_request(tiny_path: Path) -> None:
    workers = [await DistributedRuntime.create() for _ in range(2)]
    front = await DistributedRuntime.create()
    try:
        for runtime in workers:
            await serve_llm(
                runtime.endpoint("bench.backend.generate"),
                EchoEngine().generate,
                tiny_path,
                model_name="echo",
            )
        frontend = await Frontend.start(front, port=0)
        assert await wait_for_model(frontend.url, "echo", instances=2, timeout=10) == ["echo"]
        with pytest.raises(TimeoutError, match="2 instance"):
            await wait_for_model(frontend.url, "echo", instances=3, timeout=0.3)
        df = await run(
            frontend.url, "echo", concurrency=2, requests=8, max_tokens=6, progress=False, ignore_eos=True
        )
        assert df["error"].isna().all() and (df["output_tokens"] == 6).all()
        ids = {f"{runtime.connection_id:x}" for runtime in workers}
        assert set(df["worker"]) == ids and df.groupby("worker").size().tolist() == [4, 4]  # round robin
        assert set(df["path"]) == {"aggregated"}
        async with httpx.AsyncClient(base_url=frontend.url) as http:
            body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            plain = (await http.post("/v1/chat/completions", json=body)).json()
            asked = (
                await http.post(
                    "/v1/chat/completions", json={**body, "nvext": {"extra_fields": ["worker_id"]}}
                )
            ).json()
        assert "nvext" not in plain
        assert asked["nvext"]["worker_id"]["prefill_worker_id"] is None
        assert f"{asked['nvext']['worker_id']['decode_worker_id']:x}" in ids
        await frontend.stop()
    finally:
        for runtime in [*workers, front]:
            await runtime.shutdown()


@pytest.mark.processes
async def test_cli_writes_json_and_png_against_a_launched_stub(tmp_path: Path) -> None:
    stub = await launch(
        "-m", "dynamo_nb.testing.stub_server", "--ttft", "0.01", show_logs=False, log_dir=tmp_path
    )
    try:
        out, plot = tmp_path / "r.json", tmp_path / "c.png"
        command = [
            sys.executable, "-m", "dynamo_nb.bench", "--url", stub.url, "--model", "stub", "--concurrency", "1,2",
            "--requests", "4", "--max-tokens", "3", "--out", str(out), "--plot", str(plot), "--no-progress",
        ]  # fmt: skip
        result = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "ttft_p50_ms" in result.stdout and f"wrote {out}" in result.stdout
        document = json.loads(out.read_text())
        assert len(document["requests"]) == 8 and document["config"]["concurrency"] == [1, 2]
        assert plot.read_bytes().startswith(PNG)
        bad = [*command[:8], "0,x"]
        result = await asyncio.to_thread(subprocess.run, bad, capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "like 1,8,32" in result.stderr
    finally:
        await stub.stop()


@pytest.mark.processes
def test_in_a_kernel_the_live_view_updates_one_display_and_charts_show_once() -> None:
    import jupyter_client

    manager, kernel = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        cell = (
            "from dynamo_nb import bench\n"
            "from dynamo_nb.testing import StubServer\n"
            "stub = await StubServer.start(ttft=0.02, itl=0.01)\n"
            "df = await bench.run(stub.url, 'stub', concurrency=[1, 2], requests=10, max_tokens=5,\n"
            "                     progress=False, live=bench.live(every=0.1))\n"
            "await stub.stop()\n"
            "bench.ttft_itl_chart(df)"
        )
        messages: list[dict] = []
        reply = kernel.execute_interactive(cell, timeout=60, output_hook=messages.append)
        assert reply["content"]["status"] == "ok", messages
        shown = [m for m in messages if m["msg_type"] == "display_data"]
        updates = [m for m in messages if m["msg_type"] == "update_display_data"]
        assert len(shown) == 1 and "image/png" in shown[0]["content"]["data"]  # one live figure…
        display_id = shown[0]["content"]["transient"]["display_id"]
        assert updates and all(
            m["content"]["transient"]["display_id"] == display_id for m in updates
        )  # …redrawn
        results = [m for m in messages if m["msg_type"] == "execute_result"]
        assert (
            len(results) == 1 and "image/png" in results[0]["content"]["data"]
        )  # a chart shows once, inline
        assert results[0]["content"]["data"]["text/plain"].startswith("<Chart size")
    finally:
        kernel.stop_channels()
        manager.shutdown_kernel(now=True)


def test_token_events_are_counted_from_their_bytes_as_decoding_would() -> None:
    """`text_pieces` (no JSON decoding) agrees with decoding on every shape a server sends: ours,
    Dynamo's and vLLM's chunks, spaces after colons, the role chunk, reasoning text, escaped
    quotes, several choices; payloads with usage, nvext or an error, or not an object, are left
    to the decoder."""
    from dynamo_nb.bench.http_client import _read_event, text_pieces

    payloads = [
        {"id": "c", "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"content": None, "reasoning_content": "think"}}]},
        {"choices": [{"index": 0, "delta": {"content": '"content":"x" \\"'}}]},
        {"choices": [{"index": 0, "text": " robot"}, {"index": 1, "text": ""}, {"index": 2, "text": "a"}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        {"choices": [{"index": 0, "delta": {"content": "\u00e9\U0001f600"}}]},
    ]
    for payload in payloads:
        for separators in ((",", ":"), (", ", ": ")):
            for ascii_only in (True, False):
                data = json.dumps(payload, separators=separators, ensure_ascii=ascii_only).encode()
                assert text_pieces(data) == _read_event(data, {}), data
    for data in (
        b'{"choices":[],"usage":{"completion_tokens":3}}',
        b'{"choices":[{"delta":{"content":"x"}}],"nvext":{"worker_id":{}}}',
        b'{"error":{"message":"boom"}}',
        b'{"choices":[{"delta":{"content":"x"',
        b"[1, 2]",
    ):
        assert text_pieces(data) is None, data


def test_instances_are_counted_on_dynamos_health_too() -> None:
    """Dynamo's /health names no model per instance (its shape, as Dynamo 1.6.1 answers): the
    workers of its generate endpoints are counted; with several models it cannot say, and says so."""
    from dynamo_nb.bench.runner import _instances_serving

    def entry(instance: int, endpoint: str) -> dict[str, object]:
        return {"component": "backend", "endpoint": endpoint, "namespace": "dynamo", "instance_id": instance,
                "transport": {"tcp": "127.0.0.1:39549/3aca/dynamo/backend/" + endpoint}}  # fmt: skip

    dynamos = {"status": "healthy", "endpoints": ["dyn://dynamo.backend.generate", "dyn://dynamo.backend.stats"],
               "instances": [entry(1, "generate"), entry(1, "stats"), entry(2, "generate"), entry(2, "stats")]}  # fmt: skip
    assert _instances_serving(dynamos, "tiny-llama", ["tiny-llama"]) == 2
    with pytest.raises(ConfigError, match="does not say which model an instance serves"):
        _instances_serving(dynamos, "tiny-llama", ["tiny-llama", "other"])
    ours = {
        "instances": [{"model": "tiny-llama", "instance_id": "a"}, {"model": "other", "instance_id": "b"}]
    }
    assert _instances_serving(ours, "tiny-llama", ["tiny-llama", "other"]) == 1


def test_spread_gives_each_labels_median_per_repeat_and_the_range() -> None:
    """Two labels, three repeats: the table holds each repeat's median TTFT (failed requests left out),
    their median, low and high; the chart draws a bar at that median with a whisker over the range."""
    from dynamo_nb.bench import spread, spread_chart

    rows = []
    for repeat, (fast, slow) in enumerate([(10, 30), (12, 33), (11, 40)]):
        for label, ms in (("kv", fast), ("round-robin", slow)):
            rows += [
                {"label": label, "repeat": repeat, "ttft_s": (ms + d) / 1000, "error": None}
                for d in (-1, 0, 1)
            ]
    rows.append({"label": "kv", "repeat": 0, "ttft_s": 9.0, "error": "boom"})  # left out
    df = pd.DataFrame(rows)
    table = spread(df)
    assert table.loc["kv", [0, 1, 2]].tolist() == pytest.approx([10, 12, 11])
    assert table.loc["round-robin", ["median_ms", "low_ms", "high_ms"]].tolist() == pytest.approx(
        [33, 30, 40]
    )
    chart = spread_chart(df)
    assert [bar.get_height() for bar in chart.axes[0].patches] == pytest.approx([11, 33])
    with pytest.raises(ConfigError, match="assign"):
        spread(df.drop(columns="repeat"))


def test_spread_takes_another_quantile_and_another_grouping() -> None:
    """``q=0.9`` gives each repeat's own p90 (not the pooled one); ``by=`` groups by another column."""
    from dynamo_nb.bench import spread

    rows = [
        {"path": path, "repeat": repeat, "e2e_s": (ms + 10 * repeat) / 1000, "error": None}
        for repeat in (0, 1)
        for path, base in (("fast", 10), ("fallback", 20))
        for ms in range(base, base + 11)
    ]
    table = spread(pd.DataFrame(rows), "e2e", by="path", q=0.9)
    assert table.loc["fast", [0, 1]].tolist() == pytest.approx([19, 29])  # each repeat's p90
    assert table.loc["fallback", ["low_ms", "high_ms"]].tolist() == pytest.approx([29, 39])
    with pytest.raises(ConfigError, match="quantile"):
        spread(pd.DataFrame(rows), "e2e", by="path", q=90)
    with pytest.raises(ConfigError, match="'route'"):
        spread(pd.DataFrame(rows), "e2e", by="route")


def test_median_interval_covers_the_median_as_often_as_it_says() -> None:
    """Two order statistics around the median: on 2,000 samples of 30 skewed values the interval
    holds the true median at least about 95 % of the time (and not always: it is no min-to-max);
    paired differences of a real shift exclude 0, differences of pure noise mostly do not; too
    few values for a 95 % interval give NaN bounds."""
    import math

    import numpy as np

    from dynamo_nb.bench import median_interval

    rng = np.random.default_rng(1)
    true_median = math.log(2)  # of an exponential of mean 1
    intervals = [median_interval(rng.exponential(1.0, 30)) for _ in range(2000)]
    covered = sum(low <= true_median <= high for low, _, high in intervals) / len(intervals)
    assert 0.93 <= covered < 0.99, covered
    assert median_interval([10, 11, 12, 13, 14, 15, 16]) == (10.0, 13.0, 16.0)  # k = 1 of 7: 98 %
    assert median_interval(range(30))[::2] == (9.0, 20.0)  # k = 10 of 30: 95.7 %
    assert median_interval(rng.normal(2, 1, 30))[0] > 0  # e.g. fast minus aggregated, round by round
    excluded = sum(
        not (lo < 0 < hi) for lo, _, hi in (median_interval(rng.normal(0, 1, 30)) for _ in range(400))
    )
    assert excluded < 0.1 * 400
    low, middle, high = median_interval([3.0, 1.0, float("nan"), 2.0])
    assert middle == 2.0 and math.isnan(low) and math.isnan(high)  # 3 values: 75 % at best
    assert all(math.isnan(v) for v in median_interval([]))
    assert median_interval(rng.normal(0, 1, 5000))[0] < 0 < median_interval(rng.normal(0, 1, 5000))[2]
    with pytest.raises(ConfigError, match="confidence"):
        median_interval([1, 2], confidence=95)


def test_level_charts_draw_the_range_over_repeats() -> None:
    """Three repeats of each level: the TTFT/ITL and throughput charts draw a whisker per label from
    the lowest repeat's figure to the highest at each level and say so in the title; one run draws
    none. The path chart draws each median's interval; the spread chart names its quantile."""
    from matplotlib.axes import Axes

    from dynamo_nb.bench import layout_problems as bench_layout_problems
    from dynamo_nb.bench import (
        median_interval,
        path_chart,
        spread_chart,
        summary,
        throughput_chart,
        ttft_itl_chart,
    )

    rows = [
        {
            "label": "one",
            "concurrency": level,
            "rate": float("nan"),
            "repeat": repeat,
            "sent_s": i * 0.01 * (repeat + 1),  # each repeat at its own pace: different req/s
            "ttft_s": (5 + repeat + level) / 1000,
            "e2e_s": 0.05,
            "itl_s": [0.002 * (repeat + 1)] * 3,
            "output_tokens": 4,
            "error": None,
            "path": "fast" if i % 2 else "fallback",
        }
        for level in (1, 4)
        for repeat in range(3)
        for i in range(8)
    ]
    df = pd.DataFrame(rows)
    for chart in (ttft_itl_chart(df), throughput_chart(df)):
        assert all(ax.containers for ax in chart.axes), "a whisker on each panel"
        assert all("3 repeats" in ax.get_title() for ax in chart.axes)
    assert not bench_layout_problems(throughput_chart(df))

    def ends(ax: Axes) -> list[float]:
        return [v for s in ax.containers[0].lines[2][0].get_segments() for v in (s[0][1], s[1][1])]

    assert ends(ttft_itl_chart(df).axes[0]) == pytest.approx([6, 8, 9, 11])  # TTFT p50 (ms), per level
    assert ends(ttft_itl_chart(df).axes[1]) == pytest.approx([2, 6, 2, 6])  # ITL p50 (ms)
    per_repeat = [summary(run).loc[1, "req_per_s"] for _, run in df[df["concurrency"] == 1].groupby("repeat")]
    assert ends(throughput_chart(df).axes[0])[:2] == pytest.approx([min(per_repeat), max(per_repeat)])
    single = ttft_itl_chart(df[df["repeat"] == 0])
    assert not single.axes[0].containers and "repeats" not in single.axes[0].get_title()
    other = df[df["repeat"] < 2].assign(label="two")  # a second label with two repeats, not three
    assert "range over 2–3 repeats" in ttft_itl_chart(pd.concat([df, other])).axes[0].get_title()
    # one repeat a label
    apart = pd.concat([df[df["repeat"] == 0], df[df["repeat"] == 1].assign(label="two")])
    assert "repeats" not in throughput_chart(apart).axes[0].get_title()  # no whisker drawn, none named
    paths = path_chart(df)
    bars, _, interval = paths.axes[0].containers  # the bars, the whiskers to p99, the medians' intervals
    fast = median_interval(df[df["path"] == "fast"]["ttft_s"] * 1000)
    assert [interval.lines[2][0].get_segments()[0][i][1] for i in (0, 1)] == pytest.approx([fast[0], fast[2]])
    assert bars[0].get_height() == pytest.approx(fast[1]) and "95 % interval" in paths.axes[0].get_title()
    assert spread_chart(df, "e2e", q=0.9).axes[0].get_title().startswith("p90 E2E")


def test_rates_over_repeated_runs_count_each_runs_time_once() -> None:
    """Two runs of one level tagged with ``repeat`` (each run's ``sent_s`` from its own start):
    requests/s and tokens/s are all their requests over the sum of the two runs' spans, not over
    the longer span alone (which would count the requests of both against one run's time)."""
    from dynamo_nb.bench.stats import level_duration

    def run(repeat: int, seconds: float) -> list[dict]:
        return [
            {"label": "m", "concurrency": 1, "repeat": repeat, "sent_s": i * seconds / 4, "e2e_s": seconds / 4,
             "ttft_s": 0.01, "itl_s": [], "output_tokens": 10, "error": None}
            for i in range(4)
        ]  # fmt: skip

    both = pd.DataFrame(run(0, 1.0) + run(1, 2.0))
    assert level_duration(both) == pytest.approx(3.0)
    row = summary(both).iloc[0]
    assert row["req_per_s"] == pytest.approx(8 / 3.0) and row["output_tok_per_s"] == pytest.approx(80 / 3.0)
    assert level_duration(both.drop(columns="repeat")) == pytest.approx(2.0)  # untagged: one span
