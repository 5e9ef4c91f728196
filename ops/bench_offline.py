"""`tokenledger bench offline`: one random-length greedy workload through the offline `Engine`,
through HF transformers static batching (left-padded batches, each run to its longest output)
and, with `--peer-python`, through vLLM's offline `LLM` in that interpreter — same run, same
prompts, same output lengths. Prints output tok/s for each and the ratios; the last line is JSON."""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PEER_SCRIPT = Path(__file__).with_name("peer_vllm_offline.py")
BATCH1_PROMPT_LEN = 32
BATCH1_REPEATS = 3


@dataclass(frozen=True, slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("offline", help="offline tok/s: Engine vs HF static batching (and vLLM with --peer-python)")
    p.add_argument("--model-path", default=None, help="model directory (default: the demo model)")
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--input-range", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    p.add_argument("--output-range", type=int, nargs=2, default=(16, 128), metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--peer-python", default=None, help="a python with vllm installed: also run vLLM's offline LLM")
    p.add_argument("--log-durability", default="fsync")
    p.add_argument("--batch1-tokens", type=int, default=128,
                   help="batch-1 decode: new tokens of the one request timed (0 skips the measurement)")
    p.set_defaults(run=run)


def make_workload(num: int, input_range: tuple[int, int], output_range: tuple[int, int], vocab: int,
                  special: set[int], seed: int) -> Workload:
    rng = random.Random(seed)
    usable = [t for t in range(vocab) if t not in special]
    prompts = [[rng.choice(usable) for _ in range(rng.randint(*input_range))] for _ in range(num)]
    return Workload(prompts, [rng.randint(*output_range) for _ in range(num)])


def run_engine(model_dir: Path, work: Workload, durability: str, batch1_tokens: int,
               warmup: Workload) -> tuple[float, float | None]:
    """Output tok/s on the workload, and batch-1 decode ms per token (None when not asked)."""
    with warmed_engine(model_dir, work, durability, warmup) as (engine, params):
        started = time.perf_counter()
        outs = engine.generate(input_ids=work.prompts, sampling_params=params)
        elapsed = time.perf_counter() - started

        prompt = batch1_prompt(work)

        def one(new: int) -> None:
            engine.generate(input_ids=[prompt], sampling_params={"max_new_tokens": new, "temperature": 0,
                                                                 "ignore_eos": True})

        batch1 = decode_ms_per_token(one, batch1_tokens)
    assert sum(len(o["output_ids"]) for o in outs) == work.output_tokens  # type: ignore[index,union-attr]
    return work.output_tokens / elapsed, batch1


@contextmanager
def warmed_engine(model_dir: Path, work: Workload, durability: str,
                  warmup: Workload | None = None) -> Iterator[tuple[Any, list[dict[str, Any]]]]:
    """An `Engine` logging to a temporary directory, warmed up on `warmup` (default: the workload's first
    prompts), and the workload's greedy sampling params; shut down on exit."""
    from server import Engine

    params = _greedy(work)
    with tempfile.TemporaryDirectory(prefix="tokenledger-bench-") as log_dir:
        engine = Engine(model_path=str(model_dir), max_total_tokens=65536, max_running_requests=64,
                        log_dir=log_dir, log_durability=durability)
        try:
            if warmup is None:
                engine.generate(input_ids=work.prompts[:4], sampling_params=params[:4])
            else:
                engine.generate(input_ids=warmup.prompts, sampling_params=_greedy(warmup))
            yield engine, params
        finally:
            engine.shutdown()


def _greedy(work: Workload) -> list[dict[str, Any]]:
    return [{"max_new_tokens": n, "temperature": 0, "ignore_eos": True} for n in work.output_lens]


def batch1_prompt(work: Workload) -> list[int]:
    """The batch-1 request's prompt: the workload's tokens (so within the vocabulary), a fixed length."""
    tokens = [t for prompt in work.prompts for t in prompt]
    return tokens[:BATCH1_PROMPT_LEN]


def decode_ms_per_token(generate: Callable[[int], None], new_tokens: int) -> float | None:
    """Per-token decode time of one request: (time for `new_tokens` - time for 1) / (new_tokens - 1),
    so the prefill and the fixed costs cancel; best of a few runs each (a shared machine's noise
    only ever adds time). None when `new_tokens` < 2 (the measurement was not asked for)."""
    if new_tokens < 2:
        return None
    generate(2)  # warm-up

    def best(new: int) -> float:
        times = []
        for _ in range(BATCH1_REPEATS):
            started = time.perf_counter()
            generate(new)
            times.append(time.perf_counter() - started)
        return min(times)

    return (best(new_tokens) - best(1)) / (new_tokens - 1) * 1e3


def run_hf(model_dir: Path, work: Workload, batch_size: int, batch1_tokens: int,
           warmup: Workload) -> tuple[float, float | None]:
    """HF `generate`, greedy, static batches in arrival order: the batch runs to its longest
    requested output; only the requested tokens count. Also its batch-1 decode ms per token."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0

    def batch(prompts: list[list[int]], max_new: int) -> None:
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                           do_sample=False, pad_token_id=pad)

    def all_of(w: Workload) -> None:
        for i in range(0, len(w.prompts), batch_size):
            batch(w.prompts[i:i + batch_size], max(w.output_lens[i:i + batch_size]))

    all_of(warmup)
    started = time.perf_counter()
    all_of(work)
    rate = work.output_tokens / (time.perf_counter() - started)
    prompt = batch1_prompt(work)
    batch1 = decode_ms_per_token(lambda new: batch([prompt], new), batch1_tokens)
    return rate, batch1


def run_peer(python: str, model_dir: Path, work: Workload, warmup: Workload) -> float:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    with tempfile.TemporaryDirectory(prefix="tokenledger-peer-") as tmp:
        workload, result = Path(tmp) / "workload.json", Path(tmp) / "result.json"
        workload.write_text(json.dumps({**asdict(work), "warmup": asdict(warmup)}))
        done = subprocess.run([python, str(PEER_SCRIPT), "--model", str(model_dir), "--workload", str(workload),
                               "--result", str(result)], capture_output=True, text=True, env=env, timeout=3600)
        if done.returncode != 0 or not result.exists():
            raise RuntimeError(f"the vLLM run failed:\n{done.stderr[-3000:]}")
        return float(json.loads(result.read_text())["output_tok_s"])


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from server.models.demo import model_dir_for

    model_dir = model_dir_for(args.model_path)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    work = make_workload(args.num_prompts, tuple(args.input_range), tuple(args.output_range), tokenizer.vocab_size,
                         set(tokenizer.all_special_ids), args.seed)
    # Every engine first runs a workload of the same shape with other prompts, untimed: the timed run is
    # at steady state (memory touched, kernels built and cached), and no prompt of it is in a prefix cache.
    warmup = make_workload(args.num_prompts, tuple(args.input_range), tuple(args.output_range), tokenizer.vocab_size,
                           set(tokenizer.all_special_ids), args.seed + 1)
    figures: dict[str, float] = {}
    batch1: dict[str, float] = {}

    def keep(name: str, measured: tuple[float, float | None]) -> None:
        figures[name] = measured[0]
        if measured[1] is not None:
            batch1[name] = measured[1]

    keep("tokenledger", run_engine(model_dir, work, args.log_durability, args.batch1_tokens, warmup))
    if not args.skip_hf:
        keep("hf_static", run_hf(model_dir, work, args.hf_batch_size, args.batch1_tokens, warmup))
    if args.peer_python:
        figures["vllm"] = run_peer(args.peer_python, model_dir, work, warmup)
    print(f"workload: {args.num_prompts} prompts, input {args.input_range[0]}-{args.input_range[1]}, output "
          f"{args.output_range[0]}-{args.output_range[1]} ({work.output_tokens} output tokens), greedy, ignore_eos")
    print(f"{'engine':14} {'output tok/s':>12} {'tokenledger / it':>17}")
    for name, rate in figures.items():
        print(f"{name:14} {rate:12.1f} {figures['tokenledger'] / rate:17.2f}")
    if batch1:
        print(f"batch-1 decode, {len(batch1_prompt(work))}-token prompt, {args.batch1_tokens} new tokens:")
        print(f"{'engine':14} {'ms / token':>12} {'tokenledger / it':>17}")
        for name, ms in batch1.items():
            print(f"{name:14} {ms:12.2f} {batch1['tokenledger'] / ms:17.2f}")
    print(json.dumps({"output_tok_s": figures, "output_tokens": work.output_tokens, "batch1_ms_per_token": batch1}))
    return 0
