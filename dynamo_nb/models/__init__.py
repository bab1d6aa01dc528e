"""Models that need no download: the built-in tiny model (a small Llama trained by this project
on the standard library's docstrings, shipped in the package) and a random-weight model that
tests use (built on first use); and `use_model`, the one parameter that points the LLM notebooks
at a local Hugging Face folder and a device.

- ``tiny_model.py``: `tiny_model_path`, the built-in tiny model (shipped in ``tiny_llama/``);
- ``random_model.py``: `random_model_path`, the random-weight model, and the tokenizer and config
  recipe it shares with the tiny model's training;
- ``folders.py``: `model_folder` and `check_model_dir`, which folder a program serves and under
  what name (one rule for the workers, the frontend's static mode and `use_model`);
- ``choice.py``: `use_model` and `ModelChoice`, the model folder and device the LLM notebooks serve.

Example:
    >>> from dynamo_nb.models import tiny_model_path
    >>> path = tiny_model_path()
    >>> (path / "config.json").is_file(), (path / "tokenizer.json").is_file()
    (True, True)
"""

from __future__ import annotations

from .choice import ModelChoice, use_model
from .random_model import RANDOM_MODEL_NAME, random_model_path
from .tiny_model import TINY_MODEL_NAME, tiny_model_path

__all__ = [
    "RANDOM_MODEL_NAME",
    "TINY_MODEL_NAME",
    "ModelChoice",
    "random_model_path",
    "tiny_model_path",
    "use_model",
]
