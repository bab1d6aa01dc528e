"""How long a mocker step takes: Dynamo's built-in curves, or a model fitted to an engine you measured.

- `PolynomialTiming`: Dynamo's mocker's default (its polynomial model, fitted on a GPU you may
  not have): prefill ``4.209989e-7·T² + 1.518344e-2·T + 16.50142`` ms for T uncached prompt
  tokens in the step, decode ``max(-25.74·p² + 54.01·p + 5.74, 1)`` ms at KV load p.
- `ProfiledTiming`: fitted to a `TimingProfile` measured on a live engine
  (`dynamo_nb.bench.profile`): prefill ``a·T² + b·T + c + q·P + r·P·T`` ms for T uncached
  tokens after P cached ones (the first three terms are the shape Dynamo's profiler fits its
  prefill curve with; the last two, reading the cached prefix, are fitted where the profile
  measured prefills after a cached prefix, else 0). A step that prefills several prompts pays
  the T and P terms for each prompt on its own (attention is quadratic in each prompt's length,
  not in the step's total: a burst of 20 prompts of 192 tokens costs 20 times one, where a
  curve in the step's 3840 tokens would charge 18 times more than that for the quadratic
  term) and c once; decode, where the profile's points form a
  grid of batch sizes × context lengths (as `dynamo_nb.bench.profile` measures them), the step
  time interpolated on that grid, bilinear in (batch, context = kv_tokens / batch) and linear
  beyond its edges (as Dynamo's mocker interpolates its profile: a step's time is not a plane in
  batch and context, it bends where the batch starts to fill the cores); otherwise a plane
  ``d₀ + d₁·batch + d₂·kv_tokens`` ms fitted by least squares (a cost per step, per running
  sequence and per KV token its attention reads); each floored at 0.1 ms.
- `TimingProfile`: the measured points, written and read in Dynamo's profile-data layout, the
  folder Dynamo's profiler writes and ``python -m dynamo.mocker --planner-profile-data DIR``
  reads: ``selected_prefill_interpolation/raw_data.npz`` (``prefill_isl``, ``prefill_ttft`` in ms,
  ``prefill_thpt_per_gpu``) and ``selected_decode_interpolation/raw_data.npz`` (``x_kv_usage``,
  ``y_context_length``, ``z_itl`` in ms, ``z_thpt_per_gpu``, ``max_kv_tokens``); its JSON
  variant (``prefill_raw_data.json``, ``decode_raw_data.json``) is read too. Beside them
  ``perf_data.npz``, the fitted model as the one-file tables Dynamo's mocker also takes.

`timing_model(path)` is what ``--planner-profile-data`` and ``MockerSettings(planner_profile_data=…)``
load (None: Dynamo's curves). numpy is needed only to read, write and fit a profile.

Example:
    >>> profile = TimingProfile(prefill=[(64, 3.0), (256, 6.0), (1024, 18.0)],
    ...                         decode=[(1, 100, 1.0), (8, 100, 1.6), (8, 400, 2.2), (1, 400, 1.1)])
    >>> model = ProfiledTiming.fit(profile)
    >>> round(model.first_token_ms(256), 1), round(model.decode_ms(batch=8, kv_tokens=800, kv_load=0.0), 1)
    (6.0, 1.6)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigError

__all__ = ["PolynomialTiming", "ProfiledTiming", "TimingModel", "TimingProfile", "timing_model"]

PREFILL_FOLDER = "selected_prefill_interpolation"
DECODE_FOLDER = "selected_decode_interpolation"
RAW_DATA = "raw_data.npz"
MOCKER_NPZ = "perf_data.npz"
KIT_EXTRAS = "kit_profile.json"  # what Dynamo's layout has no place for
FLOOR_MS = 0.1


class TimingModel(Protocol):
    """What a mocker step costs: its prefill part and its decode part, in milliseconds."""

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float: ...

    def step_prefill_ms(self, chunks: Sequence[tuple[int, int]]) -> float:
        """A step's prefill of ``chunks``, each ``(tokens computed before, new tokens)``."""
        ...

    def decode_ms(self, *, batch: int, kv_tokens: int, kv_load: float) -> float: ...


class PolynomialTiming:
    """Dynamo's mocker's built-in curves (see the module docstring): decode reads only the KV load."""

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        if uncached_tokens <= 0:
            return 0.0
        t = float(uncached_tokens)
        return 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142

    def step_prefill_ms(self, chunks: Sequence[tuple[int, int]]) -> float:
        """Dynamo's mocker's count: the step's tokens, ``B·(Σ(prefix + chunk)//B − Σprefix//B)``
        for B chunks, as one prompt (after the chunks' computed tokens).

        Example:
            >>> PolynomialTiming().step_prefill_ms([(0, 100), (0, 100)]) == PolynomialTiming().prefill_ms(200)
            True
        """
        if not chunks:
            return 0.0
        batch = len(chunks)
        prefix = sum(done for done, _ in chunks)
        total = prefix + sum(tokens for _, tokens in chunks)
        return self.prefill_ms(batch * (total // batch - prefix // batch), prefix)

    def decode_ms(self, *, batch: int, kv_tokens: int, kv_load: float) -> float:
        return max(-25.74 * kv_load * kv_load + 54.01 * kv_load + 5.74, 1.0)

    def __repr__(self) -> str:
        return "PolynomialTiming(Dynamo's default curves)"


@dataclass
class TimingProfile:
    """An engine's measured step times (see the module docstring).

    Attributes:
        prefill: ``(input tokens, prefill ms)`` per measurement, nothing cached.
        decode: ``(batch size, context length, ms per decode step)`` per measurement.
        prefill_after_prefix: ``(cached tokens, new tokens, prefill ms)`` per measurement of a
            prompt whose prefix was cached (kept in ``kit_profile.json``: Dynamo's layout has none).
        max_kv_tokens: the KV capacity Dynamo's format expresses the decode load against.
        request_overhead_ms: a request's time between the client and the engine (HTTP, the
            frontend, the request plane), for `dynamo_nb.replay.Fleet`'s ``overhead_ms``; kept
            in ``kit_profile.json`` beside Dynamo's files.
        source: where it was measured or read (shown, not used).
    """

    prefill: list[tuple[int, float]] = field(default_factory=list)
    decode: list[tuple[int, float, float]] = field(default_factory=list)
    prefill_after_prefix: list[tuple[int, int, float]] = field(default_factory=list)
    max_kv_tokens: int = 262144
    request_overhead_ms: float = 0.0
    source: str = ""

    def write(self, folder: str | Path) -> Path:
        """Write Dynamo's profile-data folder (both ``raw_data.npz``); returns ``folder``."""
        import numpy as np

        model = ProfiledTiming.fit(self)  # refuses a profile too small to fit before anything is written
        root = Path(folder)
        (root / PREFILL_FOLDER).mkdir(parents=True, exist_ok=True)
        (root / DECODE_FOLDER).mkdir(parents=True, exist_ok=True)
        isl = np.array([tokens for tokens, _ in self.prefill], dtype=float)
        ttft = np.array([ms for _, ms in self.prefill], dtype=float)
        np.savez(root / PREFILL_FOLDER / RAW_DATA, prefill_isl=isl, prefill_ttft=ttft,
                 prefill_thpt_per_gpu=isl / ttft * 1000.0)  # fmt: skip
        batch = np.array([b for b, _, _ in self.decode], dtype=float)
        context = np.array([c for _, c, _ in self.decode], dtype=float)
        itl = np.array([ms for _, _, ms in self.decode], dtype=float)
        np.savez(root / DECODE_FOLDER / RAW_DATA, x_kv_usage=batch * context / self.max_kv_tokens,
                 y_context_length=context, z_itl=itl, z_thpt_per_gpu=batch / itl * 1000.0,
                 max_kv_tokens=np.array([self.max_kv_tokens]))  # fmt: skip
        model.write_mocker_npz(root / MOCKER_NPZ)
        extras = {
            "request_overhead_ms": self.request_overhead_ms,
            "prefill_after_prefix": self.prefill_after_prefix,
        }
        (root / KIT_EXTRAS).write_text(json.dumps(extras) + "\n")
        return root

    @classmethod
    def read(cls, folder: str | Path) -> TimingProfile:
        """Read a profile-data folder, ours or Dynamo's (its npz files or its JSON variant).

        Raises:
            ConfigError: the folder holds neither layout, naming what it looked for.
        """
        root = Path(folder)
        prefill = _arrays(root, PREFILL_FOLDER, "prefill_raw_data.json", ("prefill_isl", "prefill_ttft"))
        decode = _arrays(root, DECODE_FOLDER, "decode_raw_data.json",
                         ("x_kv_usage", "y_context_length", "z_itl", "max_kv_tokens"))  # fmt: skip
        max_kv = int(_scalar(decode["max_kv_tokens"]))
        points = []
        for usage, context, itl in zip(
            decode["x_kv_usage"], decode["y_context_length"], decode["z_itl"], strict=True
        ):
            batch = max(1, round(float(usage) * max_kv / float(context))) if float(context) > 0 else 1
            points.append((batch, float(context), float(itl)))
        extras = json.loads((root / KIT_EXTRAS).read_text()) if (root / KIT_EXTRAS).is_file() else {}
        return cls(
            prefill=[
                (int(t), float(ms))
                for t, ms in zip(prefill["prefill_isl"], prefill["prefill_ttft"], strict=True)
            ],
            decode=points,
            max_kv_tokens=max_kv,
            request_overhead_ms=float(extras.get("request_overhead_ms", 0.0)),
            prefill_after_prefix=[
                (int(p), int(t), float(ms)) for p, t, ms in extras.get("prefill_after_prefix", [])
            ],
            source=str(root),
        )


@dataclass(frozen=True)
class ProfiledTiming:
    """Step times fitted to a `TimingProfile` (see the module docstring).

    Attributes:
        prefill_coefficients: ``(a, b, c)`` of ``a·T² + b·T + c`` ms.
        decode_coefficients: ``(d₀, d₁, d₂)`` of the plane ``d₀ + d₁·batch + d₂·kv_tokens`` ms
            (what a profile whose points are not a grid is given; shown for every profile).
        profile: the points it was fitted to (for residuals and charts).
        prefix_coefficients: ``(q, r)`` of the cached prefix's ``q·P + r·P·T`` ms ((0, 0): not measured).
        decode_grid: ``(batches, contexts, ms[batch][context])`` the decode steps are
            interpolated on (None: the points are not a grid, the plane is used).
    """

    prefill_coefficients: tuple[float, float, float]
    decode_coefficients: tuple[float, float, float]
    profile: TimingProfile
    decode_grid: tuple[tuple[float, ...], tuple[float, ...], tuple[tuple[float, ...], ...]] | None = None
    prefix_coefficients: tuple[float, float] = (0.0, 0.0)

    @classmethod
    def fit(cls, profile: TimingProfile) -> ProfiledTiming:
        """Decode on the points' grid (or a plane by least squares), then prefill by least
        squares (quadratic, then the cached prefix's terms) on what each measured first token took
        beyond a decode step of one sequence: a mocker step that finishes a prompt also runs its
        first token's decode, so a replayed first token on an idle engine takes what was measured."""
        import numpy as np

        if len(profile.prefill) < 3 or len(profile.decode) < 3:
            raise ConfigError("a profile needs at least 3 prefill and 3 decode measurements to be fitted")
        decode = cls.fit_decode(profile)
        tokens = np.array([t for t, _ in profile.prefill], dtype=float)
        prefill_ms = np.array([ms - decode.first_decode_ms(t) for t, ms in profile.prefill], dtype=float)
        a, b, c = np.linalg.lstsq(np.stack([tokens**2, tokens, np.ones_like(tokens)], axis=1), prefill_ms,
                                  rcond=None)[0]  # fmt: skip
        prefix = (0.0, 0.0)
        if len(profile.prefill_after_prefix) >= 2:  # what the prefix adds over the same tokens uncached
            cached = np.array([p for p, _, _ in profile.prefill_after_prefix], dtype=float)
            new = np.array([t for _, t, _ in profile.prefill_after_prefix], dtype=float)
            beyond = [ms - decode.first_decode_ms(p + t) for p, t, ms in profile.prefill_after_prefix]
            added = np.array(beyond) - (a * new**2 + b * new + c)
            q, r = np.linalg.lstsq(np.stack([cached, cached * new], axis=1), added, rcond=None)[0]
            prefix = (float(q), float(r))
        return replace(
            decode, prefill_coefficients=(float(a), float(b), float(c)), prefix_coefficients=prefix
        )

    @classmethod
    def fit_decode(cls, profile: TimingProfile) -> ProfiledTiming:
        """The decode part alone (its prefill 0): on the points' grid, or a plane by least squares."""
        import numpy as np

        if len(profile.decode) < 3:
            raise ConfigError("a profile needs at least 3 decode measurements to be fitted")
        batch = np.array([b for b, _, _ in profile.decode], dtype=float)
        kv_tokens = batch * np.array([c for _, c, _ in profile.decode], dtype=float)
        step_ms = np.array([ms for _, _, ms in profile.decode], dtype=float)
        d = np.linalg.lstsq(np.stack([np.ones_like(batch), batch, kv_tokens], axis=1), step_ms, rcond=None)[0]
        return cls((0.0, 0.0, 0.0), (float(d[0]), float(d[1]), float(d[2])), profile, _grid(profile.decode))

    def first_decode_ms(self, prompt_tokens: int) -> float:
        """The decode part of the step that ends a ``prompt_tokens`` prompt alone."""
        return self.decode_ms(batch=1, kv_tokens=prompt_tokens, kv_load=0.0)

    def first_token_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        """A prompt's first token on an idle engine, prefill and its step's decode (what
        `dynamo_nb.bench.profile` measures)."""
        return self.prefill_ms(uncached_tokens, cached_tokens) + self.first_decode_ms(
            uncached_tokens + cached_tokens
        )

    def prefill_ms(self, uncached_tokens: int, cached_tokens: int = 0) -> float:
        return self.step_prefill_ms([(cached_tokens, uncached_tokens)])

    def step_prefill_ms(self, chunks: Sequence[tuple[int, int]]) -> float:
        """Each chunk's ``a·T² + b·T + q·P + r·P·T`` (T its new tokens, P those computed before it),
        summed, and ``c`` once: an engine computes each prompt's attention over its own tokens.

        Example:
            >>> model = ProfiledTiming((1e-4, 0.02, 1.0), (1.0, 0.1, 0.0), TimingProfile())
            >>> model.prefill_ms(100), model.step_prefill_ms([(0, 100), (0, 100)]), model.prefill_ms(200)
            (4.0, 7.0, 9.0)
        """
        if not chunks:
            return 0.0
        a, b, c = self.prefill_coefficients
        q, r = self.prefix_coefficients
        total = c
        for done, tokens in chunks:
            t, p = float(tokens), float(done)
            total += a * t * t + b * t + q * p + r * p * t
        return max(total, FLOOR_MS) if any(tokens > 0 for _, tokens in chunks) else 0.0

    def decode_ms(self, *, batch: int, kv_tokens: int, kv_load: float) -> float:
        if self.decode_grid is not None:
            batches, contexts, ms = self.decode_grid
            context = kv_tokens / batch if batch else 0.0
            i, u = _segment(batches, float(batch))
            j, v = _segment(contexts, context)
            low = ms[i][j] + v * (ms[i][j + 1] - ms[i][j])
            high = ms[i + 1][j] + v * (ms[i + 1][j + 1] - ms[i + 1][j])
            return max(low + u * (high - low), FLOOR_MS)
        d0, d1, d2 = self.decode_coefficients
        return max(d0 + d1 * batch + d2 * kv_tokens, FLOOR_MS)

    def write_mocker_npz(self, path: str | Path, resolution: int = 100) -> Path:
        """The fitted model as the lookup tables Dynamo's mocker reads from one file
        (``--planner-profile-data FILE.npz``: ``prefill_isl``, ``prefill_ttft_ms``,
        ``decode_active_kv_tokens``, ``decode_context_length``, ``decode_itl[kv, context]``), over
        the measured ranges. Dynamo 1.6.1 turns a profile folder into this itself only where its
        planner's packages (aisimulate) install, which they do not on Python ≥ 3.11."""
        import numpy as np

        isl = np.linspace(
            min(t for t, _ in self.profile.prefill), max(t for t, _ in self.profile.prefill), resolution
        )
        max_kv = max(b * c for b, c, _ in self.profile.decode)
        kv_tokens = np.linspace(0.0, max_kv, resolution)
        context = np.linspace(1.0, max(c for _, c, _ in self.profile.decode), resolution)
        itl = np.array([[self.decode_ms(batch=max(1, round(kv / ctx)), kv_tokens=round(kv), kv_load=0.0)
                         for ctx in context] for kv in kv_tokens])  # fmt: skip
        np.savez(Path(path), prefill_isl=isl, prefill_ttft_ms=np.array([self.prefill_ms(round(t)) for t in isl]),
                 decode_active_kv_tokens=kv_tokens, decode_context_length=context, decode_itl=itl)  # fmt: skip
        return Path(path)

    def residuals(self) -> dict[str, list[float]]:
        """Each measured point's error in percent of the measurement: ``prefill`` and ``decode``.
        On a decode grid, which passes through its points, each point is predicted from the
        others (left out, interpolated or extrapolated along the batch axis from its neighbours):
        how far a batch size between those measured may be off."""
        prefill = [100.0 * (self.first_token_ms(t) - ms) / ms for t, ms in self.profile.prefill]
        prefill += [
            100.0 * (self.first_token_ms(t, p) - ms) / ms for p, t, ms in self.profile.prefill_after_prefix
        ]
        checks = zip(self.decode_checks(), self.profile.decode, strict=True)
        decode = [100.0 * (predicted - ms) / ms for predicted, (_, _, ms) in checks]
        return {"prefill": prefill, "decode": decode}

    def decode_checks(self) -> list[float]:
        """What the model predicts for each measured decode point, in the profile's order: on a
        grid of 3 or more batch sizes, from the other points (left out, interpolated or
        extrapolated along the batch axis), since the grid passes through each; else the fit."""
        if self.decode_grid is None or len(self.decode_grid[0]) < 3:
            return [
                self.decode_ms(batch=b, kv_tokens=round(b * c), kv_load=0.0)
                for b, c, _ in self.profile.decode
            ]
        batches, contexts, ms = self.decode_grid
        predictions = []
        for batch, context, _ in self.profile.decode:
            i, j = batches.index(float(batch)), contexts.index(float(context))
            column = [ms[row][j] for row in range(len(batches)) if row != i]
            k, u = _segment(batches[:i] + batches[i + 1 :], float(batch))
            predictions.append(column[k] + u * (column[k + 1] - column[k]))
        return predictions

    def __repr__(self) -> str:
        a, b, c = self.prefill_coefficients
        d0, d1, d2 = self.decode_coefficients
        q, r = self.prefix_coefficients
        prefill = _sum_of_terms([(a, "T²"), (b, "T"), (c, ""), (q, "P"), (r, "P·T")])
        engine = _sum_of_terms([(d0, ""), (d1, "batch"), (d2, "kv_tokens")])
        if self.decode_grid is not None:
            batches, contexts, _ = self.decode_grid
            decode = (f"on a {len(batches)}×{len(contexts)} grid, batch {batches[0]:g}–{batches[-1]:g} × context "
                      f"{contexts[0]:g}–{contexts[-1]:g} (a plane: {engine})")  # fmt: skip
        else:
            decode = engine
        where = "T new prompt tokens" + (", P computed before them" if (q, r) != (0.0, 0.0) else "")
        return (
            f"ProfiledTiming(prefill {prefill} ms ({where}), "
            f"decode {decode} ms; {self.profile.source or 'measured'})"
        )


def _sum_of_terms(terms: list[tuple[float, str]]) -> str:
    """``a·x + b·y − c``: each nonzero coefficient (3 significant digits) beside its variable, a
    negative one after a minus sign, not ``+ -``."""
    text = ""
    for coefficient, variable in terms:
        if coefficient == 0.0:
            continue
        term = f"{abs(coefficient):.3g}" + (f"·{variable}" if variable else "")
        if text:
            text += (" − " if coefficient < 0 else " + ") + term
        else:
            text = ("-" if coefficient < 0 else "") + term
    return text or "0"


def _grid(
    points: list[tuple[int, float, float]],
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[tuple[float, ...], ...]] | None:
    """The decode points as a full grid of ≥ 2 batch sizes × ≥ 2 contexts (None: they are not one)."""
    batches = tuple(sorted({float(b) for b, _, _ in points}))
    contexts = tuple(sorted({float(c) for _, c, _ in points}))
    by_point = {(float(b), float(c)): ms for b, c, ms in points}
    if len(batches) < 2 or len(contexts) < 2 or len(by_point) != len(batches) * len(contexts):
        return None
    return batches, contexts, tuple(tuple(by_point[(b, c)] for c in contexts) for b in batches)


def _segment(edges: tuple[float, ...], x: float) -> tuple[int, float]:
    """The segment of ``edges`` that ``x`` falls in (the first or last one beyond them) and where
    in it (0 at its start, 1 at its end; below 0 or above 1 beyond the edges: linear extrapolation)."""
    index = 0
    while index < len(edges) - 2 and x > edges[index + 1]:
        index += 1
    return index, (x - edges[index]) / (edges[index + 1] - edges[index])


_LOADED: dict[tuple[str, int], TimingModel] = {}


def timing_model(planner_profile_data: str | Path | None) -> TimingModel:
    """The timing model a mocker uses: Dynamo's curves (None), or fitted to the profile folder
    (read once per process while its files are unchanged: a profile written again is read again)."""
    if planner_profile_data is None:
        return PolynomialTiming()
    root = Path(planner_profile_data).resolve()
    written = max((path.stat().st_mtime_ns for path in root.rglob("*") if path.is_file()), default=0)
    key = (str(root), written)
    if key not in _LOADED:
        _LOADED[key] = ProfiledTiming.fit(TimingProfile.read(root))
    return _LOADED[key]


def _arrays(root: Path, folder: str, json_name: str, keys: tuple[str, ...]) -> dict[str, Any]:
    npz, as_json = root / folder / RAW_DATA, root / json_name
    if npz.is_file():
        import numpy as np

        with np.load(npz) as data:
            missing = [key for key in keys if key not in data]
            found = {key: data[key].tolist() for key in keys if key in data}
    elif as_json.is_file():
        loaded = json.loads(as_json.read_text())
        missing = [key for key in keys if key not in loaded]
        found = {key: loaded[key] for key in keys if key in loaded}
    else:
        raise ConfigError(
            f"{root}: no profile data: expected {folder}/{RAW_DATA} or {json_name} (Dynamo's profile-data "
            "layout, as bench.profile and Dynamo's profiler write it)"
        )
    if missing:
        raise ConfigError(f"{root}: the profile data lacks {', '.join(missing)}")
    return found


def _scalar(value: Any) -> float:
    return float(value[0] if isinstance(value, list) else value)
