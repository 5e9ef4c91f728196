"""`tokenledger bench offline`: one random-length greedy workload through the offline `Engine`,
through HF transformers static batching (left-padded batches, each run to its longest output)
and, with `--peer-python`, through vLLM's offline `LLM` in that interpreter — same run, same
prompts, same output lengths. Prints output tok/s for each and the ratios; the last line is JSON.

Rounds: every engine is loaded and warmed up first, then each round runs one workload through
each engine in turn (each round its own prompts, so no prefix cache serves a later round). On a
shared machine whose speed drifts over minutes, one engine's turn can land in a slow spell and the
next one's in a fast one; a round's engines run seconds apart, so its ratio carries little of the
drift, and the headline ratio is the median of the rounds' ratios. Batch-1 decode alternates the
same way."""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Protocol

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
    p.add_argument("--rounds", type=int, default=3,
                   help="timed rounds, each through every engine in turn with its own prompts (>= 1)")
    p.set_defaults(run=run)


def make_workload(num: int, input_range: tuple[int, int], output_range: tuple[int, int], vocab: int,
                  special: set[int], seed: int) -> Workload:
    rng = random.Random(seed)
    usable = [t for t in range(vocab) if t not in special]
    prompts = [[rng.choice(usable) for _ in range(rng.randint(*input_range))] for _ in range(num)]
    return Workload(prompts, [rng.randint(*output_range) for _ in range(num)])


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


class OfflineEngine(Protocol):
    """One engine under test, loaded and warmed up: timed on one workload at a time."""

    name: str

    def output_tok_s(self, work: Workload) -> float: ...

    def batch1_ms(self, prompt: list[int], new_tokens: int) -> float | None: ...


class OursOffline:
    name = "tokenledger"

    def __init__(self, stack: ExitStack, model_dir: Path, durability: str, warmup: Workload) -> None:
        self.engine, _ = stack.enter_context(warmed_engine(model_dir, warmup, durability, warmup))

    def output_tok_s(self, work: Workload) -> float:
        started = time.perf_counter()
        outs = self.engine.generate(input_ids=work.prompts, sampling_params=_greedy(work))
        elapsed = time.perf_counter() - started
        produced = sum(len(o["output_ids"]) for o in outs)
        if produced != work.output_tokens:
            raise RuntimeError(f"the engine produced {produced} tokens, the workload asked {work.output_tokens}")
        return work.output_tokens / elapsed

    def batch1_ms(self, prompt: list[int], new_tokens: int) -> float | None:
        def one(new: int) -> None:
            self.engine.generate(input_ids=[prompt], sampling_params={"max_new_tokens": new, "temperature": 0,
                                                                      "ignore_eos": True})
        return decode_ms_per_token(one, new_tokens)


class HFStaticOffline:
    """HF `generate`, greedy, static batches in arrival order: the batch runs to its longest
    requested output; only the requested tokens count."""

    name = "hf_static"

    def __init__(self, model_dir: Path, batch_size: int, warmup: Workload) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        self.pad = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        self.batch_size = batch_size
        self._all_of(warmup)

    def _batch(self, prompts: list[list[int]], max_new: int) -> None:
        torch = self._torch
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=max_new,
                                do_sample=False, pad_token_id=self.pad)

    def _all_of(self, work: Workload) -> None:
        for i in range(0, len(work.prompts), self.batch_size):
            self._batch(work.prompts[i:i + self.batch_size], max(work.output_lens[i:i + self.batch_size]))

    def output_tok_s(self, work: Workload) -> float:
        started = time.perf_counter()
        self._all_of(work)
        return work.output_tokens / (time.perf_counter() - started)

    def batch1_ms(self, prompt: list[int], new_tokens: int) -> float | None:
        return decode_ms_per_token(lambda new: self._batch([prompt], new), new_tokens)


class VLLMOffline:
    """vLLM's offline `LLM` in another interpreter (ops/peer_vllm_offline.py), kept loaded between
    rounds: one JSON workload a line on its stdin, one JSON result a line on a pipe of its own
    (vLLM's logs go to a file).

    Stopped (SIGSTOP, its whole process group) outside its own turns: an idle `LLM` keeps ~34 % of a CPU
    busy polling (measured: 3 s windows between rounds, its engine-core and worker processes), which
    the engine being timed beside it would lose. Ours and HF block while idle."""

    name = "vllm"

    def __init__(self, stack: ExitStack, python: str, model_dir: Path, warmup: Workload) -> None:
        from server import SPIN_COUNT_SET_HERE
        from server.openmp import without_spin_default

        # The peer runs as its users run it: without the OpenMP spin count `import server` set for us.
        env = {**without_spin_default(dict(os.environ), SPIN_COUNT_SET_HERE),
               "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tokenledger-peer-")))
        (tmp / "warmup.json").write_text(json.dumps(asdict(warmup)))
        self._log = (tmp / "vllm.log").open("w")
        stack.callback(self._log.close)
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [python, str(PEER_SCRIPT), "--model", str(model_dir), "--warmup", str(tmp / "warmup.json"),
             "--result-fd", str(write_fd)],
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT, text=True, env=env,
            pass_fds=(write_fd,), start_new_session=True)  # its own process group: paused as one
        os.close(write_fd)  # the child's copy is the only one left: its exit ends our reads
        stack.callback(self._stop)
        self._results: IO[str] = os.fdopen(read_fd)
        stack.callback(self._results.close)
        self._log_path = tmp / "vllm.log"
        self._read()  # {"ready": true}: loaded and warmed up
        self._pause()

    def _signal(self, sig: signal.Signals) -> None:
        """To the peer and every process it started (they share its process group)."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass  # gone already: its exit is reported by the read that finds its pipe closed

    def _pause(self, timeout_s: float = 5.0) -> None:
        """Stops the peer's process group and waits until every process in it shows stopped (or gone):
        a stop is delivered asynchronously, and the next engine's timed round must not start beside
        a peer still running. The whole group, not only the main process: vLLM's engine core and its
        workers are children of it, and they are the ones that poll while idle."""
        self._signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout_s
        running = set(_process_group(self.proc.pid)) or {self.proc.pid}
        while running and time.monotonic() < deadline:
            running = {pid for pid in running if _process_state(pid) not in _STOPPED_OR_GONE}
            if running:
                time.sleep(0.001)

    def _read(self) -> dict[str, Any]:
        line = self._results.readline()
        if not line:
            self.proc.wait(timeout=60)
            tail = self._log_path.read_text()[-3000:]
            raise RuntimeError(f"the vLLM run failed (exit {self.proc.returncode}):\n{tail}")
        return dict(json.loads(line))

    def _stop(self) -> None:
        self._signal(signal.SIGCONT)  # a stopped process cannot read its end of input
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # end of input: the peer exits
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def output_tok_s(self, work: Workload) -> float:
        assert self.proc.stdin is not None
        self._signal(signal.SIGCONT)
        try:
            self.proc.stdin.write(json.dumps(asdict(work)) + "\n")
            self.proc.stdin.flush()
            result = self._read()
        finally:
            self._pause()
        if int(result["output_tokens"]) != work.output_tokens:
            raise RuntimeError(f"vLLM produced {result['output_tokens']} tokens, the workload asked {work.output_tokens}")
        return float(result["output_tok_s"])

    def batch1_ms(self, prompt: list[int], new_tokens: int) -> float | None:
        return None  # not asked of the peer (the batch-1 target is against HF)


_STOPPED_OR_GONE = ("T", "t", "Z", "X", None)  # stopped by a signal or traced; exited; no such process


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, ...); None: gone, or no /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _process_state(pid: int) -> str | None:
    """The process's state letter from /proc (None: gone, or no /proc here)."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _process_group(pgid: int) -> list[int]:
    """Every process in process group `pgid`, from /proc ([] where there is no /proc)."""
    try:
        pids = [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    # A process gone meanwhile has no fields and is left out.
    return [pid for pid in pids if (fields := _stat_fields(pid)) is not None and int(fields[2]) == pgid]


def _median_ratios(rounds: list[dict[str, float]], ours: str) -> dict[str, float]:
    """Per other engine: the median over rounds of ours over it (a round's engines ran seconds apart)."""
    return {n: statistics.median(r[ours] / r[n] for r in rounds) for n in rounds[0] if n != ours}


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from server.models.demo import model_dir_for

    if args.rounds < 1:
        raise SystemExit("--rounds must be >= 1")
    model_dir = model_dir_for(args.model_path)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    vocab, special = tokenizer.vocab_size, set(tokenizer.all_special_ids)

    def workload(seed: int) -> Workload:
        return make_workload(args.num_prompts, tuple(args.input_range), tuple(args.output_range), vocab, special, seed)

    # Every engine first runs a workload of the same shape with other prompts, untimed: the timed runs are
    # at steady state (memory touched, kernels built and cached). Round 0 is the seed's workload (what a
    # one-round run times); every later round draws its own prompts, so no prefix cache serves it.
    warmup = workload(args.seed + 1)
    works = [workload(args.seed if r == 0 else args.seed + 1 + r) for r in range(args.rounds)]
    with ExitStack() as stack:
        engines: list[OfflineEngine] = []
        if args.peer_python:  # loaded first: its start-up is the longest, and nothing is timed meanwhile
            peer = VLLMOffline(stack, args.peer_python, model_dir, warmup)
        engines.append(OursOffline(stack, model_dir, args.log_durability, warmup))
        if not args.skip_hf:
            engines.append(HFStaticOffline(model_dir, args.hf_batch_size, warmup))
        if args.peer_python:
            engines.append(peer)
        rounds = [{e.name: e.output_tok_s(work) for e in engines} for work in works]
        prompt = batch1_prompt(works[0])
        # An engine that does not time batch-1 (the peer) gives None.
        batch1_rounds = [{e.name: ms for e in engines if (ms := e.batch1_ms(prompt, args.batch1_tokens)) is not None}
                         for _ in range(args.rounds)] if args.batch1_tokens >= 2 else []
    _report(args, works, rounds, batch1_rounds, len(prompt))
    return 0


def _report(args: argparse.Namespace, works: list[Workload], rounds: list[dict[str, float]],
            batch1_rounds: list[dict[str, float]], batch1_prompt_len: int) -> None:
    ours = OursOffline.name
    names = list(rounds[0])
    others = [n for n in names if n != ours]
    print(f"workload: {args.num_prompts} prompts, input {args.input_range[0]}-{args.input_range[1]}, output "
          f"{args.output_range[0]}-{args.output_range[1]}, greedy, ignore_eos; {args.rounds} round(s), each "
          "through every engine in turn with its own prompts")
    print(f"{'round':>5} {'output tokens':>13} " + " ".join(f"{n + ' tok/s':>17}" for n in names)
          + "".join(f" {'tokenledger / ' + n:>22}" for n in others))
    for i, (work, r) in enumerate(zip(works, rounds)):
        print(f"{i:>5} {work.output_tokens:>13} " + " ".join(f"{r[n]:17.1f}" for n in names)
              + "".join(f" {r[ours] / r[n]:22.2f}" for n in others))
    medians = {n: statistics.median(r[n] for r in rounds) for n in names}
    ratios = _median_ratios(rounds, ours)
    print(f"{'median':>5} {'':>13} " + " ".join(f"{medians[n]:17.1f}" for n in names)
          + "".join(f" {ratios[n]:22.2f}" for n in others) + "   (ratios: median of the rounds' ratios)")
    batch1: dict[str, float] = {}
    batch1_ratios: dict[str, float] = {}
    if batch1_rounds and batch1_rounds[0]:
        timed = list(batch1_rounds[0])
        batch1 = {n: statistics.median(r[n] for r in batch1_rounds) for n in timed}
        batch1_ratios = _median_ratios(batch1_rounds, ours)
        print(f"batch-1 decode, {batch1_prompt_len}-token prompt, {args.batch1_tokens} new tokens, ms / token:")
        for i, r in enumerate(batch1_rounds):
            print(f"{i:>5} " + " ".join(f"{n} {r[n]:.2f}" for n in timed)
                  + "".join(f"   tokenledger / {n} {r[ours] / r[n]:.2f}" for n in timed if n != ours))
        print("median " + " ".join(f"{n} {batch1[n]:.2f}" for n in timed)
              + "".join(f"   tokenledger / {n} {v:.2f} (median of the rounds' ratios)" for n, v in batch1_ratios.items()))
    print(json.dumps({"output_tok_s": medians, "ratios": ratios, "rounds": rounds,
                      "output_tokens": [w.output_tokens for w in works], "batch1_ms_per_token": batch1,
                      "batch1_ratios": batch1_ratios, "batch1_rounds": batch1_rounds}))
