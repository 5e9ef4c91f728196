"""Tiny random-weight checkpoints built locally: the demo model and the tests' models.

Nothing is downloaded: weights are seeded random tensors written with `save_pretrained`,
the tokenizer is a byte-level BPE trained on text shipped in this package.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import platformdirs

CORPUS = Path(__file__).with_name("demo_corpus.txt")
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>", "<think>", "</think>")
# Bump when the demo checkpoint's recipe changes so old caches are not reused.
DEMO_VERSION = 2  # 2: a tokenizer_config.json that transformers 4.x loads too
# ChatML, with the agent shapes: an assistant turn's tool calls, and a tool turn's answer.
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is not none %}{{ m['content'] }}{% endif %}"
    "{% for c in m['tool_calls'] or [] %}<tool_call>{{ c['function']['name'] }} "
    "{{ c['function']['arguments'] if c['function']['arguments'] is string else c['function']['arguments'] | tojson }}"
    "</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True, slots=True)
class CheckpointSpec:
    architecture: str = "LlamaForCausalLM"
    vocab_size: int = 512
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    # Larger than HF's 0.02 so that random logits are peaked, not near-uniform ties.
    initializer_range: float = 0.25
    seed: int = 0


DEMO_SPEC = CheckpointSpec(
    vocab_size=2048, hidden_size=256, intermediate_size=704, num_layers=4,
    num_heads=8, num_kv_heads=4, max_position_embeddings=4096, initializer_range=0.08,
)


def train_tokenizer(vocab_size: int):  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(CORPUS.read_text().splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)
    fast.chat_template = DEFAULT_CHAT_TEMPLATE
    return fast


def _hf_config(spec: CheckpointSpec, eos_id: int, vocab_size: int):  # -> transformers.PretrainedConfig
    import transformers

    kwargs = dict(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings, initializer_range=spec.initializer_range,
        eos_token_id=eos_id, bos_token_id=None, pad_token_id=eos_id,
    )
    if spec.head_dim is not None:
        kwargs["head_dim"] = spec.head_dim
    config_cls = {
        "LlamaForCausalLM": transformers.LlamaConfig,
        "Qwen2ForCausalLM": transformers.Qwen2Config,
        "Qwen3ForCausalLM": transformers.Qwen3Config,
    }[spec.architecture]
    return config_cls(**kwargs)


def build_checkpoint(out_dir: Path, spec: CheckpointSpec) -> Path:
    """Write a complete HF model directory (config, safetensors, tokenizer) to `out_dir`."""
    import torch
    import transformers

    tokenizer = train_tokenizer(spec.vocab_size)
    vocab_size = max(spec.vocab_size, len(tokenizer))
    config = _hf_config(spec, tokenizer.convert_tokens_to_ids(EOS_TOKEN), vocab_size)
    torch.manual_seed(spec.seed)
    model_cls = getattr(transformers, spec.architecture)
    model = model_cls(config).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _portable_tokenizer_config(out_dir)
    return out_dir


def _portable_tokenizer_config(out_dir: Path) -> None:
    """transformers 5 saves `"tokenizer_class": "TokenizersBackend"`, a class 4.x does not have, and
    the chat template in a file of its own that 4.x before 4.50 does not read. The class both
    versions know for a tokenizer.json-backed tokenizer is PreTrainedTokenizerFast; the template
    goes in the config as well, where every version looks."""
    path = out_dir / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = DEFAULT_CHAT_TEMPLATE
    config.pop("backend", None)  # a transformers 5 key; 4.x would pass it on as an init argument
    path.write_text(json.dumps(config, indent=2) + "\n")


def demo_model_dir() -> Path:
    return Path(platformdirs.user_cache_dir("tokenledger")) / f"demo-model-v{DEMO_VERSION}"


def ensure_demo_model() -> Path:
    """Build the demo checkpoint on first use; later calls return the cached directory."""
    target = demo_model_dir()
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so concurrent first uses never see half a model.
    staging = Path(tempfile.mkdtemp(prefix=".demo-build-", dir=target.parent))
    try:
        build_checkpoint(staging, DEMO_SPEC)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def model_dir_for(model_path: str | None) -> Path:
    """The directory to serve: the given one, or the built-in demo model."""
    return Path(model_path) if model_path else ensure_demo_model()
