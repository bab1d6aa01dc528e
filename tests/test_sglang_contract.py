"""What the SGLang engine sends SGLang, checked against SGLang's own source (the pinned release).

SGLang needs a CUDA GPU, so it cannot run here; its API can still be read. CI installs the
pinned release without its dependencies (``pip install --no-deps sglang==0.5.23``); these
tests read ``Engine.async_generate``, the tokenizer manager, ``SamplingParams``, the finish
reasons and the KV event types from its source files (``ast``), and ``ServerArgs`` through
SGLang's own parser. They fail when a keyword, field or flag we use does not exist in that
release, or when the recording stand-in (what the other SGLang tests run against) differs
from SGLang's signatures.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import collect, req

from dynamo_nb.engines.sglang import SGLANG_VERSION, SglangEngine, sampling_params_of
from dynamo_nb.engines.sglang_fake import SAMPLING_PARAM_NAMES, SERVER_ARG_DEFAULTS, RecordingSglangEngine

SPEC = importlib.util.find_spec("sglang")
pytestmark = pytest.mark.sglang  # skipped where it is not installed (pip install --no-deps sglang==…)
SOURCE = Path(SPEC.origin).parent if SPEC is not None and SPEC.origin else Path()


def tree(relative: str) -> ast.Module:
    return ast.parse((SOURCE / relative).read_text())


def class_node(module: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(module) if isinstance(n, ast.ClassDef) and n.name == name)


def method_params(cls: ast.ClassDef, name: str) -> dict[str, Any]:
    """Parameter name → default (``inspect.Parameter.empty`` when it has none) of ``cls.name``."""
    func = next(
        n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
    )
    args = func.args
    positional = args.posonlyargs + args.args
    defaults: list[Any] = [inspect.Parameter.empty] * (len(positional) - len(args.defaults)) + list(
        args.defaults
    )
    params = {a.arg: d for a, d in zip(positional, defaults, strict=True)}
    params |= {
        a.arg: (d if d is not None else inspect.Parameter.empty)
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    }
    return {
        name: default if default is inspect.Parameter.empty else ast.literal_eval(default)
        for name, default in params.items()
        if name != "self"
    }


def self_attributes(cls: ast.ClassDef) -> set[str]:
    return {
        target.attr
        for node in ast.walk(cls)
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    }


def struct_fields(cls: ast.ClassDef) -> set[str]:
    return {
        node.target.id
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }


def test_the_installed_sglang_is_the_pinned_release() -> None:
    from importlib.metadata import version

    assert version("sglang") == SGLANG_VERSION


async def test_every_keyword_we_pass_to_async_generate_exists_in_sglang(tiny_path: Path) -> None:
    real = method_params(class_node(tree("srt/entrypoints/engine.py"), "Engine"), "async_generate")
    sent: list[dict[str, Any]] = []

    async def spy(fake: RecordingSglangEngine, port: int) -> None:
        original = fake.async_generate

        async def async_generate(**kwargs: Any) -> Any:
            sent.append(kwargs)
            return await original(**kwargs)

        fake.async_generate = async_generate  # type: ignore[method-assign]

    from dynamo_nb.flags import sglang_worker_parser
    from dynamo_nb.launch.services import free_port

    port = free_port()
    argv = ["--fake-engine", "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(port)]
    prefill = await SglangEngine.from_args(sglang_worker_parser().parse_args(argv), tiny_path)
    decode = await SglangEngine.from_args(
        sglang_worker_parser().parse_args(["--fake-engine", "--disaggregation-mode", "decode"]), tiny_path
    )
    try:
        for engine in (prefill, decode):
            await spy(engine.llm, port)
        request = req(
            {"token_ids": [5, 6, 7], "stop_conditions": {"max_tokens": 3}, "sampling_options": {"seed": 1}}
        )
        first, *_ = await collect(prefill.prefill(request))
        handed = req(
            {**request.to_dict(), "prefill_result": {"disaggregated_params": first["disaggregated_params"]}}
        )
        await collect(decode.decode(handed))
    finally:
        await prefill.close()
        await decode.close()
    assert len(sent) == 2 and {
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
        "input_ids",
        "rid",
    } <= set(sent[0])
    for kwargs in sent:
        assert set(kwargs) <= set(real), set(kwargs) - set(real)
        assert set(kwargs["sampling_params"]) <= struct_fields(
            class_node(tree("srt/sampling/sampling_params.py"), "SamplingParams")
        )


def test_the_stand_in_has_sglangs_signatures_and_defaults() -> None:
    real = method_params(class_node(tree("srt/entrypoints/engine.py"), "Engine"), "async_generate")
    ours = dict(inspect.signature(RecordingSglangEngine.async_generate).parameters)
    ours.pop("self")
    for name, parameter in ours.items():
        assert name in real, name
        assert parameter.default == real[name], (name, parameter.default, real[name])
    manager = class_node(tree("srt/managers/tokenizer_manager.py"), "TokenizerManager")
    assert method_params(manager, "abort_request") == {"rid": "", "abort_all": False}
    assert {"server_args", "context_len", "model_config", "rid_to_state"} <= self_attributes(manager)
    assert "vocab_size" in self_attributes(class_node(tree("srt/configs/model_config.py"), "ModelConfig"))
    engine = class_node(tree("srt/entrypoints/engine.py"), "Engine")
    assert "shutdown" in {n.name for n in engine.body if isinstance(n, ast.FunctionDef)}


def test_sampling_parameters_we_send_are_sglangs() -> None:
    fields = struct_fields(class_node(tree("srt/sampling/sampling_params.py"), "SamplingParams"))
    assert SAMPLING_PARAM_NAMES <= fields, SAMPLING_PARAM_NAMES - fields
    request = req(
        {
            "token_ids": [1],
            "stop_conditions": {"max_tokens": 4, "min_tokens": 1},
            "sampling_options": {"temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 3},
            "eos_token_ids": [2],
        }
    )
    assert set(sampling_params_of(request, 4)) <= SAMPLING_PARAM_NAMES


def test_finish_reasons_and_stream_items_are_shaped_as_we_read_them() -> None:
    batch = (SOURCE / "srt/managers/schedule_batch.py").read_text()
    for kind in ("stop", "length", "abort"):
        assert re.search(rf'"type":\s*"{kind}"', batch), kind
    manager = (SOURCE / "srt/managers/tokenizer_manager.py").read_text()
    assert '"output_ids": output_token_ids' in manager and '"meta_info": meta_info' in manager
    for key in ("finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"):
        assert f'"{key}"' in manager, key


def test_kv_event_types_carry_what_the_relay_reads() -> None:
    events = tree("srt/disaggregation/kv_events.py")
    assert {"block_hashes", "parent_block_hash", "token_ids", "block_size"} <= struct_fields(
        class_node(events, "BlockStored")
    )
    assert "block_hashes" in struct_fields(class_node(events, "BlockRemoved"))
    class_node(events, "AllBlocksCleared")


def test_the_fallback_flags_and_server_args_are_sglangs() -> None:
    try:
        from sglang.srt.server_args import ServerArgs
    except Exception as exc:  # pragma: no cover - depends on what the environment has
        pytest.skip(f"SGLang's ServerArgs does not import here: {exc}")
    from dynamo_nb.flags import SGLANG_FLAGS

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    real = {option: action for action in parser._actions for option in action.option_strings}
    for flag, options in SGLANG_FLAGS:
        assert flag in real, flag
        assert real[flag].default == options.get("default"), flag
        if "choices" in options:
            assert set(real[flag].choices) == set(options["choices"]), flag  # type: ignore[arg-type]
    defaults = {action.dest: action.default for action in parser._actions}
    for name, default in SERVER_ARG_DEFAULTS.items():
        assert name in defaults, name
        assert defaults[name] == default, (name, defaults[name], default)


def sglangs_event_classes() -> dict[str, Any]:
    """SGLang's own KV event structs (msgspec), made from its source: its module imports SGLang's
    runtime, which needs its GPU dependencies; the structs need only msgspec."""
    import enum
    from typing import Optional, Union

    import msgspec

    module = tree("srt/disaggregation/kv_events.py")
    names = ("EventBatch", "KVCacheEvent", "BlockStored", "BlockRemoved", "AllBlocksCleared", "KVEventBatch")
    wanted = ast.Module(body=[class_node(module, name) for name in names], type_ignores=[])
    namespace: dict[str, Any] = {
        "msgspec": msgspec,
        "Any": Any,
        "Optional": Optional,
        "Union": Union,
        "enum": enum,
    }
    exec(compile(wanted, str(SOURCE / "srt/disaggregation/kv_events.py"), "exec"), namespace)
    return namespace


async def test_sglangs_own_encoded_kv_events_reach_the_router_in_its_block_ids() -> None:
    """A batch encoded by SGLang's own structs and msgpack encoder, sent as its publisher sends it
    (``topic, seq, payload`` on a ZMQ PUB socket), is relayed as the router's events: stored
    blocks in the router's ids (SGLang's negative int64 hashes mapped), then their removal."""
    import asyncio

    import msgspec
    import zmq
    import zmq.asyncio

    from dynamo_nb.engines.kv_cache.zmq_relay import ZmqKvRelay
    from dynamo_nb.router.kv.hashing import block_hashes, sequence_hashes
    from dynamo_nb.runtime.addresses import free_port

    sglang = sglangs_event_classes()
    tokens = list(range(40, 48))
    batches = [
        sglang["KVEventBatch"](ts=1.0, events=[sglang["BlockStored"](
            block_hashes=[-5, 7], parent_block_hash=None, token_ids=tokens, block_size=4, lora_id=None, medium="GPU")]),
        sglang["KVEventBatch"](ts=2.0, events=[sglang["BlockRemoved"](block_hashes=[7]), sglang["AllBlocksCleared"]()]),
    ]  # fmt: skip
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    publisher = zmq.asyncio.Context.instance().socket(zmq.PUB)
    publisher.bind(endpoint)
    received: list[Any] = []
    relay = ZmqKvRelay(endpoint, block_size=4)

    async def sink(event: Any) -> None:
        received.append(event)

    await relay.start(sink)
    try:
        encode = msgspec.msgpack.Encoder().encode
        for _ in range(200):  # a SUB socket misses what is sent before it joined: send until heard
            await publisher.send_multipart((b"", (0).to_bytes(8, "big"), encode(batches[0])))
            await asyncio.sleep(0.02)
            if received:
                break
        await publisher.send_multipart((b"", (1).to_bytes(8, "big"), encode(batches[1])))
        for _ in range(200):
            if received and received[-1] == "cleared":
                break
            await asyncio.sleep(0.02)
    finally:
        await relay.stop()
        publisher.close(linger=0)
    ours = sequence_hashes(block_hashes(tokens, 4))
    stored = received[0]["stored"]
    assert stored["parent_hash"] is None
    assert [b["block_hash"] for b in stored["blocks"]] == ours
    assert [b["tokens_hash"] for b in stored["blocks"]] == block_hashes(tokens, 4)
    assert received[-2:] == [{"removed": {"block_hashes": [ours[1]]}}, "cleared"]
