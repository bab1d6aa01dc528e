"""Train the built-in tiny model: a small Llama that writes plausible English and Python.

Data: the docstrings of this Python's standard library (PSF license), read with ``ast`` from
the ``.py`` files of ``sysconfig.get_paths()["stdlib"]`` (not ``site-packages``, not the test
suites). Each docstring appears twice: as plain text, and as the assistant's answer in a
ChatML conversation whose user asks what the documented name does, so chat completions
answer in the same register and end with ``<|im_end|>``.

Model: the byte-level BPE tokenizer (2048 tokens, the same special tokens and chat template
as the random model) trained on that text, and a Llama (4 layers, hidden 160, tied
embeddings, about 1.6 M parameters) trained from seed 0 with AdamW on 128-token windows.
The folder it writes is an ordinary Hugging Face model folder (vLLM loads it too); the
package ships the result in ``dynamo_nb/models/tiny_llama/``.

    python models/train_tiny.py [--steps 3000] [--out dynamo_nb/models/tiny_llama]

It prints the loss every 100 steps and greedy samples at the end, and writes
``training.json`` (data, steps, losses, time) into the folder.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import math
import platform
import random
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dynamo_nb.models.random_model import chat_tokenizer, end_token_ids, llama_config, train_bpe_tokenizer  # noqa: E402

VOCAB_SIZE = 2048
WINDOW = 128
BATCH = 16
SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


def docstrings() -> list[tuple[str, str]]:
    """``(qualified name, cleaned docstring)`` of every module, class and function of the
    standard library, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(stdlib.rglob("*.py")):
        if SKIP_DIRS & set(path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(path.relative_to(stdlib).with_suffix("").parts).removesuffix(".__init__")
        nodes = [(module, tree)] + [
            (f"{module}.{node.name}", node)
            for node in ast.walk(tree)
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        for name, node in nodes:
            text = ast.get_docstring(node, clean=False)
            if text and len(text) >= 40 and text.isascii():
                found.append((name, inspect.cleandoc(text)))
    return found


def corpus(docs: list[tuple[str, str]]) -> list[str]:
    """The training texts: each docstring plain, and as a chat answer."""
    texts = []
    for name, text in docs:
        texts.append(text + "<|endoftext|>")
        short = name.rsplit(".", 1)[-1]
        texts.append(
            f"<|im_start|>user\nWhat does {short} do?<|im_end|>\n<|im_start|>assistant\n{text}<|im_end|>\n"
        )
    random.Random(0).shuffle(texts)
    return texts


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=ROOT / "dynamo_nb" / "models" / "tiny_llama")
    args = parser.parse_args()

    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    started = time.time()
    torch.manual_seed(0)
    docs = docstrings()
    texts = corpus(docs)
    raw = train_bpe_tokenizer(texts, VOCAB_SIZE)
    ids = [i for text in texts for i in raw.encode(text).ids]
    data = torch.tensor(ids, dtype=torch.long)
    print(
        f"{len(docs)} docstrings, {sum(map(len, texts)) / 1e6:.1f} M characters, {len(ids) / 1e6:.2f} M tokens"
    )

    eos_ids = end_token_ids(raw)
    config = llama_config(
        raw,
        hidden_size=160,
        intermediate_size=432,
        num_hidden_layers=4,
        num_attention_heads=5,
        num_key_value_heads=5,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    print(f"{params / 1e6:.2f} M parameters")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = 100
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: (
            min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, args.steps) / args.steps))
        ),
    )
    generator = torch.Generator().manual_seed(0)
    losses = []
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, len(data) - WINDOW - 1, (BATCH,), generator=generator)
        batch = torch.stack([data[s : s + WINDOW + 1] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss  # the model shifts the labels itself
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == args.steps - 1:
            value = float(loss.detach())
            losses.append({"step": step, "loss": round(value, 4)})
            print(f"step {step:5d}  loss {value:.3f}  {time.time() - started:.0f} s", flush=True)
    model.eval()

    tokenizer = chat_tokenizer(raw)
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=config.pad_token_id)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    for prompt in ("Return the", "def read_file(path):"):
        input_ids = torch.tensor([raw.encode(prompt).ids])
        with torch.no_grad():
            output = model.generate(input_ids, max_new_tokens=24, do_sample=False)
        print(repr(prompt), "->", repr(raw.decode(output[0, input_ids.shape[1] :].tolist())))
    record = {
        "data": "docstrings of the Python standard library (PSF license), plain and as ChatML answers",
        "python": platform.python_version(),
        "docstrings": len(docs),
        "tokens": len(ids),
        "vocab_size": raw.get_vocab_size(),
        "parameters": params,
        "steps": args.steps,
        "batch": f"{BATCH} x {WINDOW} tokens",
        "optimizer": "AdamW lr 3e-3, 100 warm-up steps, cosine decay, weight decay 0.01, clip 1.0, seed 0",
        "losses": losses,
        "seconds": round(time.time() - started),
        "machine": f"{platform.machine()}, torch {torch.__version__}",
    }
    (args.out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
