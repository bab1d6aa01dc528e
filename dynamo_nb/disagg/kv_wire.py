"""The KV cache of one prompt as a JSON header plus raw tensor bytes (no pickle), checked on arrival.

Per layer, the keys then the values, each a contiguous ``[1, kv_heads, tokens, head_dim]``
tensor of one dtype, written as its raw bytes. The header says the format, dtype, shape,
layer count, prompt length and the first token the prefill sampled; `unpack_kv` refuses a
payload that does not match it or the receiving model, with a message naming the mismatch.

Example::

    header, payload = pack_kv(cache_layers, first_token=311)
    layers = unpack_kv(header, payload, expect=KVLayout.of(model.config))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import DisaggregationError

__all__ = ["KV_FORMAT", "KVLayout", "check_header", "pack_kv", "unpack_kv"]

KV_FORMAT = "dynamo_nb.kv.v1"
_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class KVLayout:
    """What a model's KV cache looks like: layers, KV heads, head size."""

    layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: Any) -> KVLayout:
        """The layout of a transformers model config (Llama-style attention)."""
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.num_hidden_layers, kv_heads, head_dim)


def pack_kv(layers: list[tuple[Any, Any]], *, first_token: int) -> tuple[dict[str, Any], bytes]:
    """Header and payload for ``[(keys, values), …]`` (torch tensors, one per layer)."""
    import torch

    if not layers:
        raise DisaggregationError("the KV cache to send is empty")
    keys0 = layers[0][0]
    dtype = str(keys0.dtype).removeprefix("torch.")
    chunks = []
    for keys, values in layers:
        for tensor in (keys, values):
            if tuple(tensor.shape) != tuple(keys0.shape) or tensor.dtype != keys0.dtype:
                raise DisaggregationError("every layer's keys and values must share one shape and dtype")
            chunks.append(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    payload = b"".join(chunks)
    header = {
        "format": KV_FORMAT,
        "dtype": dtype,
        "layers": len(layers),
        "shape": list(keys0.shape),
        "prompt_tokens": int(keys0.shape[2]),
        "first_token": int(first_token),
        "payload_bytes": len(payload),
    }
    return header, payload


def check_header(header: Any, payload_size: int, expect: KVLayout | None = None) -> None:
    """Raise `DisaggregationError` unless ``header`` describes a payload of ``payload_size`` bytes
    (and, with ``expect``, a cache that fits that model)."""
    if not isinstance(header, dict) or header.get("format") != KV_FORMAT:
        raise DisaggregationError(f"not a {KV_FORMAT} KV header: {str(header)[:200]}")
    dtype, layers, shape = header.get("dtype"), header.get("layers"), header.get("shape")
    if dtype not in _DTYPES:
        raise DisaggregationError(f"KV dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    if not (isinstance(shape, list) and len(shape) == 4 and all(isinstance(d, int) and d > 0 for d in shape)):
        raise DisaggregationError(f"KV shape must be [1, kv_heads, tokens, head_dim], got {shape!r}")
    if shape[0] != 1 or not isinstance(layers, int) or layers < 1:
        raise DisaggregationError(f"KV header has batch {shape[0]} and {layers!r} layers; expected batch 1")
    if not isinstance(header.get("first_token"), int) or header.get("prompt_tokens") != shape[2]:
        raise DisaggregationError("KV header needs first_token and prompt_tokens equal to shape[2]")
    itemsize = 4 if dtype == "float32" else 2
    expected = layers * 2 * shape[0] * shape[1] * shape[2] * shape[3] * itemsize
    if header.get("payload_bytes") != expected or payload_size != expected:
        raise DisaggregationError(
            f"KV payload is {payload_size} bytes (header says {header.get('payload_bytes')}); "
            f"{layers} layers of {shape} {dtype} need {expected}"
        )
    if expect is not None and (layers, shape[1], shape[3]) != (
        expect.layers,
        expect.kv_heads,
        expect.head_dim,
    ):
        raise DisaggregationError(
            f"KV cache of {layers} layers × {shape[1]} heads × {shape[3]} dims does not fit this model "
            f"({expect.layers} × {expect.kv_heads} × {expect.head_dim}): are prefill and decode serving the same model?"
        )


def unpack_kv(
    header: dict[str, Any], payload: bytes, *, expect: KVLayout | None = None, device: str = "cpu"
) -> list[tuple[Any, Any]]:
    """``[(keys, values), …]`` tensors from a checked header and payload."""
    import torch

    check_header(header, len(payload), expect)
    dtype = getattr(torch, header["dtype"])
    shape = header["shape"]
    size = len(payload) // (header["layers"] * 2)
    flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    tensors = [
        flat[i * size : (i + 1) * size].view(dtype).reshape(shape).to(device)
        for i in range(header["layers"] * 2)
    ]
    return [(tensors[2 * i], tensors[2 * i + 1]) for i in range(header["layers"])]
