"""One decoder-only transformer covering Llama, Qwen2 (QKV bias) and Qwen3 (q/k RMSNorm).

The model never touches the KV cache itself: each layer hands its projected q/k/v to the
batch's `AttentionContext`, which stores k/v in the pool and attends over each
request's own tokens. That keeps the model identical for prefill, chunked extend and decode.
"""
from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from server.models.config import ModelConfig


class AttentionContext(Protocol):
    def attend(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] for this forward's tokens → [T, Hq, D]."""
        ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and cast back before the weight, as the HF reference does (one fused op).
        normed = nn.functional.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin per position, computed once for every position the model can see and looked up per
    forward (the same fp32 arithmetic as computing them per step, so HF parity is unchanged)."""

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, theta: float, max_positions: int) -> None:
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.register_buffer("inv_freq", 1.0 / (theta**exponents), persistent=False)
        self.max_positions = max_positions
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, positions: torch.Tensor, dtype: torch.dtype,
                needed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`needed`: max(positions) + 1 when the caller knows it on the host (on a device, reading it
        back would wait for every forward queued before this one)."""
        if needed is None:
            needed = int(positions.max()) + 1 if positions.numel() else 0
        if needed > self.max_positions:  # past the model's configured context (--context-length): compute
            return self._compute(positions, dtype)
        cos, sin = self._table(dtype, needed)
        # [T, 1, D] so it broadcasts over heads.
        return cos[positions][:, None, :], sin[positions][:, None, :]

    def _table(self, dtype: torch.dtype, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Grown by doubling up to `max_positions`, so a 128k-context model pays only for what it uses."""
        table = self._tables.get(dtype)
        if table is None or table[0].shape[0] < needed:
            size = min(self.max_positions, max(1024, 1 << (max(needed, 1) - 1).bit_length()))
            cos, sin = self._compute(torch.arange(size, device=self.inv_freq.device), dtype)
            table = self._tables[dtype] = (cos[:, 0, :].contiguous(), sin[:, 0, :].contiguous())
        return table

    def _compute(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        # q, k and v in one matmul; the loader writes HF's q_proj/k_proj/v_proj into its row blocks.
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        # Llama's o_proj bias follows attention_bias too; Qwen2/3 never have one.
        o_bias = bias and cfg.architecture == "LlamaForCausalLM"
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=o_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        q = q.reshape(tokens, self.num_heads, self.head_dim)
        k = k.reshape(tokens, self.num_kv_heads, self.head_dim)
        v = v.reshape(tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = ctx.attend(self.layer_id, q, k, v)
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # gate and up in one matmul (the loader fills its two row blocks).
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer_id)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings)


class CausalLM(nn.Module):
    """`forward` returns final-normed hidden states; `logits` projects chosen rows."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.compiled = "eager"  # or "inductor" once server.models.compiled has compiled the trunk
        self.model = DecoderModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttentionContext,
                num_positions: int | None = None) -> torch.Tensor:
        """`num_positions`: max(positions) + 1, when known on the host (see RotaryEmbedding.forward)."""
        cos, sin = self.model.rotary_emb(positions, self.model.embed_tokens.weight.dtype, num_positions)
        return self.trunk(input_ids, cos, sin, ctx)

    def trunk(self, input_ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              ctx: AttentionContext) -> torch.Tensor:
        """Embedding, every layer and the final norm: what `server.models.compiled` hands to inductor
        (the rotary table's host-side bookkeeping stays outside, in `forward`)."""
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, ctx)
        return self.model.norm(x)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # Sampling and logprobs always work in fp32, whatever the model dtype.
        return self.lm_head(hidden).float()
