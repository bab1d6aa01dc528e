"""A forward pass with a KV cache (`forward_with_cache`): the installed transformers takes the
cache under the name it declares, without a deprecation warning, and decoding one token on the
extended cache gives the logits of the whole sequence run at once."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from dynamo_nb.engines import forward_with_cache, new_kv_cache
from dynamo_nb.engines.model_calls import cache_argument

torch = pytest.importorskip("torch", reason="the hf extra (torch) is not installed")
transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")


def test_the_cache_goes_by_the_name_the_forward_declares() -> None:
    class Renamed:
        def forward(
            self, input_ids: object = None, cache: object = None, use_cache: bool = False
        ) -> None: ...

    class Classic:
        def forward(self, input_ids: object = None, past_key_values: object = None) -> None: ...

    assert cache_argument(Renamed()) == "cache"
    assert cache_argument(Classic()) == "past_key_values"


def test_decoding_on_the_extended_cache_matches_the_whole_sequence(tiny_path: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    ids = torch.tensor([[1, 45, 33, 38, 26, 12]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecated argument name would raise here
        cache = new_kv_cache(model)
        forward_with_cache(model, cache, input_ids=ids[:, :-1])
        assert cache.get_seq_length() == ids.shape[1] - 1
        stepped = forward_with_cache(model, cache, input_ids=ids[:, -1:]).logits[0, -1]
        whole = model(input_ids=ids).logits[0, -1]
    assert cache.get_seq_length() == ids.shape[1]
    assert torch.allclose(stepped, whole, atol=1e-4)
