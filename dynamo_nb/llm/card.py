"""Model cards: what a worker publishes so that a frontend can serve its model.

A card names the model, the endpoint that serves it, the model folder (tokenizer and chat
template), what kind of requests it takes, its KV block size and its runtime config. It is
stored in discovery under ``v1/mdc/{namespace}/{component}/{endpoint}/{instance_id:x}`` and
disappears with its instance (server stopped, runtime shut down, or etcd lease expired);
`dynamo_nb.llm.register` publishes it.

Example:
    >>> card = ModelCard(name="tiny", endpoint="dynamo.backend.generate", model_path="/models/tiny")
    >>> ModelCard.from_json(card.to_json()).kinds
    ['chat', 'completions']
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ProtocolError
from ..models.folders import check_model_dir
from ..runtime.names import EndpointPath

__all__ = [
    "CARD_PREFIX",
    "MODEL_KINDS",
    "STRUCTURED_OUTPUT",
    "ModelCard",
    "ModelRuntimeConfig",
    "card_from_folder",
    "card_key",
    "check_model_dir",
    "has_chat_template",
]

CARD_PREFIX = "v1/mdc/"
MODEL_KINDS = ("chat", "completions", "prefill", "decode")
DEFAULT_KV_BLOCK_SIZE = 16


def card_key(path: EndpointPath, instance_id: int) -> str:
    """The discovery key of the card of one instance."""
    return f"{CARD_PREFIX}{path.namespace}/{path.component}/{path.endpoint}/{instance_id:x}"


@dataclass
class ModelRuntimeConfig:
    """What a worker tells routers about its engine.

    ``disaggregated_endpoint`` (``{"bootstrap_host", "bootstrap_port"}``) is set by prefill
    workers whose engine runs a bootstrap server.
    """

    total_kv_blocks: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    disaggregated_endpoint: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ModelRuntimeConfig:
        data = data or {}
        known = {
            k: data[k] for k in ("total_kv_blocks", "max_num_seqs", "max_num_batched_tokens") if k in data
        }
        return cls(
            **known, disaggregated_endpoint=data.get("disaggregated_endpoint"), extra=data.get("extra") or {}
        )


STRUCTURED_OUTPUT = "structured_output"
"""A worker's ``runtime_config.extra`` key: its engine enforces ``guided_decoding`` (`dynamo_nb.llm.guided`)."""


@dataclass
class ModelCard:
    """A served model, as published by `register_llm` (Dynamo's model deployment card)."""

    name: str
    endpoint: str
    model_path: str
    kinds: list[str] = field(default_factory=lambda: ["chat", "completions"])
    kv_cache_block_size: int = DEFAULT_KV_BLOCK_SIZE
    context_length: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    runtime_config: ModelRuntimeConfig = field(default_factory=ModelRuntimeConfig)
    instance_id: int = 0

    @property
    def path(self) -> EndpointPath:
        return EndpointPath.parse(self.endpoint)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> ModelCard:
        """Parse a card; raises ValueError for anything that is not one."""
        data = json.loads(raw)
        if not isinstance(data, dict) or not data.get("name") or not data.get("endpoint"):
            raise ProtocolError("not a model card: needs 'name' and 'endpoint'")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "runtime_config"}
        return cls(**known, runtime_config=ModelRuntimeConfig.from_dict(data.get("runtime_config")))


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} when the file is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


def card_from_folder(
    model_path: str | Path,
    *,
    name: str | None = None,
    endpoint: str = "dynamo.backend.generate",
    kinds: list[str] | tuple[str, ...] | str | None = None,
    kv_cache_block_size: int = DEFAULT_KV_BLOCK_SIZE,
    runtime_config: ModelRuntimeConfig | dict[str, Any] | None = None,
    context_length: int | None = None,
) -> ModelCard:
    """Build the card of the model in ``model_path`` (reads config, generation config, tokenizer config).

    Example:
        >>> from dynamo_nb.models import tiny_model_path
        >>> card_from_folder(tiny_model_path(), name="tiny").context_length
        1024
    """
    folder = check_model_dir(model_path)
    if name is not None and not name.strip():
        raise ConfigError("model name is empty: give a name such as 'tiny-llama', or leave it out")
    kind_list = _kinds(kinds, folder)
    if not isinstance(kv_cache_block_size, int) or kv_cache_block_size < 1:
        raise ConfigError(f"kv_cache_block_size must be a positive integer, got {kv_cache_block_size!r}")
    EndpointPath.parse(endpoint)
    config = read_json_object(folder / "config.json")
    generation = read_json_object(folder / "generation_config.json")
    eos = _ids(generation.get("eos_token_id")) or _ids(config.get("eos_token_id"))
    if isinstance(runtime_config, dict):
        runtime_config = ModelRuntimeConfig.from_dict(runtime_config)
    return ModelCard(
        name=name or folder.name,
        endpoint=endpoint,
        model_path=str(folder),
        kinds=kind_list,
        kv_cache_block_size=kv_cache_block_size,
        context_length=context_length or config.get("max_position_embeddings"),
        eos_token_ids=eos,
        runtime_config=runtime_config or ModelRuntimeConfig(),
    )


def has_chat_template(folder: Path) -> bool:
    """Whether the tokenizer in ``folder`` has a chat template."""
    return (folder / "chat_template.jinja").is_file() or bool(
        read_json_object(folder / "tokenizer_config.json").get("chat_template")
    )


def _kinds(kinds: list[str] | tuple[str, ...] | str | None, folder: Path) -> list[str]:
    if kinds is None:
        return ["chat", "completions"] if has_chat_template(folder) else ["completions"]
    kind_list = [k.strip() for k in kinds.split(",")] if isinstance(kinds, str) else list(kinds)
    bad = [k for k in kind_list if k not in MODEL_KINDS]
    if bad or not kind_list:
        raise ConfigError(f"unknown model kind {bad or kind_list!r}: use any of {', '.join(MODEL_KINDS)}")
    if "chat" in kind_list and not has_chat_template(folder):
        raise ConfigError(
            f"kind 'chat' needs a chat template, and {folder} has none (no chat_template.jinja or "
            "tokenizer_config.json 'chat_template'); register with kind='completions'"
        )
    return kind_list
