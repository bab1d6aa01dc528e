"""Profiles: a live engine measured into a timing model (`bench.profile`, ``python -m dynamo_nb
profile``), written and read in Dynamo's profile-data layout, fitted, and used by the mocker's
scheduler (``--planner-profile-data``), whose simulated step times are then the fitted model's."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import hf_frontends

from dynamo_nb import bench
from dynamo_nb.engines.mocker_scheduler import MockerScheduler, MockerSettings, MockJob
from dynamo_nb.engines.mocker_timing import (
    PolynomialTiming,
    ProfiledTiming,
    TimingProfile,
    timing_model,
)
from dynamo_nb.errors import ConfigError, RequestError

pytestmark = pytest.mark.timeout(180)

# a known engine: prefill 2e-5·T² + 0.03·T + 4 ms, decode 1.5 + 0.2·batch + 0.001·kv_tokens ms
KNOWN = TimingProfile(
    prefill=[(t, 2e-5 * t * t + 0.03 * t + 4) for t in (16, 64, 256, 1024)],
    decode=[(b, c, 1.5 + 0.2 * b + 0.001 * b * c) for b in (1, 4, 16) for c in (50.0, 400.0)],
    max_kv_tokens=65536,
    request_overhead_ms=0.7,
)


def test_a_fit_recovers_a_known_engines_coefficients() -> None:
    """The measured first tokens are the prefill and its step's decode of one sequence (1.5 + 0.2
    + 0.001·T here): the prefill is fitted on what is left, and a first token replays as measured."""
    model = ProfiledTiming.fit(KNOWN)
    assert np.allclose(model.prefill_coefficients, (2e-5, 0.03 - 0.001, 4 - 1.7), rtol=1e-6)
    assert [model.first_token_ms(t) for t, _ in KNOWN.prefill] == pytest.approx(
        [ms for _, ms in KNOWN.prefill]
    )
    assert np.allclose(model.decode_coefficients, (1.5, 0.2, 0.001), rtol=1e-6)
    assert all(abs(e) < 1e-6 for errors in model.residuals().values() for e in errors)


def test_decode_steps_are_interpolated_on_the_measured_grid_and_extrapolated_beyond_it() -> None:
    """A step time that bends with the batch (no plane fits it): the grid passes through every
    point, is linear between and beyond them, and each point left out is predicted from the rest."""

    def step(b: int, c: float) -> float:
        return 1.0 + 0.4 * min(b, 4) + 0.1 * b + 0.002 * b * c

    bent = TimingProfile(prefill=KNOWN.prefill, decode=[(b, c, step(b, c)) for b in (1, 2, 4, 8, 16)
                                                        for c in (40.0, 400.0)])  # fmt: skip
    model = ProfiledTiming.fit(bent)
    assert model.decode_grid is not None and model.decode_grid[0] == (1.0, 2.0, 4.0, 8.0, 16.0)
    for b, c, ms in bent.decode:
        assert model.decode_ms(batch=b, kv_tokens=round(b * c), kv_load=0) == pytest.approx(ms)
    assert model.decode_ms(batch=12, kv_tokens=12 * 40, kv_load=0) == pytest.approx(step(12, 40))  # between
    assert model.decode_ms(batch=32, kv_tokens=32 * 220, kv_load=0) == pytest.approx(step(32, 220))  # beyond
    plane = ProfiledTiming.fit(TimingProfile(prefill=KNOWN.prefill, decode=bent.decode[:-1]))  # not a grid
    assert plane.decode_grid is None and "grid" not in repr(plane) and "5×2 grid" in repr(model)
    errors = model.residuals()["decode"]  # left out: the bend at 4 is what a neighbour cannot see
    assert len(errors) == 10 and max(abs(e) for e in errors) > 5 and min(abs(e) for e in errors) < 1e-6


def test_a_cached_prefix_costs_what_the_profile_measured() -> None:
    """Prefills after a cached prefix fit the prefix's cost, q·P + r·P·T, over the uncached curve."""

    def after(p: int, t: int) -> float:
        return 2e-5 * t * t + 0.03 * t + 4 + 0.002 * p + 1e-5 * p * t

    with_prefix = TimingProfile(prefill=KNOWN.prefill, decode=KNOWN.decode,
                                prefill_after_prefix=[(p, t, after(p, t)) for p in (128, 512) for t in (16, 256)])  # fmt: skip
    model = ProfiledTiming.fit(with_prefix)
    assert np.allclose(
        model.prefix_coefficients, (0.002 - 0.001, 1e-5), rtol=1e-6
    )  # less its decode's KV read
    assert model.first_token_ms(64, 300) == pytest.approx(after(300, 64))
    assert model.first_token_ms(64) == pytest.approx(after(0, 64)) and "·P·T" in repr(model)
    assert ProfiledTiming.fit(KNOWN).prefix_coefficients == (0.0, 0.0)  # none measured: the uncached curve


def test_the_fit_reads_as_a_formula_with_its_variables_named() -> None:
    """A negative coefficient prints after a minus sign (not ``+ -``) and the formula says what T
    and P are, as notebook 12 prints it."""
    falling = TimingProfile(prefill=KNOWN.prefill, decode=KNOWN.decode,
                            prefill_after_prefix=[(p, t, 12 - 0.002 * p) for p in (128, 512) for t in (16, 256)])  # fmt: skip
    text = repr(ProfiledTiming.fit(falling))
    assert "+ -" not in text and " − " in text, text
    assert "T new prompt tokens, P computed before them" in text, text
    assert "P computed" not in repr(ProfiledTiming.fit(KNOWN))  # no prefix measured: no P in the formula


def test_a_step_of_several_prompts_charges_each_its_own_curve() -> None:
    """Attention is quadratic in each prompt, not in the step's total: a profiled model charges
    every chunk its own T and P terms and the fixed cost once; Dynamo's curves count the step's
    tokens as one prompt, as Dynamo's mocker does."""
    model = ProfiledTiming.fit(KNOWN)
    a, b, c = model.prefill_coefficients
    burst = [(0, 192)] * 20
    assert model.step_prefill_ms(burst) == pytest.approx(20 * (a * 192**2 + b * 192) + c)
    assert model.step_prefill_ms(burst) < model.prefill_ms(20 * 192) / 2  # one 3840-token curve: far more
    assert model.step_prefill_ms([(0, 64)]) == pytest.approx(model.prefill_ms(64))
    assert model.step_prefill_ms([(128, 0)]) == 0.0 and model.step_prefill_ms([]) == 0.0
    dynamos = PolynomialTiming()
    assert dynamos.step_prefill_ms(burst) == pytest.approx(dynamos.prefill_ms(20 * 192))
    # the scheduler asks the model for each step's chunks: 3 prompts admitted at once, one step
    scheduler = MockerScheduler(MockerSettings(block_size=16))
    scheduler.timing = model
    for first in range(3):  # prompts with nothing in common
        scheduler.add(MockJob(prompt=list(range(first * 1000, first * 1000 + 192)), max_tokens=2))
    chunks, _ = scheduler.plan_step()
    prefill, _ = scheduler.step_parts(chunks)
    assert len(chunks) == 3 and prefill * 1000 == pytest.approx(model.step_prefill_ms([(0, 192)] * 3))


def test_a_profile_round_trips_through_dynamos_layout(tmp_path: Path) -> None:
    folder = KNOWN.write(tmp_path / "profile")
    with np.load(folder / "selected_prefill_interpolation" / "raw_data.npz") as prefill:
        assert set(prefill) == {"prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu"}
    with np.load(folder / "selected_decode_interpolation" / "raw_data.npz") as decode:
        assert set(decode) == {"x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu", "max_kv_tokens"}
    with np.load(folder / "perf_data.npz") as tables:  # the one-file form Dynamo's mocker takes
        assert tables["decode_itl"].shape == (100, 100) and len(tables["prefill_ttft_ms"]) == 100
    again = TimingProfile.read(folder)
    assert again.prefill == KNOWN.prefill and again.max_kv_tokens == KNOWN.max_kv_tokens
    assert again.request_overhead_ms == 0.7  # kit_profile.json, beside Dynamo's files
    assert [(b, c) for b, c, _ in again.decode] == [(b, c) for b, c, _ in KNOWN.decode]
    assert np.allclose([ms for *_, ms in again.decode], [ms for *_, ms in KNOWN.decode])


def test_dynamos_json_variant_is_read_and_a_folder_without_data_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "prefill_raw_data.json").write_text(json.dumps(
        {"prefill_isl": [t for t, _ in KNOWN.prefill], "prefill_ttft": [ms for _, ms in KNOWN.prefill]}))  # fmt: skip
    (tmp_path / "decode_raw_data.json").write_text(json.dumps({
        "x_kv_usage": [b * c / 65536 for b, c, _ in KNOWN.decode], "y_context_length": [c for _, c, _ in KNOWN.decode],
        "z_itl": [ms for *_, ms in KNOWN.decode], "max_kv_tokens": 65536}))  # fmt: skip
    assert np.allclose(
        ProfiledTiming.fit(TimingProfile.read(tmp_path)).decode_coefficients, (1.5, 0.2, 0.001)
    )
    with pytest.raises(
        ConfigError, match=re.escape("selected_prefill_interpolation/raw_data.npz or prefill_raw_data.json")
    ):
        TimingProfile.read(tmp_path / "empty")
    with pytest.raises(ConfigError, match="at least 3 prefill and 3 decode"):
        TimingProfile(prefill=KNOWN.prefill[:2], decode=KNOWN.decode).write(tmp_path / "few")


def test_the_mockers_steps_take_the_profiles_times(tmp_path: Path) -> None:
    """On a simulated clock: a 256-token prompt's prefill step, then decode steps of one job."""
    folder = KNOWN.write(tmp_path / "profile")
    settings = MockerSettings(block_size=16, planner_profile_data=str(folder))
    assert "--planner-profile-data" in settings.argv()
    scheduler = MockerScheduler(settings)
    assert isinstance(scheduler.timing, ProfiledTiming)
    assert isinstance(MockerScheduler(MockerSettings()).timing, PolynomialTiming)
    scheduler.add(MockJob(prompt=list(range(256)), max_tokens=3))
    seconds = []
    while scheduler.busy:
        chunks, step = scheduler.plan_step()
        seconds.append(step * 1000)
        scheduler.finish_step(chunks)
    model = timing_model(folder)
    first = model.prefill_ms(256) + model.decode_ms(batch=1, kv_tokens=256, kv_load=0)
    assert seconds[0] == pytest.approx(first)  # the prompt, and the first token's decode
    assert seconds[1] == pytest.approx(model.decode_ms(batch=1, kv_tokens=257, kv_load=0))


@pytest.mark.processes
async def test_a_live_engine_is_profiled_written_and_fitted(tmp_path: Path) -> None:
    """The hf engine behind the frontend, measured by bench.profile and by the command line."""
    async with hf_frontends() as (front,):
        measured = await bench.profile(front.url, "tiny-llama", prefill_tokens=(16, 64, 256), batches=(1, 4),
                                       contexts=(32, 128), cached_prefixes=(64, 256), new_after_prefix=(16, 128),
                                       decode_tokens=8, repeats=1, progress=False)  # fmt: skip
        assert [t for t, _ in measured.prefill] == [16, 64, 256] and all(ms > 0 for _, ms in measured.prefill)
        # the engine's own cached count (whole 16-token blocks of the prefix), the rest new
        assert [(p, t) for p, t, _ in measured.prefill_after_prefix] == [
            (64, 16),
            (64, 128),
            (256, 16),
            (256, 128),
        ]
        assert [(b, c) for b, c, _ in measured.decode] == [(1, 36.0), (1, 132.0), (4, 36.0), (4, 132.0)]
        assert all(ms > 0 for *_, ms in measured.decode) and measured.request_overhead_ms > 0
        model = ProfiledTiming.fit(TimingProfile.read(measured.write(tmp_path / "hf")))
        assert model.prefill_ms(128) > 0 and model.decode_ms(batch=4, kv_tokens=400, kv_load=0) > 0
        assert (
            model.profile.prefill_after_prefix == measured.prefill_after_prefix
        )  # kept beside Dynamo's files
        assert model.prefix_coefficients != (0.0, 0.0)
        # prefills timed alone on an idle engine instead of among decoding requests, greedy
        alone = await bench.profile(front.url, "tiny-llama", prefill_tokens=(16, 64, 256), batches=(1, 2),
                                    contexts=(32,), cached_prefixes=(), load_streams=0, temperature=0,
                                    decode_tokens=8, repeats=1, progress=False)  # fmt: skip
        assert [t for t, _ in alone.prefill] == [16, 64, 256] and all(ms > 0 for _, ms in alone.prefill)
        assert [(b, c) for b, c, _ in alone.decode] == [
            (1, 36.0),
            (2, 36.0),
        ] and not alone.prefill_after_prefix
        command = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dynamo_nb", "profile", "--url", front.url, "--model", "tiny-llama",
            "--out", str(tmp_path / "cli"), "--repeats", "1", "--batches", "1,2,4", "--contexts", "32,96",
            "--temperature", "0",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(command.communicate(), 150)
    assert command.returncode == 0, err.decode()[-2000:]
    assert "ProfiledTiming(prefill" in out.decode() and "the fit within" in out.decode()
    from_cli = TimingProfile.read(tmp_path / "cli")
    assert (
        from_cli.prefill
        and sorted({b for b, _, _ in from_cli.decode}) == [1, 2, 4]
        and len(from_cli.decode) == 6
    )


@pytest.mark.parametrize("sizes", ["0", "1,x", ""])
def test_the_command_refuses_a_grid_it_cannot_measure(sizes: str, capsys: pytest.CaptureFixture[str]) -> None:
    from dynamo_nb.bench.profile import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--url", "http://127.0.0.1:9", "--model", "m", "--out", "x", "--batches", sizes])
    assert exit_info.value.code == 2 and "--batches" in capsys.readouterr().err


async def test_profiling_a_server_without_the_kits_timing_says_so() -> None:
    async with hf_frontends() as (front,):
        with pytest.raises(Exception, match="answered 404"):
            await bench.profile(front.url, "no-such-model", progress=False)


def test_the_fit_is_drawn_with_its_residuals() -> None:
    chart = bench.profile_chart(ProfiledTiming.fit(KNOWN))
    titles = [ax.get_title() for ax in chart.axes]
    assert titles == [
        "prefill (ms)",
        "decode step: measured against predicted (ms)",
        "each point's error (%)",
    ]
    assert bench.layout_problems(chart) == [] and chart.to_png().startswith(b"\x89PNG")


async def test_a_probe_no_stream_spanned_is_sent_again_then_named() -> None:
    """A prefill probe during which every decoding stream ended or sent nothing measured nothing:
    it is sent again (a fast engine's short streams, a stalled machine), and after ``ATTEMPTS``
    such probes the error says what to change."""
    profiling = sys.modules["dynamo_nb.bench.profile"]  # the module (bench.profile is its function)

    class Probe(profiling._PrefillProbe):
        def __init__(self, spans_on: int) -> None:
            super().__init__(None, "tiny-llama", TimingProfile(), 8, {}, 1)
            self.sent, self.spans_on = 0, spans_on

        async def _among_streams_once(self, prompt: list[int], cached: bool) -> tuple[float, int]:
            self.sent += 1
            if self.sent < self.spans_on:
                raise profiling._NoStreamSpanned("no stream spanned it")
            return 12.5, 0

    probe = Probe(spans_on=3)
    assert await probe._among_streams([1, 2, 3], False) == (12.5, 0) and probe.sent == 3
    never = Probe(spans_on=profiling._PrefillProbe.ATTEMPTS + 1)
    with pytest.raises(RequestError, match="no stream"):
        await never._among_streams([1, 2, 3], False)
    assert never.sent == profiling._PrefillProbe.ATTEMPTS
