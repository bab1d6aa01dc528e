"""Settings declared once: a typed config's field carries its command-line flag, its help, its
``DYN_NB_*`` environment variable and its check, as vLLM's ``EngineArgs`` keeps each flag beside
its field. From the fields alone a parser gets the flags (`add_settings`), a namespace becomes
the config (`Settings.from_args`) and every value is checked once, however the config was made
(`Settings.__post_init__`): from flags, in a cell, or by `dataclasses.replace`.

A config is a frozen dataclass deriving from `Settings`; a field that is a flag is made with
`setting`, a field that holds another config with `nested`. The flag's type is the field's
(``int``, ``float``, ``str``; ``X | None`` takes an ``X`` and defaults to None; a ``bool`` is a
switch, ``bool | None`` a ``--x/--no-x`` pair). Its help ends with the variable and the default.
A flag given on the command line wins over its variable, the variable over the field's default.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Probe(Settings):
    ...     retries: int = setting(3, flag="--probe-retries", env="PROBE_RETRIES",
    ...                            help="tries before a probe fails", check=at_least(1))
    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> add_settings(parser, Probe)
    >>> Probe.from_args(parser.parse_args(["--probe-retries", "5"])).retries
    5
    >>> Probe(retries=0)
    Traceback (most recent call last):
    ...
    dynamo_nb.errors.ConfigError: retries (--probe-retries) must be at least 1, got 0
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from .errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "Setting",
    "Settings",
    "add_settings",
    "at_least",
    "env_default",
    "greater_than",
    "nested",
    "redefault",
    "setting",
    "settings_of",
]

ENV_PREFIX = "DYN_NB_"

Check = Callable[[Any], "str | None"]
"""A value's problem in words (``"must be at least 1"``), or None when it is fine."""

S = TypeVar("S", bound="Settings")

_SETTING = "dynamo_nb.setting"
_NESTED = "dynamo_nb.nested"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class Setting:
    """What a config field is on the command line (see `setting` for each part)."""

    flag: str
    help: str
    env: str | None = None
    default_text: str | None = None
    check: Check | None = None
    choices: tuple[Any, ...] | None = None
    metavar: str | None = None
    negate: bool = False
    aliases: tuple[str, ...] = ()
    group: str | None = None
    hidden: bool = False
    both_ways: bool = False

    @property
    def dest(self) -> str:
        """Where argparse keeps the flag's value: the flag's name (``--http-port``: ``http_port``)."""
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def env_name(self) -> str | None:
        """The environment variable (``DYN_NB_`` and `env`), None if it has none."""
        return None if self.env is None else ENV_PREFIX + self.env

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` (not one of `choices`, or what `check` says), or None."""
        if value is None:
            return None
        if self.choices is not None and value not in self.choices:
            return "must be one of " + ", ".join(str(choice) for choice in self.choices)
        return self.check(value) if self.check is not None else None


def setting(
    default: Any = dataclasses.MISSING,
    *,
    flag: str,
    help: str,
    env: str | None = None,
    default_text: str | None = None,
    check: Check | None = None,
    choices: tuple[Any, ...] | None = None,
    metavar: str | None = None,
    negate: bool = False,
    aliases: tuple[str, ...] = (),
    group: str | None = None,
    hidden: bool = False,
    both_ways: bool = False,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A config field that is also a command-line flag.

    Args:
        default: the field's default (also the flag's, unless ``env`` is set); ``factory``
            for a mutable one.
        flag: ``--the-flag``; parsed, its value is ``args.the_flag`` (`Setting.dest`), and
            `Settings.from_args` puts it in this field.
        help: what it does, without the default (added: ``(env DYN_NB_X; default: …)``).
        env: the ``DYN_NB_`` variable that gives the default (``"HTTP_PORT"``), None for none.
        default_text: the default in words where its value says little (``"off"``).
        check: the value's problem in words or None (`at_least`, `greater_than`); run once,
            on every config made, with the message naming the field and the flag.
        choices: the values allowed (checked from Python too).
        metavar, group, hidden: how ``--help`` shows it (its group's title; hidden: not at all).
        negate: the field is the switch's opposite (``--no-kv-events`` sets ``use_kv_events``
            False).
        aliases: older spellings of the flag; two spellings with two values are refused.
        both_ways: a ``bool`` switch with its ``--no-`` twin (``--enable-x``/``--no-enable-x``).
    """
    spec = Setting(
        flag, help, env, default_text, check, choices, metavar, negate, aliases, group, hidden, both_ways
    )
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={_SETTING: spec})
    return dataclasses.field(default=default, metadata={_SETTING: spec})


def nested(factory: Callable[[], Any]) -> Any:
    """A config field holding another `Settings` config, whose flags the parser gets too.

    Example::

        kv: KvRouterConfig = nested(KvRouterConfig)
    """
    return dataclasses.field(default_factory=factory, metadata={_NESTED: True})


def redefault(cls: type[Settings], name: str, default: Any) -> Any:
    """The field ``name`` of ``cls`` again, its flag, help and check as declared there, with
    another ``default``: for a subclass whose engine defaults differently.

    Example::

        class MockerSettings(EngineLimits):
            max_num_seqs: int = redefault(EngineLimits, "max_num_seqs", 256)
    """
    item = next((item for item in dataclasses.fields(cls) if item.name == name), None)  # type: ignore[arg-type]  # a Settings is a dataclass
    if item is None or _SETTING not in item.metadata:
        raise TypeError(f"{cls.__name__} has no setting {name!r}")
    return dataclasses.field(default=default, metadata=item.metadata)


def env_default(name: str, default: str | None) -> str | None:
    """The ``DYN_NB_<name>`` variable's value, else ``default``: a flag's default where the flag
    is still written by hand (a `setting` reads its own).

    Example:
        >>> env_default("NO_SUCH_SETTING", "auto")
        'auto'
    """
    return os.environ.get(ENV_PREFIX + name, default)


def at_least(low: float, words: str | None = None) -> Check:
    """A check: the value is ``low`` or more (``words``: how to say ``low``, ``"0 (off)"``)."""
    said = words or f"{low:g}"
    return lambda value: None if value >= low else f"must be at least {said}"


def greater_than(low: float, unit: str = "") -> Check:
    """A check: the value is more than ``low`` (``unit``: ``"seconds"``)."""
    said = f"{low:g} {unit}".strip()
    return lambda value: None if value > low else f"must be more than {said}"


class Settings:
    """The base of a config whose fields are declared with `setting` and `nested`: it checks
    every field once when the config is made, and builds itself from parsed flags."""

    def __post_init__(self) -> None:
        for spec, name, value in _flagged_values(self):
            problem = spec.problem(value)
            if problem is not None:
                quoted = isinstance(value, str) and repr(value) in problem  # a problem that quotes it
                got = "" if quoted else f", got {_shown(value)}"
                raise ConfigError(f"{name} ({spec.flag}) {problem}{got}")
        self._check()

    def _check(self) -> None:
        """Checks across fields (a config with any overrides this); runs after each field's."""

    @classmethod
    def from_args(cls: type[S], args: argparse.Namespace, **overrides: Any) -> S:
        """The config parsed flags give (`add_settings` added them): each field's flag, each
        nested config's, then ``overrides`` (field → value); a field with no flag keeps its default."""
        values: dict[str, Any] = {}
        for item in dataclasses.fields(cls):  # type: ignore[arg-type]  # a Settings is a dataclass
            if item.metadata.get(_NESTED):
                values[item.name] = _nested_type(cls, item).from_args(args)
            elif _SETTING in item.metadata:
                spec: Setting = item.metadata[_SETTING]
                if hasattr(args, spec.dest):
                    value = getattr(args, spec.dest)
                    values[item.name] = not value if spec.negate else value
        values.update(overrides)
        return cls(**values)

    def argv(self) -> list[str]:
        """The command line that gives this config (each flagged field, nested ones too, that
        is not None; a float as ``%g``), for a program started with these settings.

        Example:
            >>> from dataclasses import dataclass
            >>> @dataclass(frozen=True)
            ... class Probe(Settings):
            ...     retries: int = setting(3, flag="--probe-retries", help="tries")
            ...     verbose: bool = setting(False, flag="--verbose", help="say more")
            >>> Probe(retries=5, verbose=True).argv()
            ['--probe-retries', '5', '--verbose']
        """
        words: list[str] = []
        hints = typing.get_type_hints(type(self))
        for item in dataclasses.fields(self):  # type: ignore[arg-type]  # a Settings is a dataclass
            value = getattr(self, item.name)
            if item.metadata.get(_NESTED):
                words += value.argv()
            elif _SETTING in item.metadata and value is not None:
                two_ways = _value_type(hints[item.name])[1]  # bool | None: --x or --no-x
                words += _flag_words(item.metadata[_SETTING], value, two_ways)
        return words


def settings_of(cls: type[Settings]) -> Iterator[tuple[dataclasses.Field[Any], Setting]]:
    """Each flagged field of ``cls`` and its nested configs, with its `Setting`, in order."""
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]  # a Settings is a dataclass
        if item.metadata.get(_NESTED):
            yield from settings_of(_nested_type(cls, item))
        elif _SETTING in item.metadata:
            yield item, item.metadata[_SETTING]


def add_settings(
    parser: argparse._ActionsContainer,
    cls: type[Settings],
    group: str | None = None,
    *,
    only: Iterable[str] | None = None,
) -> None:
    """Add the flag of every field of ``cls`` (and of its nested configs; ``only``: of the
    fields so named) to ``parser`` (or an argument group), under the title ``group`` (or each
    setting's own); each default read from its variable. A flag the parser already has is kept
    as it is (one flag serving two configs, such as a worker's ``--model-path`` beside a
    frontend's in one process)."""
    groups: dict[str | None, argparse._ActionsContainer] = {}
    hints = _hints_by_field(cls)
    wanted = None if only is None else set(only)
    for item, spec in settings_of(cls):
        if spec.flag in parser._option_string_actions or (wanted is not None and item.name not in wanted):
            continue
        title = spec.group or group
        if isinstance(parser, argparse._ArgumentGroup):  # already a group: its flags go in it
            title = None
        if title not in groups:
            groups[title] = parser.add_argument_group(title) if title else parser
        _add_flag(groups[title], item, spec, hints[item.name])


def _add_flag(
    container: argparse._ActionsContainer, item: dataclasses.Field[Any], spec: Setting, hint: Any
) -> None:
    kind, optional = _value_type(hint)
    default = _default(item, spec, kind)
    options: dict[str, Any] = {"dest": spec.dest, "default": not default if spec.negate else default}
    shown = spec.default_text if spec.default_text is not None else "%(default)s"
    env = f"env {spec.env_name}; " if spec.env_name else ""
    options["help"] = argparse.SUPPRESS if spec.hidden else f"{spec.help} ({env}default: {shown})"
    if kind is bool:
        options["action"] = argparse.BooleanOptionalAction if optional or spec.both_ways else "store_true"
    else:
        options["type"] = kind
        if spec.choices is not None:
            options["choices"] = spec.choices
        if spec.metavar is not None:
            options["metavar"] = spec.metavar
    if spec.aliases:
        options["action"] = _spellings(spec.flag)
    container.add_argument(spec.flag, *spec.aliases, **options)


def _spellings(flag: str) -> type[argparse.Action]:
    """An action that refuses two spellings of one flag with two values."""

    class OneOfTwoSpellings(argparse._StoreAction):
        def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
            seen = f"_{self.dest}_spelling"
            before = getattr(namespace, seen, None)
            if before is not None and before[0] != option_string and before[1] != values:
                raise ConfigError(f"{option_string} is the older name of {flag}: give one")
            setattr(namespace, seen, (option_string, values))
            setattr(namespace, self.dest, values)

    return OneOfTwoSpellings


def _default(item: dataclasses.Field[Any], spec: Setting, kind: Any) -> Any:
    if item.default is not dataclasses.MISSING:
        default = item.default
    elif item.default_factory is not dataclasses.MISSING:
        default = item.default_factory()
    else:
        default = None
    name = spec.env_name
    raw = env_default(spec.env, None) if spec.env is not None else None
    if raw is None or not raw.strip():  # unset, or set empty: the field's default
        return default
    if kind is bool:
        word = raw.strip().lower()
        if word in _TRUE or word in _FALSE:
            return word in _TRUE
        raise ConfigError(f"{name}={raw!r} is neither on (1, true) nor off (0, false)")
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a{'n' if kind is int else ''} {kind.__name__}") from None


def _value_type(hint: Any) -> tuple[Any, bool]:
    """``(the type a flag parses, whether None is allowed)`` of a field's type hint."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return args[0], True
    return hint, False


def _hints_by_field(cls: type[Settings]) -> dict[str, Any]:
    hints: dict[str, Any] = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]  # a Settings is a dataclass
        if item.metadata.get(_NESTED):
            hints.update(_hints_by_field(_nested_type(cls, item)))
    hints.update(typing.get_type_hints(cls))
    return hints


def _nested_type(cls: type[Settings], item: dataclasses.Field[Any]) -> type[Settings]:
    kind = typing.get_type_hints(cls)[item.name]
    if not (isinstance(kind, type) and issubclass(kind, Settings)):
        raise TypeError(f"{cls.__name__}.{item.name} is nested() but {kind!r} is not a Settings config")
    return kind


def _flagged_values(config: Settings) -> Iterator[tuple[Setting, str, Any]]:
    for item in dataclasses.fields(config):  # type: ignore[arg-type]  # a Settings is a dataclass
        if _SETTING in item.metadata:
            yield item.metadata[_SETTING], item.name, getattr(config, item.name)


def _flag_words(spec: Setting, value: Any, two_ways: bool) -> list[str]:
    """A value on the command line: ``[flag, value]``; a switch: its flag where it is on (one
    with a ``--no-`` twin: the flag or its twin)."""
    if isinstance(value, bool):
        on = value != spec.negate
        if spec.both_ways or two_ways:
            return [spec.flag if on else "--no-" + spec.flag.removeprefix("--")]
        return [spec.flag] if on else []
    return [spec.flag, f"{value:g}" if isinstance(value, float) else str(value)]


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else repr(value)
