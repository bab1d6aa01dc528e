"""One parameter for the model the LLM notebooks serve: a local Hugging Face folder and a device.

A notebook's parameters cell sets ``MODEL_PATH`` and ``DEVICE`` and calls `use_model`. ``None``
falls back to the environment (``DYN_NB_MODEL_PATH``, ``DYN_NB_DEVICE``), then to the built-in
tiny model on ``auto`` (CUDA when present, else the CPU). `use_model` checks the folder, and
exports the choice to the environment so that every worker the notebook launches (its own
processes, a graph's components) serves the same model on the same device, since each
component's ``--model-path``/``--model-name``/``--device`` default to those variables.

Example::

    MODEL_PATH = None  # or "/models/Qwen3-0.6B"
    DEVICE = None  # or "cuda"
    MODEL = use_model(MODEL_PATH, DEVICE)
    body = {"model": MODEL.name, "prompt": "Hello", "max_tokens": 8}
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .folders import model_folder

__all__ = ["ModelChoice", "use_model"]

_DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class ModelChoice:
    """The model folder, the name it is served as, and the device of the hf engine.

    Example:
        >>> from dynamo_nb.models import tiny_model_path
        >>> choice = ModelChoice(tiny_model_path(), "tiny-llama", "cpu")
        >>> choice.flags()[2:]
        ['--model-name', 'tiny-llama']
    """

    path: Path
    name: str
    device: str

    def flags(self) -> list[str]:
        """``--model-path`` and ``--model-name``: the model flags of every engine worker."""
        return ["--model-path", str(self.path), "--model-name", self.name]

    def env(self) -> dict[str, str]:
        """The environment variables the components read these flags' defaults from."""
        return {
            "DYN_NB_MODEL_PATH": str(self.path),
            "DYN_NB_MODEL_NAME": self.name,
            "DYN_NB_DEVICE": self.device,
        }


def _device(device: str | None) -> str:
    value = (device or os.environ.get("DYN_NB_DEVICE") or "auto").strip()
    if value.split(":")[0] not in _DEVICES:
        raise ConfigError(
            f"DEVICE {value!r} is not a device: use auto, cpu, cuda or cuda:N (env DYN_NB_DEVICE)"
        )
    return value


def _folder(path: str | Path | None) -> str | None:
    """A model folder as a string, None for the built-in tiny model (named tiny-llama)."""
    from .tiny_model import tiny_model_path

    if path is None or Path(path).resolve() == tiny_model_path().resolve():
        return None
    return str(path)


def use_model(model_path: str | Path | None = None, device: str | None = None) -> ModelChoice:
    """The model (and device) this notebook serves, exported to the environment of the
    processes it launches: ``model_path`` or ``$DYN_NB_MODEL_PATH`` or the built-in tiny model,
    ``device`` or ``$DYN_NB_DEVICE`` or ``auto``. The served name is ``$DYN_NB_MODEL_NAME``, else
    the folder's name (``tiny-llama`` for the built-in model).

    Example:
        >>> use_model("/no/such/folder")
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: MODEL_PATH '/no/such/folder' is not a directory: ...
    """
    exported = _folder(os.environ.get("DYN_NB_MODEL_PATH") or None)
    chosen = exported if model_path is None else _folder(model_path)
    # the exported name goes with the exported folder, not with another one given here
    name = (os.environ.get("DYN_NB_MODEL_NAME") or None) if chosen == exported else None
    path, served = model_folder(chosen, name, flags=("MODEL_PATH", "MODEL_NAME"))
    choice = ModelChoice(Path(path), served, _device(device))
    os.environ.update(choice.env())
    return choice
