"""Load a local Hugging Face checkpoint (config.json + *.safetensors) into `CausalLM`."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from server.errors import ModelLoadError
from server.models.causal_lm import CausalLM
from server.models.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ModelLoadError(f"unsupported --dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def load_model(model_dir: Path, dtype: torch.dtype) -> CausalLM:
    cfg = ModelConfig.from_dir(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{model_dir} has no *.safetensors weights")
    model = CausalLM(cfg)
    params = dict(model.named_parameters())
    expected = _checkpoint_names(params, cfg)
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name not in expected:
                    if name == "lm_head.weight" and cfg.tie_word_embeddings:
                        continue
                    raise ModelLoadError(f"{file.name}: unexpected tensor {name!r} for {cfg.architecture}")
                target, rows = expected[name]
                _copy_into(params[target], rows, f.get_tensor(name), name)
                loaded.add(name)
    if cfg.tie_word_embeddings:
        loaded.add("lm_head.weight")
    missing = sorted(set(expected) - loaded)
    if missing:
        raise ModelLoadError(f"{model_dir}: weights missing for {missing[:5]}")
    return model.to(dtype).eval()


# Checkpoint tensors that land in a row block of one fused parameter: (HF module, fused module, block).
_FUSED = (("q_proj", "qkv_proj", 0), ("k_proj", "qkv_proj", 1), ("v_proj", "qkv_proj", 2),
          ("gate_proj", "gate_up_proj", 0), ("up_proj", "gate_up_proj", 1))


def _checkpoint_names(params: dict[str, torch.nn.Parameter], cfg: ModelConfig) -> dict[str, tuple[str, slice | None]]:
    """Every tensor name the checkpoint must hold → (our parameter, the rows it fills; None: all)."""
    q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    blocks = {"qkv_proj": [slice(0, q), slice(q, q + kv), slice(q + kv, q + 2 * kv)],
              "gate_up_proj": [slice(0, inter), slice(inter, 2 * inter)]}
    names: dict[str, tuple[str, slice | None]] = {}
    for name in params:
        fused = next(((hf, fused, block) for hf, fused, block in _FUSED if f".{fused}." in name), None)
        if fused is None:
            names[name] = (name, None)
            continue
        for hf, module, block in _FUSED:
            if module == fused[1]:
                names[name.replace(f".{module}.", f".{hf}.")] = (name, blocks[module][block])
    return names


def _copy_into(param: torch.nn.Parameter, rows: slice | None, tensor: torch.Tensor, name: str) -> None:
    target = param if rows is None else param[rows]
    if target.shape != tensor.shape:
        raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
    with torch.no_grad():
        target.copy_(tensor.to(param.dtype))
