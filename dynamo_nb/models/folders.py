"""Which model folder a program serves, and under what name: a local Hugging Face folder
checked (`check_model_dir`), or the built-in tiny model (`model_folder`). One rule for the
workers' ``--model-path``/``--model-name``, the frontend's static mode and `use_model`.

Example:
    >>> path, name = ModelChoice().folder()
    >>> name, (path / "tokenizer.json").is_file()
    ('tiny-llama', True)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..settings import Settings, setting

__all__ = ["ModelChoice", "check_model_dir", "model_folder"]


def check_model_dir(model_path: str | Path, flag: str = "model_path") -> Path:
    """``model_path`` as a folder with a fast tokenizer, or a `ConfigError` that says what to fix
    (naming ``flag``).

    Example:
        >>> check_model_dir("/no/such/folder")
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: model_path '/no/such/folder' is not a directory: ...
    """
    folder = Path(model_path).expanduser()
    if not str(model_path).strip():
        raise ConfigError(f"{flag} is empty: give a local Hugging Face model folder")
    if not folder.is_dir():
        raise ConfigError(
            f"{flag} '{model_path}' is not a directory: give a local Hugging Face model folder "
            "(model hubs are not contacted), or leave it out for the built-in tiny model"
        )
    if not (folder / "tokenizer.json").is_file():
        raise ConfigError(
            f"{flag} '{model_path}' holds no tokenizer.json: the frontend needs a fast tokenizer; "
            "save one with AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)"
        )
    return folder.resolve()


def model_folder(
    model_path: str | Path | None,
    model_name: str | None,
    *,
    flags: tuple[str, str] = ("--model-path", "--model-name"),
) -> tuple[Path, str]:
    """The model folder and served name ``model_path`` and ``model_name`` give: the built-in
    tiny model (built on first use) and ``tiny-llama`` when the path is None, else the folder
    (checked) named after itself unless ``model_name`` is set; errors name ``flags``.

    Example:
        >>> model_folder("/no/such", None)
        Traceback (most recent call last):
        ...
        dynamo_nb.errors.ConfigError: --model-path '/no/such' is not a directory: ...
    """
    path_flag, name_flag = flags
    if model_path is None:
        from .tiny_model import TINY_MODEL_NAME, tiny_model_path

        path, default_name = tiny_model_path(), TINY_MODEL_NAME
    else:
        path = check_model_dir(model_path, flag=path_flag)
        default_name = path.name
    if model_name is None:
        return path, default_name
    if not model_name.strip():
        raise ConfigError(f"{name_flag} is empty: give a name such as tiny-llama, or leave the flag out")
    return path, model_name


@dataclass(frozen=True)
class ModelChoice(Settings):
    """A worker's ``--model-path`` and ``--model-name`` (each defaulting from its ``DYN_NB_*``
    variable): which folder it serves, under what name.

    Example:
        >>> import argparse
        >>> from dynamo_nb.settings import add_settings
        >>> parser = argparse.ArgumentParser()
        >>> add_settings(parser, ModelChoice)
        >>> ModelChoice.from_args(parser.parse_args(["--model-name", "mine"])).folder()[1]
        'mine'
    """

    model_path: str | None = setting(
        None,
        flag="--model-path",
        env="MODEL_PATH",
        default_text="the built-in tiny model",
        help="local Hugging Face model folder",
    )
    model_name: str | None = setting(
        None,
        flag="--model-name",
        env="MODEL_NAME",
        default_text="the folder's name, tiny-llama for the built-in model",
        help="name the model is served as",
    )

    def folder(self) -> tuple[Path, str]:
        """The folder and served name (`model_folder`: the tiny model when no path is given)."""
        return model_folder(self.model_path, self.model_name)
