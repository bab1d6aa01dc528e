"""The built-in tiny model writes words: greedy completions of five fixed prompts (English,
Python, chat) are mostly words and names found in the standard library's text, where the random
model's are mostly not (the same check, so it can fail); it is a small Llama folder that the
hf engine serves, and its chat answers end by themselves."""

from __future__ import annotations

import json
import re
import sysconfig
from functools import cache
from pathlib import Path

import pytest
from helpers import collect, req

from dynamo_nb.engines import HFEngine
from dynamo_nb.llm import ModelTokenizer
from dynamo_nb.models import random_model_path, tiny_model_path

pytestmark = pytest.mark.timeout(120)

PROMPTS = [
    ("text", "Return the"),
    ("text", "This module provides"),
    ("text", "Example::\n\n    "),
    ("chat", "What does sorted do?"),
    ("chat", "What does urlopen do?"),
]
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]+")


@cache
def dictionary() -> frozenset[str]:
    """Every word and identifier (two characters or more) in the standard library's source."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    words: set[str] = set()
    for path in stdlib.glob("*.py"):
        words.update(w.lower() for w in WORD.findall(path.read_text(encoding="utf-8", errors="ignore")))
    return frozenset(words)


async def completions(folder: Path) -> list[str]:
    tokenizer = ModelTokenizer.load(folder)
    engine = await HFEngine.load(folder, device="cpu", prefix_cache_blocks=0)
    texts = []
    try:
        for kind, prompt in PROMPTS:
            if kind == "chat":
                ids = tokenizer.encode(
                    tokenizer.render_chat([{"role": "user", "content": prompt}]), add_special_tokens=False
                )
            else:
                ids = tokenizer.encode(prompt, add_special_tokens=False)
            request = {
                "token_ids": ids,
                "stop_conditions": {"max_tokens": 32},
                "sampling_options": {"temperature": 0},
            }
            items = await collect(engine.generate(req(request)))
            texts.append(tokenizer.decode([t for item in items for t in item["token_ids"]]))
    finally:
        await engine.close()
    return texts


def share_of_words(texts: list[str]) -> float:
    words = [w.lower() for text in texts for w in WORD.findall(text)]
    return sum(w in dictionary() for w in words) / max(len(words), 1)


async def test_the_tiny_model_writes_words_and_the_random_one_does_not() -> None:
    tiny = await completions(tiny_model_path())
    assert all(text.strip() for text in tiny), tiny
    assert share_of_words(tiny) >= 0.8, tiny
    assert share_of_words(await completions(random_model_path())) < 0.6  # the check tells noise apart


def test_the_tiny_model_is_a_small_llama_folder_with_its_training_record() -> None:
    folder = tiny_model_path()
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    size = sum(path.stat().st_size for path in folder.iterdir())
    assert size <= 20 * 1024 * 1024
    record = json.loads((folder / "training.json").read_text())
    assert record["parameters"] <= 5_000_000 and record["steps"] > 0
    assert record["losses"][-1]["loss"] < record["losses"][0]["loss"] / 2  # it learned


def test_use_model_is_the_one_parameter_every_launched_worker_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """`use_model` picks the folder and device (argument, else environment, else the tiny model on
    auto) and exports them, so the workers' flags default to them; a frontend's never do."""
    import os

    from dynamo_nb import ConfigError
    from dynamo_nb.flags import frontend_parser, hf_worker_parser
    from dynamo_nb.models import use_model

    for name in ("DYN_NB_MODEL_PATH", "DYN_NB_MODEL_NAME", "DYN_NB_DEVICE"):
        monkeypatch.setenv(name, "")  # recorded, so that what use_model exports is undone after the test
        monkeypatch.delenv(name)
    tiny = use_model()
    assert (tiny.path, tiny.name, tiny.device) == (tiny_model_path(), "tiny-llama", "auto")
    monkeypatch.setenv("DYN_NB_MODEL_PATH", str(random_model_path()))
    monkeypatch.delenv("DYN_NB_MODEL_NAME")
    chosen = use_model(device="cpu")
    assert (chosen.path, chosen.name) == (random_model_path(), random_model_path().name)
    assert os.environ["DYN_NB_DEVICE"] == "cpu" and os.environ["DYN_NB_MODEL_NAME"] == chosen.name
    worker = hf_worker_parser().parse_args([])
    assert (worker.model_path, worker.model_name, worker.device) == (str(chosen.path), chosen.name, "cpu")
    frontend = frontend_parser().parse_args(["--discovery", "etcd://127.0.0.1:2379"])
    assert frontend.model_path is None and frontend.model_name is None  # static mode's flags only
    assert use_model(tiny_model_path()).name == "tiny-llama"  # a name exported for another folder is not kept
    with pytest.raises(ConfigError, match="MODEL_PATH '/no/such' is not a directory"):
        use_model("/no/such")
    with pytest.raises(ConfigError, match="use auto, cpu, cuda or cuda:N"):
        use_model(device="tpu")
