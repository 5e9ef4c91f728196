"""Builds the scheduler and everything under it (model, pools, tokenizer) from ServerArgs."""
from __future__ import annotations

import hashlib
import platform
from dataclasses import dataclass
from pathlib import Path

import torch

from commitlog import Durability, Ledger, WalConfig
from kernels.builds import engine_builds
from server.config import ServerArgs
from server.device import kv_budget_bytes, resolve_device
from server.errors import ConfigError
from server.grammar.compiler import GrammarCompiler
from server.grammar.reasoning import THINK_END, THINK_START, ReasoningParser
from server.memory import ReqToTokenPool, TokenToKVPool
from server.model_runner import ModelRunner, torch_threads
from server.models.causal_lm import CausalLM
from server.models.compiled import compile_trunk, wants_compile, warm_up
from server.models.config import ModelConfig
from server.models.demo import model_dir_for
from server.models.loader import load_model, parse_dtype
from server.models.packed_linear import apply_linear_backend
from server.radix_cache import RadixCache
from server.request_builder import Limits
from server.result_processing import FinishRules
from server.sampling.sampler import sampler_name
from server.schedule_policy import SchedulePolicy
from server.scheduler import DeltaSink, Scheduler
from server.tokenizer import Tokenizer

# Share of physical memory (CPU), or of the device memory free after loading the weights (CUDA), the
# KV pool may take when --max-total-tokens is not given. A GPU leaves room for activations only.
KV_MEMORY_FRACTION = 0.2
KV_CUDA_MEMORY_FRACTION = 0.8
MAX_DEFAULT_KV_TOKENS = 1 << 17


@dataclass(slots=True)
class Runtime:
    args: ServerArgs
    model_dir: Path
    model_config: ModelConfig
    tokenizer: Tokenizer
    scheduler: Scheduler
    limits: Limits
    log_dir: Path


def model_fingerprint(model_dir: Path) -> str:
    """Identifies the checkpoint in the log's meta table: its config and weight files' sizes."""
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    for f in sorted(model_dir.glob("*.safetensors")):
        digest.update(f"{f.name}:{f.stat().st_size}".encode())
    return f"{model_dir.name}:{digest.hexdigest()[:16]}"


def software_identity() -> str:
    """What SERVER_START records as `engine.software`: the torch build, the machine and its CPU capability."""
    return f"torch {torch.__version__} {platform.machine()} {torch.backends.cpu.get_cpu_capability()}"


def engine_settings(args: ServerArgs, model_dir: Path, policy: SchedulePolicy, kv_tokens: int,
                    compiled: str, sampler: str, prefill_threads: int, small_decode_rows: int, kernels: dict[str, str]) -> dict[str, object]:
    """What SERVER_START records of the engine (commitlog.schedule.ENGINE_KEYS): every setting that
    changes a forward's numerics or the KV layout, so `replay --reexecute` can rebuild this engine."""
    return {
        "model_path": str(model_dir.resolve()), "tokenizer_path": args.tokenizer_path, "dtype": args.dtype,
        "attention_backend": args.attention_backend, "linear_backend": args.linear_backend,
        "num_threads": torch.get_num_threads(), "prefill_threads": prefill_threads, "small_decode_rows": small_decode_rows,
        "mixed_chunk": policy.mixed_chunk,
        "overlap": policy.overlap,
        "chunked_prefill_size": policy.chunked_prefill_size, "max_prefill_tokens": policy.max_prefill_tokens,
        "kv_tokens": kv_tokens, "max_running_requests": policy.max_running_requests,
        "context_len": policy.context_len, "reasoning_parser": args.reasoning_parser, "compiled": compiled,
        "radix_cache": not args.disable_radix_cache, "sampler": sampler,
        "software": software_identity(), "kernels": kernels,
    }


def build_runtime(args: ServerArgs, log_dir: Path, sink: DeltaSink, beside_front: bool = False) -> Runtime:
    """`beside_front`: the scheduler process of `serve`, sharing the machine with the HTTP front."""
    torch.set_num_threads(args.compute_threads(beside_front))
    device = resolve_device(args.device)
    model_dir = model_dir_for(args.model_path)
    dtype = parse_dtype(args.dtype)
    model = _load_on(device, model_dir, dtype, args.linear_backend)
    cfg = model.config
    tokenizer = Tokenizer(Path(args.tokenizer_path) if args.tokenizer_path else model_dir)
    context_len = args.context_length or cfg.max_position_embeddings
    kv_pool = _make_kv_pool(args, cfg, next(model.parameters()).dtype, context_len, device)
    req_pool = ReqToTokenPool(args.max_running_requests, context_len, device)
    eos = set(cfg.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    policy = SchedulePolicy(args.max_running_requests, args.chunked_prefill_size, args.max_prefill_tokens,
                            context_len, overlap=not args.disable_overlap_schedule,
                            mixed_chunk=args.enable_mixed_chunk)
    runner = ModelRunner(model, kv_pool, policy.future_slots, args.attention_backend, frozenset(eos),
                         args.prefill_compute_threads(beside_front), args.small_decode_rows)
    prefill_threads = runner.prefill_threads or torch.get_num_threads()  # None off CPU: one count for all
    if wants_compile(args.torch_compile, device, dtype, runner.attention):
        compile_trunk(model)
        # Each thread count has graphs of its own: every shape class at each, so none compiles while serving
        # (a one-token prompt prefills on the one-token class, a decode batch on the multi-token one).
        for threads in sorted(runner.thread_counts()):
            with torch_threads(threads):
                warm_up(model, runner.attention)
    grammars = GrammarCompiler(tokenizer.hf_tokenizer, cfg.vocab_size, sorted(eos))
    reasoning = (ReasoningParser.create(args.reasoning_parser, tokenizer.token_id(THINK_START),
                                        tokenizer.token_id(THINK_END)) if args.reasoning_parser else None)
    tokenizer_dir = str(Path(args.tokenizer_path or model_dir).resolve())
    ledger = Ledger.open(log_dir, WalConfig(durability=Durability(args.log_durability)), model_fingerprint(model_dir),
                         tokenizer_dir, engine_settings(args, model_dir, policy, kv_pool.capacity, model.compiled,
                                                        sampler_name(device), prefill_threads, runner.small_decode_rows,
                                                        engine_builds(runner.attention.name, device.type)))
    rules = FinishRules(frozenset(eos), context_len, tokenizer.decode)
    cache = None if args.disable_radix_cache else RadixCache(kv_pool)
    scheduler = Scheduler(policy, runner, req_pool, kv_pool, ledger, rules, sink, grammars, reasoning, cache)
    limits = Limits(vocab_size=cfg.vocab_size, context_len=context_len, kv_capacity=kv_pool.capacity)
    return Runtime(args, model_dir, cfg, tokenizer, scheduler, limits, log_dir)


def _load_on(device: torch.device, model_dir: Path, dtype: torch.dtype, linear_backend: str) -> CausalLM:
    """Loads on the host; on CUDA moves the weights over, where oneDNN's packed layout (a CPU format)
    has no place: `auto` means plain nn.Linear there and `onednn` is refused."""
    model = load_model(model_dir, dtype)
    if device.type == "cpu":
        apply_linear_backend(model, linear_backend, dtype, model.config.hidden_size)
        return model
    if linear_backend == "onednn":
        raise ConfigError("--linear-backend onednn packs weights for CPU matmuls; on --device cuda use auto or torch")
    return model.to(device)


def _make_kv_pool(args: ServerArgs, cfg: ModelConfig, dtype: torch.dtype, context_len: int,
                  device: torch.device) -> TokenToKVPool:
    def pool(n: int) -> TokenToKVPool:
        return TokenToKVPool(n, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype, device)

    if args.max_total_tokens is not None:
        return pool(args.max_total_tokens)
    per_slot = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * torch.finfo(dtype).bits // 8
    budget = kv_budget_bytes(device, KV_MEMORY_FRACTION, KV_CUDA_MEMORY_FRACTION)
    n = min(budget // per_slot, MAX_DEFAULT_KV_TOKENS)
    return pool(max(n, context_len))
