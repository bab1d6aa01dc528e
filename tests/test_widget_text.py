"""What a notebook shows of our widgets before they render (a fresh, untrusted open) and what
nbval compares: one readable line each, not an ipywidgets field dump or a frozen 0 % bar."""

from __future__ import annotations

from typing import Any

import pytest

from dynamo_nb.bench.progress import NoProgress, WidgetProgress, progress_bar
from dynamo_nb.launch.logview import WidgetLog

pytest.importorskip("ipywidgets")


def plain_text(widget: Any) -> str:
    return widget._repr_mimebundle_()["text/plain"]


def test_a_launch_log_box_reads_as_one_line_and_keeps_the_lines(capsys: pytest.CaptureFixture[str]) -> None:
    log = WidgetLog("worker-0 · pid 123", "/tmp/worker-0.log")
    text = plain_text(log._box)
    assert text.startswith("[worker-0 · pid 123] live output") and "Accordion(" not in text
    log.status("ready")
    assert log._box.get_title(0) == "worker-0 · pid 123 · ready"
    assert "log: /tmp/worker-0.log" in log._output.outputs[0]["text"]


def test_a_progress_bar_says_what_it_counts_and_counts(capsys: pytest.CaptureFixture[str]) -> None:
    bar = WidgetProgress(total=64, desc="bench")
    assert plain_text(bar._box) == "bench: 64 requests (a progress bar while the sweep runs)"
    bar.set_description("concurrency 8")
    for _ in range(64):
        bar.update()
    bar.close()
    assert bar._label.value == "concurrency 8" and bar._bar.value == 64
    assert bar._count.value.startswith("64/64") and bar._bar.bar_style == "success"


def test_a_progress_bar_redraws_a_few_times_a_second_not_per_request() -> None:
    """Each redraw is two messages to the front end; thousands of them overflowed a kernel's
    output channel. The count is still exact at the end."""
    bar = WidgetProgress(total=3000, desc="bench")
    redraws: list[int] = []
    bar._bar.observe(lambda change: redraws.append(change["new"]), names="value")
    for _ in range(2999):
        bar.update()
    assert len(redraws) <= 4  # well under a second of updates: the first after MIN_INTERVAL at most
    bar.update()  # the last request is always drawn
    bar.close()
    assert redraws[-1] == 3000 and bar._count.value.startswith("3000/3000")


def test_outside_a_notebook_the_bar_is_tqdm_or_nothing() -> None:
    assert isinstance(progress_bar(10, "bench", enabled=False), NoProgress)
    bar = progress_bar(10, "bench", enabled=True)
    assert type(bar).__module__.startswith("tqdm")
    bar.close()
