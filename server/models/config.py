"""The architecture-neutral view of a Hugging Face `config.json`."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from server.errors import ModelLoadError

# Architectures this server implements, by the name HF writes in `architectures`.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelConfig:
        path = model_dir / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{model_dir} has no config.json; pass a Hugging Face model directory")
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"cannot read {path}: {exc}") from exc
        return cls.from_hf_dict(raw)

    @classmethod
    def from_hf_dict(cls, raw: dict) -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = archs[0] if archs else ""
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {arch or '(none given)'!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        _reject_rope_scaling(raw)
        num_heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            architecture=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden // num_heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(raw),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama says so in its config.
            attention_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            eos_token_ids=eos_ids,
        )


def _rope_theta(raw: dict) -> float:
    params = raw.get("rope_parameters") or {}
    return float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))


def _reject_rope_scaling(raw: dict) -> None:
    # Scaled RoPE variants change every position's rotation; serving them with plain RoPE
    # would silently produce wrong tokens, so refuse rather than guess.
    for key in ("rope_scaling", "rope_parameters"):
        params = raw.get(key) or {}
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in ("default", None):
            raise ModelLoadError(f"RoPE scaling type {kind!r} is not supported yet (only the default RoPE)")
