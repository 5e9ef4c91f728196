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
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name not in params:
                    if name == "lm_head.weight" and cfg.tie_word_embeddings:
                        continue
                    raise ModelLoadError(f"{file.name}: unexpected tensor {name!r} for {cfg.architecture}")
                _copy_into(params[name], f.get_tensor(name), name)
                loaded.add(name)
    if cfg.tie_word_embeddings:
        loaded.add("lm_head.weight")
    missing = sorted(set(params) - loaded)
    if missing:
        raise ModelLoadError(f"{model_dir}: weights missing for {missing[:5]}")
    return model.to(dtype).eval()


def _copy_into(param: torch.nn.Parameter, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ModelLoadError(f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))
