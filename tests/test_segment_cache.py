"""Prompts tokenized piece by piece between added tokens, each piece once: the same ids as the
tokenizer's own, only what is new tokenized, bounded memory, and tokenizers where it would not be
exact left to tokenize whole."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

from dynamo_nb.llm.segment_cache import SegmentCache
from dynamo_nb.llm.tokenizer import ModelTokenizer
from dynamo_nb.models import tiny_model_path

WORDS = ["the", " robot", "library", "é", "ü", "😀", "\n", "  ", "\t", "x", "<|im", "start|>", "12", "!", " "]


@pytest.fixture(scope="module")
def tiny() -> ModelTokenizer:
    return ModelTokenizer.load(tiny_model_path())


def random_text(rng: random.Random, specials: list[str]) -> str:
    return "".join(rng.choice(WORDS + specials) for _ in range(rng.randrange(0, 30)))


def test_random_conversations_get_the_tokenizers_own_ids_first_time_and_again(tiny: ModelTokenizer) -> None:
    rng = random.Random(7)
    cache = SegmentCache.for_tokenizer(tiny.tokenizer, min_chars=0)
    assert cache is not None
    specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    for _ in range(300):
        messages = [
            {"role": rng.choice(["system", "user", "assistant"]), "content": random_text(rng, specials)}
            for _ in range(rng.randrange(1, 5))
        ]
        prompt = tiny.render_chat(messages)
        for special in (True, False):
            own = tiny.tokenizer.encode(prompt, add_special_tokens=special).ids
            assert cache.encode(prompt, special) == own, prompt
            assert cache.encode(prompt, special) == own, prompt  # every piece found this time
    assert cache.enabled


def test_a_conversations_next_turn_tokenizes_only_what_is_new(tiny: ModelTokenizer) -> None:
    cache = SegmentCache.for_tokenizer(tiny.tokenizer, min_chars=0)
    assert cache is not None
    history = [{"role": "system", "content": "You answer in one sentence. " * 40}]
    for turn in range(5):
        history.append({"role": "user", "content": f"question {turn}: where do the robots sleep?"})
        prompt = tiny.render_chat(history)
        before = cache.tokenized_chars
        assert cache.encode(prompt) == tiny.tokenizer.encode(prompt).ids
        if turn:  # the system prompt and the earlier turns were seen: the last two messages are new
            new = sum(len(f"{message['role']}\n{message['content']}") for message in history[-2:])
            assert (
                cache.tokenized_chars - before == new
            )  # (a piece: "<|im_start|>" ROLE\nCONTENT "<|im_end|>")
        history.append({"role": "assistant", "content": f"answer {turn}: in the stacks."})


def test_the_cache_keeps_at_most_its_tokens_dropping_the_least_recently_used(tiny: ModelTokenizer) -> None:
    cache = SegmentCache.for_tokenizer(tiny.tokenizer, max_tokens=200, min_chars=0)
    assert cache is not None
    system = "<|im_start|>system\nYou are brief.<|im_end|>\n"
    for index in range(100):
        cache.encode(system + f"<|im_start|>user\nmessage number {index} about robots<|im_end|>\n")
        assert cache.tokens <= 200
    seen = cache.tokenized_chars
    cache.encode(system)  # used every time: still there
    assert cache.tokenized_chars == seen
    cache.encode("<|im_start|>user\nmessage number 0 about robots<|im_end|>\n")  # long gone: tokenized again
    assert cache.tokenized_chars > seen


def test_an_encode_that_differs_from_the_tokenizers_turns_the_cache_off(tiny: ModelTokenizer) -> None:
    cache = SegmentCache.for_tokenizer(tiny.tokenizer, check_every=1, min_chars=0)
    assert cache is not None
    prompt = "<|im_start|>user\nhello<|im_end|>\n"
    right = cache.encode(prompt)
    cache._ids["user\nhello"][0] += 1  # a piece's ids gone wrong (what the check is there to catch)
    assert cache.encode(prompt) == right and not cache.enabled
    assert cache.encode(prompt) == right


def bpe_tokenizer(**options: Any) -> Tokenizer:
    """A small byte-level BPE tokenizer trained here, with two added special tokens."""
    from tokenizers import trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = options.get("pre_tokenizer", pre_tokenizers.ByteLevel(add_prefix_space=False))
    tokenizer.decoder = decoders.ByteLevel()
    if "normalizer" in options:
        tokenizer.normalizer = options["normalizer"]
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["the robot reads in the library " * 20, "hello world " * 20], trainer)
    tokenizer.add_special_tokens([AddedToken("<s>", **options.get("token", {})), AddedToken("</s>")])
    return tokenizer


def test_tokenizers_whose_pieces_depend_on_their_neighbours_are_tokenized_whole() -> None:
    assert SegmentCache.for_tokenizer(bpe_tokenizer()) is not None
    assert SegmentCache.for_tokenizer(bpe_tokenizer(token={"lstrip": True})) is None
    assert SegmentCache.for_tokenizer(bpe_tokenizer(token={"single_word": True})) is None
    assert SegmentCache.for_tokenizer(bpe_tokenizer(normalizer=normalizers.Lowercase(),
                                                    token={"normalized": True})) is None  # fmt: skip
    first_only = pre_tokenizers.Metaspace(prepend_scheme="first")  # a space before the first piece only
    tokenizer = bpe_tokenizer(pre_tokenizer=first_only)
    text = "hello<s>world"
    whole = tokenizer.encode(text).ids
    apart = [*tokenizer.encode("hello").ids, tokenizer.token_to_id("<s>"), *tokenizer.encode("world").ids]
    assert whole != apart  # pieces apart would be wrong here: the probes see it
    assert SegmentCache.for_tokenizer(tokenizer) is None


def test_a_short_prompt_is_tokenized_whole_and_a_long_ones_pieces_are_kept(tiny: ModelTokenizer) -> None:
    cache = tiny.segments
    assert cache is not None and cache.min_chars > 100
    short = tiny.render_chat([{"role": "user", "content": "hi there"}])
    assert tiny.encode(short) == tiny.tokenizer.encode(short).ids and cache.tokens == 0
    system = {"role": "system", "content": "You are a librarian robot. " * 60}
    long = tiny.render_chat([system, {"role": "user", "content": "where is the atlas?"}])
    assert len(long) >= cache.min_chars
    assert tiny.encode(long) == tiny.tokenizer.encode(long).ids and cache.tokens > 0
