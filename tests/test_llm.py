"""The LLM pieces on their own: tiny model, protocol, tokenizer, detokenizer, hf engine, model cards."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest
from helpers import collect, req

from dynamo_nb import ConfigError, DistributedRuntime
from dynamo_nb.errors import InvalidRequestError
from dynamo_nb.llm import (
    CARD_PREFIX,
    ModelCard,
    ModelTokenizer,
    PreprocessedRequest,
    StreamDetokenizer,
    card_from_folder,
    check_model_dir,
    register_llm,
    serve_llm,
)
from dynamo_nb.models import random_model


def chat_ids(tok: ModelTokenizer, text: str) -> list[int]:
    return tok.encode(tok.render_chat([{"role": "user", "content": text}]), add_special_tokens=False)


def greedy(ids: list[int], max_tokens: int, **stop: Any) -> dict[str, Any]:
    return {
        "token_ids": ids,
        "stop_conditions": {"max_tokens": max_tokens, **stop},
        "sampling_options": {"temperature": 0},
    }


def tokens_of(items: list[Any]) -> list[int]:
    return [t for item in items for t in item["token_ids"]]


# -- the random model (the built-in tiny model is tested in test_tiny_model.py)


@pytest.fixture(scope="module")
def random_path() -> Path:
    return random_model.random_model_path()


def test_random_model_is_a_deterministic_hf_folder(
    random_path: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    names = {p.name for p in random_path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    monkeypatch.setenv("DYN_NB_CACHE_DIR", str(tmp_path))
    rebuilt = random_model.random_model_path()
    assert rebuilt.parent == tmp_path and rebuilt != random_path
    for name in ("model.safetensors", "tokenizer.json"):
        digest = [
            hashlib.sha256((folder / name).read_bytes()).hexdigest() for folder in (random_path, rebuilt)
        ]
        assert digest[0] == digest[1], f"{name} differs between two builds"
    assert random_model.random_model_path() == rebuilt  # cached: the second call builds nothing


def test_random_model_loads_with_transformers_and_greedy_output_varies(random_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(random_path)
    model = AutoModelForCausalLM.from_pretrained(random_path)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Tell me a story"}], add_generation_prompt=True, return_tensors="pt"
    )["input_ids"]
    out = model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None)[0, ids.shape[1] :]
    assert len(set(out.tolist())) > 8, "greedy output repeats itself: the random init is too flat"
    assert 1e5 < sum(p.numel() for p in model.parameters()) < 1e6
    assert torch.equal(
        out, model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None)[0, ids.shape[1] :]
    )


# -- protocol


@pytest.mark.parametrize(
    ("request_dict", "param"),
    [
        ({"token_ids": []}, "token_ids"),
        ({"token_ids": [1, "a"]}, "token_ids"),
        ({"token_ids": [1], "stop_conditions": {"max_tokens": 0}}, "max_tokens"),
        ({"token_ids": [1], "sampling_options": {"temperature": 3}}, "temperature"),
        ({"token_ids": [1], "sampling_options": {"top_p": "x"}}, "top_p"),
        ({"token_ids": [1], "sampling_options": {"top_k": 0}}, "top_k"),
        ({"token_ids": [1], "stop_conditions": "x"}, "stop_conditions"),
    ],
)
def test_preprocessed_request_rejects_bad_fields(request_dict: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        PreprocessedRequest.from_dict(request_dict)
    assert info.value.param == param


def test_preprocessed_request_round_trip_tolerates_unknown_fields() -> None:
    request = PreprocessedRequest.from_dict(
        {"token_ids": [3, 4], "stop_conditions": {"max_tokens": 2, "stop": "x"}, "future_field": {"a": 1}}
    )
    assert request.stop_conditions.stop == ["x"]
    assert PreprocessedRequest.from_dict(request.to_dict()) == request


# -- tokenizer and detokenizer


def test_chat_template_and_incremental_detokenizing(tiny_path: Path) -> None:
    tok = ModelTokenizer.load(tiny_path)
    prompt = tok.render_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert (
        prompt
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    text = "Hello wörld, 日本 and the robot 42!"
    detok = StreamDetokenizer(tok)
    pieces = [detok.push(t) for t in tok.encode(text)]
    assert "".join(pieces) + detok.finish() == text
    assert "�" not in "".join(pieces)  # split UTF-8 bytes are held until complete


@pytest.mark.parametrize(
    ("stop", "expected", "stopped"),
    [
        (["robot"], "Hello wörld, 日本 and the ", True),
        (["and th", "日"], "Hello wörld, ", True),  # the earliest match wins
        (["robots"], "Hello wörld, 日本 and the robot 42!", False),  # a prefix is released at the end
    ],
)
def test_stop_strings_cut_the_text(tiny_path: Path, stop: list[str], expected: str, stopped: bool) -> None:
    tok = ModelTokenizer.load(tiny_path)
    detok = StreamDetokenizer(tok, stop)
    text = "".join(detok.push(t) for t in tok.encode("Hello wörld, 日本 and the robot 42!")) + detok.finish()
    assert (text, detok.stopped) == (expected, stopped)


async def test_a_long_text_is_tokenized_off_the_event_loop_and_a_floor_bounds_its_tokens(
    tiny_path: Path,
) -> None:
    """A text past LONG_TEXT_CHARS is tokenized in a thread (the same ids); the floor on a text's
    tokens, taken without tokenizing it, is never above its real count."""
    import threading

    from dynamo_nb.llm.tokenizer import LONG_TEXT_CHARS, ModelTokenizer

    tokenizer = ModelTokenizer.load(tiny_path)
    threads = []
    encode = tokenizer.encode

    def recorded(text: str, *, add_special_tokens: bool = True) -> list[int]:
        threads.append(threading.get_ident())
        return encode(text, add_special_tokens=add_special_tokens)

    tokenizer.encode = recorded  # type: ignore[method-assign]
    short, long = "Tell me about the router. ", "Tell me about the router. " * (LONG_TEXT_CHARS // 20)
    assert await tokenizer.encode_off_loop(short) == encode(short)
    assert await tokenizer.encode_off_loop(long) == encode(long)
    assert threads[0] == threading.get_ident() != threads[1]
    for text in (short, long, "x" * 5000, "".join(chr(c) for c in range(32, 1000)), "ĠExtendedContext" * 99):
        assert tokenizer.fewest_tokens(text) <= len(encode(text, add_special_tokens=False)), text[:40]


async def test_a_long_chat_is_rendered_off_the_event_loop(tiny_path: Path) -> None:
    """Messages holding more than LONG_TEXT_CHARS characters (their text, plain or in parts) are
    rendered in a thread, to the same text."""
    import threading

    from dynamo_nb.llm.tokenizer import LONG_TEXT_CHARS, ModelTokenizer, _text_size

    tokenizer = ModelTokenizer.load(tiny_path)
    threads = []
    render = tokenizer.render_chat

    def recorded(messages: list[dict[str, Any]], **options: Any) -> str:
        threads.append(threading.get_ident())
        return render(messages, **options)

    tokenizer.render_chat = recorded  # type: ignore[method-assign]
    word = "Tell me about the router. "
    short = [{"role": "user", "content": word}]
    long = [{"role": "user", "content": word * (LONG_TEXT_CHARS // 20)}]
    assert await tokenizer.render_chat_off_loop(short) == render(short)
    assert await tokenizer.render_chat_off_loop(long) == render(long)
    assert threads[0] == threading.get_ident() != threads[1]
    parts = [{"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "image_url"}]}]
    assert _text_size([*short, *parts]) == len(word) + 2  # text parts count as text


def test_model_folder_checks_say_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        check_model_dir(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"tokenizer\.json"):
        check_model_dir(tmp_path)
    with pytest.raises(ConfigError, match="empty"):
        check_model_dir("  ")


# -- hf engine


async def test_hf_engine_greedy_matches_transformers_generate(hf_engine: Any, tiny_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    tok = ModelTokenizer.load(tiny_path)
    ids = chat_ids(tok, "What is the capital of France?")
    items = await collect(hf_engine.generate(req(greedy(ids, 20, ignore_eos=True))))
    reference = AutoModelForCausalLM.from_pretrained(tiny_path).generate(
        torch.tensor([ids]), max_new_tokens=20, min_new_tokens=20, do_sample=False
    )[0, len(ids) :]
    assert tokens_of(items) == reference.tolist()
    assert all(len(item["token_ids"]) == 1 for item in items)
    assert items[-1]["finish_reason"] == "length"
    usage = dict(items[-1]["completion_usage"])
    assert 0 <= usage.pop("prompt_tokens_details")["cached_tokens"] < len(ids)
    assert usage == {"prompt_tokens": len(ids), "completion_tokens": 20, "total_tokens": len(ids) + 20}


async def test_hf_engine_batches_decodes_and_greedy_output_does_not_depend_on_the_batch(
    hf_engine: Any, tiny_path: Path
) -> None:
    """Concurrent requests share one forward pass per decode step (continuous batching: they join
    and leave between steps, with prompts of different lengths); each one's greedy tokens equal
    what it gets alone and what transformers' generate gives."""
    tok = ModelTokenizer.load(tiny_path)
    prompts = [
        chat_ids(tok, text)
        for text in ("Hi", "What is the capital of France?", "Tell me a story about a cat")
    ]
    lengths = (48, 12, 12)  # the first decodes long enough for the others to join it
    alone = [
        tokens_of(await collect(hf_engine.generate(req(greedy(ids, n, ignore_eos=True)))))
        for ids, n in zip(prompts, lengths, strict=True)
    ]
    batched_before = hf_engine.scheduler.batched_steps

    first = hf_engine.generate(req(greedy(prompts[0], lengths[0], ignore_eos=True)))
    head = [(await first.__anext__()).to_dict()]  # the first is decoding now: the others join its batch
    others = asyncio.ensure_future(
        asyncio.gather(
            *(
                collect(hf_engine.generate(req(greedy(ids, n, ignore_eos=True))))
                for ids, n in zip(prompts[1:], lengths[1:], strict=True)
            )
        )
    )
    head += await collect(first)
    together = [tokens_of(head), *(tokens_of(items) for items in await others)]
    assert together == alone
    assert hf_engine.scheduler.batched_steps > batched_before  # decodes did share forward passes
    assert hf_engine.stats()["batched_steps"] == hf_engine.scheduler.batched_steps


async def test_hf_engine_stops_on_eos(hf_engine: Any) -> None:
    first = tokens_of(await collect(hf_engine.generate(req(greedy([5, 6, 7], 3)))))
    items = await collect(hf_engine.generate(req({**greedy([5, 6, 7], 50), "eos_token_ids": [first[1]]})))
    assert tokens_of(items) == first[:2] and items[-1]["finish_reason"] == "stop"


async def test_hf_engine_sampling_is_seeded(hf_engine: Any) -> None:
    def sampled(seed: int) -> dict[str, Any]:
        return {
            "token_ids": [10, 11, 12],
            "stop_conditions": {"max_tokens": 24, "ignore_eos": True},
            "sampling_options": {"temperature": 1.0, "top_p": 0.95, "top_k": 100, "seed": seed},
        }

    runs = [tokens_of(await collect(hf_engine.generate(req(sampled(seed))))) for seed in (1, 1, 2)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert runs[0] != tokens_of(
        await collect(hf_engine.generate(req(greedy([10, 11, 12], 24, ignore_eos=True))))
    )


async def test_hf_engine_interleaves_a_short_request_with_a_long_one(hf_engine: Any) -> None:
    long_stream = hf_engine.generate(req(greedy([1, 2, 3], 400, ignore_eos=True)))
    got_long = [await long_stream.__anext__()]
    short = await collect(hf_engine.generate(req(greedy([4, 5], 5, ignore_eos=True))))
    assert len(short) == 5 and short[-1]["finish_reason"] == "length"
    # the short request finished while the long one was still running, not after it
    assert hf_engine.active == 1
    got_long += [item async for item in long_stream]
    assert len(got_long) == 400 and hf_engine.active == 0


async def test_hf_engine_cancellation_frees_the_sequence(hf_engine: Any) -> None:
    stream = hf_engine.generate(req(greedy([1, 2, 3], 500, ignore_eos=True)))
    await stream.__anext__()
    assert hf_engine.active == 1
    await stream.aclose()
    assert hf_engine.active == 0


async def test_hf_engine_rejects_requests_it_cannot_serve(hf_engine: Any) -> None:
    with pytest.raises(InvalidRequestError, match="context"):
        await collect(hf_engine.generate(req(greedy([1] * 1024, 4))))
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        await collect(hf_engine.generate(req(greedy([10**6], 4))))


# -- model cards


async def test_register_llm_publishes_a_card_that_leaves_with_its_instance(
    hf_engine: Any, tiny_path: Path
) -> None:
    from dynamo_nb.runtime.discovery.memory import STORE

    async with await DistributedRuntime.create() as rt:
        endpoint = rt.endpoint("cards.backend.generate")
        with pytest.raises(ConfigError, match="serve"):
            await register_llm(endpoint, tiny_path, model_name="tiny")  # not served yet
        server, card = await serve_llm(
            endpoint, hf_engine.generate, tiny_path, model_name="tiny", kv_cache_block_size=32
        )
        key = f"{CARD_PREFIX}cards/backend/generate/{server.instance_id:x}"
        stored = ModelCard.from_json(STORE.data[key])
        assert stored == card
        assert (stored.name, stored.kinds, stored.kv_cache_block_size, stored.context_length) == (
            "tiny",
            ["chat", "completions"],
            32,
            1024,
        )
        assert stored.eos_token_ids == [2, 0]
        await server.stop()
        assert key not in STORE.data


def test_card_options_are_checked(tiny_path: Path) -> None:
    with pytest.raises(ConfigError, match="kind"):
        card_from_folder(tiny_path, kinds="embedding")
    with pytest.raises(ConfigError, match="empty"):
        card_from_folder(tiny_path, name=" ")
    assert card_from_folder(tiny_path, kinds="prefill").kinds == ["prefill"]


async def test_a_card_hangs_on_the_etcd_lease(services: Any, tiny_path: Path, hf_engine: Any) -> None:
    import aetcd

    rt = await DistributedRuntime.create(services.etcd_url, "tcp")
    endpoint = rt.endpoint("leased.backend.generate")
    server, _ = await serve_llm(endpoint, hf_engine.generate, tiny_path, model_name="leased")
    key = f"{CARD_PREFIX}leased/backend/generate/{server.instance_id:x}".encode()
    host, port = services.etcd_url.removeprefix("etcd://").split(":")
    async with aetcd.Client(host=host, port=int(port)) as etcd:
        value = await etcd.get(key)
        assert value is not None and value.lease == rt.connection_id
        await rt.shutdown()
        assert await etcd.get(key) is None
    await asyncio.sleep(0)
