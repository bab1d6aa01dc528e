"""How long a mocker step takes: Dynamo's built-in curves, or a model fitted to an engine you measured.

- `PolynomialTiming`: Dynamo's mocker's default (its polynomial model, fitted on a GPU you may
  not have): prefill ``4.209989e-7·T² + 1.518344e-2·T + 16.50142`` ms for T uncached prompt
  tokens in the step, decode ``max(-25.74·p² + 54.01·p + 5.74, 1)`` ms at KV load p.
- `ProfiledTiming`: fitted by least squares to a `TimingProfile` measured on a live engine
  (`dynamo_nb.bench.profile`): prefill ``a·T² + b·T + c`` ms (the shape Dynamo's profiler fits
  its prefill curve with), decode ``d₀ + d₁·batch + d₂·kv_tokens`` ms (a cost per step, per running
  sequence and per KV token its attention reads), each floored at 0.1 ms.
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
    >>> round(model.prefill_ms(256), 1), round(model.decode_ms(batch=8, kv_tokens=800, kv_load=0.0), 1)
    (6.0, 1.6)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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

    def prefill_ms(self, uncached_tokens: int) -> float: ...

    def decode_ms(self, *, batch: int, kv_tokens: int, kv_load: float) -> float: ...


class PolynomialTiming:
    """Dynamo's mocker's built-in curves (see the module docstring): decode reads only the KV load."""

    def prefill_ms(self, uncached_tokens: int) -> float:
        if uncached_tokens <= 0:
            return 0.0
        t = float(uncached_tokens)
        return 4.209989e-7 * t * t + 1.518344e-2 * t + 16.50142

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
        max_kv_tokens: the KV capacity Dynamo's format expresses the decode load against.
        request_overhead_ms: a request's time between the client and the engine (HTTP, the
            frontend, the request plane), for `dynamo_nb.replay.Fleet`'s ``overhead_ms``; kept
            in ``kit_profile.json`` beside Dynamo's files.
        source: where it was measured or read (shown, not used).
    """

    prefill: list[tuple[int, float]] = field(default_factory=list)
    decode: list[tuple[int, float, float]] = field(default_factory=list)
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
        (root / KIT_EXTRAS).write_text(json.dumps({"request_overhead_ms": self.request_overhead_ms}) + "\n")
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
            source=str(root),
        )


@dataclass(frozen=True)
class ProfiledTiming:
    """Step times fitted to a `TimingProfile` (see the module docstring).

    Attributes:
        prefill_coefficients: ``(a, b, c)`` of ``a·T² + b·T + c`` ms.
        decode_coefficients: ``(d₀, d₁, d₂)`` of ``d₀ + d₁·batch + d₂·kv_tokens`` ms.
        profile: the points it was fitted to (for residuals and charts).
    """

    prefill_coefficients: tuple[float, float, float]
    decode_coefficients: tuple[float, float, float]
    profile: TimingProfile

    @classmethod
    def fit(cls, profile: TimingProfile) -> ProfiledTiming:
        """Least squares over the profile's points (prefill quadratic, decode linear)."""
        import numpy as np

        if len(profile.prefill) < 3 or len(profile.decode) < 3:
            raise ConfigError("a profile needs at least 3 prefill and 3 decode measurements to be fitted")
        tokens = np.array([t for t, _ in profile.prefill], dtype=float)
        prefill_ms = np.array([ms for _, ms in profile.prefill], dtype=float)
        a, b, c = np.linalg.lstsq(np.stack([tokens**2, tokens, np.ones_like(tokens)], axis=1), prefill_ms,
                                  rcond=None)[0]  # fmt: skip
        batch = np.array([b for b, _, _ in profile.decode], dtype=float)
        kv_tokens = batch * np.array([c for _, c, _ in profile.decode], dtype=float)
        step_ms = np.array([ms for _, _, ms in profile.decode], dtype=float)
        d = np.linalg.lstsq(np.stack([np.ones_like(batch), batch, kv_tokens], axis=1), step_ms, rcond=None)[0]
        return cls((float(a), float(b), float(c)), (float(d[0]), float(d[1]), float(d[2])), profile)

    def prefill_ms(self, uncached_tokens: int) -> float:
        if uncached_tokens <= 0:
            return 0.0
        a, b, c = self.prefill_coefficients
        t = float(uncached_tokens)
        return max(a * t * t + b * t + c, FLOOR_MS)

    def decode_ms(self, *, batch: int, kv_tokens: int, kv_load: float) -> float:
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
        """Each measured point's error in percent of the measurement: ``prefill`` and ``decode``."""
        prefill = [100.0 * (self.prefill_ms(t) - ms) / ms for t, ms in self.profile.prefill]
        decode = [
            100.0 * (self.decode_ms(batch=b, kv_tokens=round(b * c), kv_load=0.0) - ms) / ms
            for b, c, ms in self.profile.decode
        ]
        return {"prefill": prefill, "decode": decode}

    def __repr__(self) -> str:
        a, b, c = self.prefill_coefficients
        d0, d1, d2 = self.decode_coefficients
        return (
            f"ProfiledTiming(prefill {a:.3g}·T² + {b:.3g}·T + {c:.3g} ms, "
            f"decode {d0:.3g} + {d1:.3g}·batch + {d2:.3g}·kv_tokens ms; {self.profile.source or 'measured'})"
        )


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
