"""Settings declared once (dynamo_nb.settings): a config field carries its flag, help, variable and
check, and the frontend's parser, config and keywords all come from the fields."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from dataclasses import dataclass

import pytest

from dynamo_nb import DistributedRuntime
from dynamo_nb.errors import ConfigError
from dynamo_nb.flags import FlagParser, frontend_parser
from dynamo_nb.frontend import Frontend, FrontendConfig
from dynamo_nb.router.kv.router import KvRouterConfig
from dynamo_nb.settings import Settings, add_settings, at_least, setting, settings_of


@dataclass(frozen=True)
class WithAThrowawayField(FrontendConfig):
    """The frontend's config and one more field: nothing else is edited for it."""

    probe_budget: int = setting(
        3, flag="--probe-budget", env="PROBE_BUDGET", check=at_least(1), help="probes a worker gets"
    )


def help_of(parser: FlagParser) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parser.parse_args(["--help"])
    return " ".join(out.getvalue().split())


def parser_of(config: type[FrontendConfig]) -> FlagParser:
    parser = FlagParser(prog="frontend")
    add_settings(parser, config, group="frontend")
    return parser


def test_a_new_field_is_a_flag_with_its_variable_help_and_check(monkeypatch: pytest.MonkeyPatch) -> None:
    text = help_of(parser_of(WithAThrowawayField))
    assert "--probe-budget PROBE_BUDGET probes a worker gets (env DYN_NB_PROBE_BUDGET; default: 3)" in text
    assert "--migration-limit" in text  # the fields it inherits are flags too

    assert WithAThrowawayField.from_args(parser_of(WithAThrowawayField).parse_args([])).probe_budget == 3
    monkeypatch.setenv("DYN_NB_PROBE_BUDGET", "7")
    assert WithAThrowawayField.from_args(parser_of(WithAThrowawayField).parse_args([])).probe_budget == 7
    given = parser_of(WithAThrowawayField).parse_args(["--probe-budget", "9"])  # a flag beats its variable
    assert WithAThrowawayField.from_args(given).probe_budget == 9

    message = "probe_budget (--probe-budget) must be at least 1, got 0"
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        WithAThrowawayField.from_args(parser_of(WithAThrowawayField).parse_args(["--probe-budget", "0"]))
    with pytest.raises(ConfigError, match="must be at least 1, got 0"):  # from Python: the same check
        WithAThrowawayField(probe_budget=0)
    with pytest.raises(ConfigError, match="must be at least 1, got 0"):  # and through replace
        dataclasses.replace(WithAThrowawayField(), probe_budget=0)
    monkeypatch.setenv("DYN_NB_PROBE_BUDGET", "many")
    with pytest.raises(ConfigError, match="DYN_NB_PROBE_BUDGET='many' is not an int"):
        parser_of(WithAThrowawayField)


def test_the_frontend_parser_is_its_config() -> None:
    """Every flagged field of the frontend's config (and of the KV router's inside it) is a flag of
    the frontend program, and no flag means it parses to the config's own defaults."""
    parser = frontend_parser()
    flags = {option for action in parser._actions for option in action.option_strings}
    declared = [spec.flag for _, spec in settings_of(FrontendConfig)]
    assert len(declared) > 25 and set(declared) <= flags
    assert {"--router-prefill-load-scale", "--no-kv-events", "--router-replica-sync"} <= set(declared)
    assert FrontendConfig.from_args(parser.parse_args([])) == FrontendConfig()
    assert KvRouterConfig.from_args(parser.parse_args(["--no-kv-events"])).use_kv_events is False


def test_the_runtime_flags_are_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every component's runtime flags come from `RuntimeConfig`'s fields, their variables too."""
    from dynamo_nb.flags import echo_worker_parser
    from dynamo_nb.runtime.program import RuntimeConfig

    declared = [item.name for item, _ in settings_of(RuntimeConfig)]
    assert declared == [item.name for item in dataclasses.fields(RuntimeConfig)]  # each field is a flag
    assert RuntimeConfig.from_args(echo_worker_parser().parse_args([])) == RuntimeConfig()
    monkeypatch.setenv("DYN_NB_CONNECT_TIMEOUT", "5")
    monkeypatch.setenv("DYN_NB_ALLOW_UNAUTHENTICATED", "1")
    monkeypatch.setenv("DYN_NB_TCP_PORT", "")  # set empty: the default
    config = RuntimeConfig.from_args(echo_worker_parser().parse_args(["--static"]))
    assert (config.connect_timeout, config.allow_unauthenticated, config.tcp_port, config.static) == (
        5.0,
        True,
        0,
        True,
    )
    assert RuntimeConfig.from_args(echo_worker_parser().parse_args([]), static=True).static
    monkeypatch.setenv("DYN_NB_ALLOW_UNAUTHENTICATED", "maybe")
    with pytest.raises(ConfigError, match="DYN_NB_ALLOW_UNAUTHENTICATED='maybe' is neither on"):
        echo_worker_parser()


def test_the_worker_role_flags_are_its_config() -> None:
    """``--mode`` and the bootstrap server's flags come from `WorkerRole`'s fields; an engine
    whose own connector moves the KV (vLLM) gets ``--mode`` and ``--prefill-endpoint`` only."""
    from dynamo_nb.disagg.modes import WorkerRole
    from dynamo_nb.flags import hf_worker_parser, vllm_worker_parser

    declared = [item.name for item, _ in settings_of(WorkerRole)]
    assert declared == [item.name for item in dataclasses.fields(WorkerRole) if item.name != "endpoint"]
    role = WorkerRole.from_args(
        hf_worker_parser().parse_args(["--mode", "prefill", "--no-bootstrap-endpoint"])
    )
    assert (role.mode, role.endpoint, role.publish_handoff) == ("prefill", "dynamo.prefill.generate", False)
    assert WorkerRole.from_args(hf_worker_parser().parse_args([])) == WorkerRole()
    vllm = vllm_worker_parser()
    flags = {option for action in vllm._actions for option in action.option_strings}
    assert {"--mode", "--prefill-endpoint"} <= flags and "--bootstrap-port" not in flags
    assert WorkerRole.from_args(vllm.parse_args(["--mode", "decode"])).mode == "decode"
    with pytest.raises(
        ConfigError, match=r"mode \(--mode\) must be one of aggregated, prefill, decode, got 'both'"
    ):
        WorkerRole("both")


def test_the_hf_engines_flags_are_its_settings() -> None:
    from dynamo_nb.engines.hf import HFSettings
    from dynamo_nb.flags import hf_worker_parser

    assert HFSettings.from_args(hf_worker_parser().parse_args([])) == HFSettings()
    flags = ["--no-enable-prefix-caching", "--no-enable-chunked-prefill", "--max-num-batched-tokens", "64"]
    own = HFSettings.from_args(hf_worker_parser().parse_args(flags))
    assert (own.enable_prefix_caching, own.enable_chunked_prefill, own.max_num_batched_tokens) == (
        False,
        False,
        64,
    )
    with pytest.raises(
        ConfigError, match=r"prefix_cache_blocks \(--prefix-cache-blocks\) must be at least 0"
    ):
        HFSettings.from_args(hf_worker_parser().parse_args(["--prefix-cache-blocks", "-1"]))


def test_the_mocker_workers_flags_are_its_settings_and_give_its_command_line() -> None:
    """Every engine worker's limits come from `EngineLimits`; the mocker's settings share them
    (its own default of 256 running requests) and `argv` gives a command line that parses back
    to the same settings."""
    from dynamo_nb.engines.base import EngineLimits
    from dynamo_nb.engines.mocker import MockerWorkerSettings
    from dynamo_nb.flags import hf_worker_parser, mocker_worker_parser

    assert EngineLimits.from_args(hf_worker_parser().parse_args([])) == EngineLimits()
    assert MockerWorkerSettings.from_args(mocker_worker_parser().parse_args([])) == MockerWorkerSettings()
    assert (EngineLimits().max_num_seqs, MockerWorkerSettings().engine.max_num_seqs) == (64, 256)
    custom = MockerWorkerSettings(num_workers=3, context_length=4096)
    custom = dataclasses.replace(
        custom, engine=dataclasses.replace(custom.engine, block_size=32, speedup_ratio=2.5)
    )
    argv = custom.argv()
    assert argv[:2] == ["--num-workers", "3"] and argv[-2:] == ["--context-length", "4096"]
    assert "--speedup-ratio" in argv and argv[argv.index("--speedup-ratio") + 1] == "2.5"
    assert MockerWorkerSettings.from_args(mocker_worker_parser().parse_args(argv)) == custom
    for flags, message in [
        (["--max-num-seqs", "0"], r"max_num_seqs \(--max-num-seqs\) must be at least 1, got 0"),
        (["--num-workers", "0"], r"num_workers \(--num-workers\) must be at least 1, got 0"),
        (
            ["--decode-speedup-ratio", "0"],
            r"decode_speedup_ratio \(--decode-speedup-ratio\) must be more than 0",
        ),
    ]:
        with pytest.raises(ConfigError, match=message):
            MockerWorkerSettings.from_args(mocker_worker_parser().parse_args(flags))
    with pytest.raises(ConfigError, match=r"kv_timeout \(--kv-timeout\) must be more than 0 seconds"):
        from dynamo_nb.disagg.modes import WorkerRole

        WorkerRole.from_args(hf_worker_parser().parse_args(["--kv-timeout", "0"]))


def test_argv_writes_switches_both_ways() -> None:
    @dataclass(frozen=True)
    class Switches(Settings):
        fast: bool = setting(False, flag="--fast", help="go fast")
        cache: bool = setting(True, flag="--no-cache", negate=True, help="no cache")
        chunked: bool = setting(True, flag="--chunked", both_ways=True, help="chunk")
        maybe: bool | None = setting(None, flag="--maybe", help="perhaps")

    assert Switches().argv() == ["--chunked"]
    assert Switches(fast=True, cache=False, chunked=False, maybe=False).argv() == [
        "--fast",
        "--no-cache",
        "--no-chunked",
        "--no-maybe",
    ]
    parser = FlagParser()
    add_settings(parser, Switches)
    for config in (Switches(), Switches(fast=True, cache=False, chunked=False, maybe=True)):
        assert Switches.from_args(parser.parse_args(config.argv())) == config


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("migration_limit", -1, "migration_limit (--migration-limit) must be at least 0 (off), got -1"),
        ("overload_status", 500, "overload_status (--overload-status) must be one of 503, 529, got 500"),
        ("idle_timeout", 0.0, "idle_timeout (--http-idle-timeout) must be more than 0 seconds, got 0"),
        ("http_workers", 0, "http_workers (--http-workers) must be at least 1, got 0"),
        ("router_mode", "fastest", "router_mode (--router-mode) must be one of round-robin, random"),
        ("port", 70000, "port (--http-port) must be a port, 0 (a free one) to 65535, got 70000"),
    ],
)
def test_each_setting_is_checked_once_whoever_makes_it(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        FrontendConfig(**{field: value})
    assert str(raised.value).startswith(message)


async def test_start_takes_fields_as_keywords_and_names_a_wrong_one() -> None:
    runtime = await DistributedRuntime.create()
    try:
        with pytest.raises(ConfigError, match=r"got migration_limt=, .* \(did you mean migration_limit\?\)"):
            await Frontend.start(runtime, port=0, migration_limt=0)
        with pytest.raises(ConfigError, match="must be at least 0"):
            await Frontend.start(runtime, port=0, migration_limit=-1)
        frontend = await Frontend.start(runtime, FrontendConfig(migration_limit=1), port=0, routing_records=4)
        try:
            assert frontend.config.migration_limit == 1 and frontend.config.routing_records == 4
            assert frontend.port != 0 and frontend.url.endswith(f":{frontend.port}")
        finally:
            await frontend.stop()
    finally:
        await runtime.shutdown()
