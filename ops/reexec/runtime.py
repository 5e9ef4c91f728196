"""The engine a logged instance ran, rebuilt from its SERVER_START: same checkpoint (by fingerprint),
dtype, backends, thread count, pool sizes and schedule settings, logging into a scratch directory."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ops.reexec.scripted import CheckingRunner, ScriptedScheduler
from server.config import ServerArgs
from server.errors import TokenLedgerError
from server.runtime import Runtime, build_runtime, model_fingerprint


class ModelUnavailableError(TokenLedgerError):
    """The checkpoint to re-execute with is missing, not loadable, or not the logged one."""


def check_model(engine: dict[str, Any], logged_fingerprint: str, model_path: str | None) -> Path:
    """The checkpoint directory to load. Without --model-path it must be the logged one, by fingerprint:
    a changed checkpoint at the same path would otherwise be blamed on the log."""
    path = Path(model_path or engine["model_path"])
    if not (path / "config.json").is_file():
        raise ModelUnavailableError(f"no checkpoint at {path} (the server logged {engine['model_path']}); "
                                    "give --model-path")
    if model_path is None and model_fingerprint(path) != logged_fingerprint:
        raise ModelUnavailableError(f"the checkpoint at {path} has fingerprint {model_fingerprint(path)}, the log "
                                    f"{logged_fingerprint}: it is not the checkpoint that served; give --model-path "
                                    "to re-execute with it anyway")
    return path


def server_args(engine: dict[str, Any], model_dir: Path, tokenizer_dir: str | None) -> ServerArgs:
    tokenizer = engine.get("tokenizer_path") or (tokenizer_dir if tokenizer_dir and Path(tokenizer_dir).is_dir() else None)
    return ServerArgs.from_kwargs(
        model_path=str(model_dir), tokenizer_path=tokenizer, dtype=engine["dtype"],
        attention_backend=engine["attention_backend"], linear_backend=engine["linear_backend"],
        num_threads=engine["num_threads"],
        prefill_threads=engine.get("prefill_threads", engine["num_threads"]),  # absent: prefills ran on num_threads
        small_decode_rows=engine.get("small_decode_rows", 0),  # absent: every decode ran on num_threads
        enable_mixed_chunk=engine["mixed_chunk"],
        disable_overlap_schedule=not engine["overlap"], chunked_prefill_size=engine["chunked_prefill_size"],
        max_prefill_tokens=engine["max_prefill_tokens"], max_total_tokens=engine["kv_tokens"],
        max_running_requests=engine["max_running_requests"], context_length=engine["context_len"],
        reasoning_parser=engine["reasoning_parser"], log_durability="none",
        disable_radix_cache=not engine.get("radix_cache", False),  # absent: logged before the cache existed
        # The same trunk as served: compiled and eager agree to float rounding, not bit for bit.
        torch_compile="on" if engine.get("compiled") == "inductor" else "off")


def build_scripted(args: ServerArgs, scratch: Path) -> tuple[Runtime, ScriptedScheduler]:
    """The server's runtime, with the scheduler's batch choice scripted and the runner checked."""
    try:
        runtime = build_runtime(args, scratch, lambda _deltas, _error: None)
    except (TokenLedgerError, OSError, ValueError, KeyError) as exc:
        raise ModelUnavailableError(f"the model at {args.model_path} could not be loaded: {exc}") from None
    s = runtime.scheduler
    runner = CheckingRunner(s.runner.model, s.kv_pool, s.policy.future_slots, args.attention_backend, s.runner.eos_ids,
                            s.runner.prefill_threads, s.runner.small_decode_rows)
    scripted = ScriptedScheduler(s.policy, runner, s.req_pool, s.kv_pool, s.ledger, s.rules, s.sink, s.grammars,
                                 s.reasoning, s.cache)  # the same prefix cache (or none), refilled as logged
    return runtime, scripted


def build_differences(engine: dict[str, Any]) -> list[str]:
    """How this machine's software and C kernel builds differ from what the logged instance ran (none: the
    same). Re-execution is bit for bit only on the same ones, so a divergence on another says nothing about
    the log. A log from before a key (`kernels`, `software`) has nothing to compare for it."""
    from kernels.builds import current_builds
    from server.runtime import software_identity

    notes = []
    logged_software, here = engine.get("software"), software_identity()
    if logged_software is not None and logged_software != here:
        notes.append(f"software: the server ran {logged_software!r}, this machine runs {here!r}")
    logged_kernels = engine.get("kernels")
    if isinstance(logged_kernels, dict):
        builds = current_builds(sorted(logged_kernels))
        for source, logged_build in sorted(logged_kernels.items()):
            if builds.get(source) != logged_build:
                notes.append(f"kernel {source}: the server ran build {logged_build}, this machine "
                             f"{'builds ' + builds[source] if source in builds else 'cannot build it'}")
    return notes
