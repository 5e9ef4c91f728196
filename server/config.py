"""Server arguments: one frozen dataclass whose field names are the CLI flags' names."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import platformdirs

from server.errors import ConfigError

DURABILITY_MODES = ("fsync", "periodic", "none")
REASONING_PARSERS = ("deepseek-r1", "qwen3")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton", "flashinfer")  # kernels.registry.BACKEND_NAMES, without importing torch here
LINEAR_BACKENDS = ("auto", "onednn", "torch")  # server.models.packed_linear, without importing torch here
DEVICES = ("auto", "cpu", "cuda")  # server.device, without importing torch here
TORCH_COMPILE_MODES = ("auto", "on", "off")  # server.models.compiled, without importing torch here


def default_log_dir() -> Path:
    """Where `serve` writes its log without --log-dir, and where every log command reads by default."""
    return Path(platformdirs.user_state_dir("tokenledger")) / "log"


@dataclass(frozen=True, slots=True)
class ServerArgs:
    model_path: str | None = None  # None: the built-in demo model
    tokenizer_path: str | None = None
    served_model_name: str | None = None
    dtype: str = "float32"
    context_length: int | None = None
    max_total_tokens: int | None = None  # KV slots; None: derived from memory
    max_running_requests: int = 64
    chunked_prefill_size: int = 512  # <= 0 disables chunking
    max_prefill_tokens: int = 16384
    disable_overlap_schedule: bool = False
    enable_mixed_chunk: bool = False  # running decodes ride in each prefill chunk's forward
    disable_radix_cache: bool = False  # the prefix cache of committed KV is on unless this is set
    # Compute threads of the forward (torch and the attention kernel). None: every core the process may
    # use, less one when serving over HTTP, where the front process needs a core of its own (on a
    # 2-core machine a scheduler spinning on both cores starves the front and stalls every step).
    num_threads: int | None = None
    # Compute threads of a forward that prefills (an extend or mixed batch). None: the decode's count. Under
    # serve on 2 cores, 2 here (decode on 1) cut an in-process prefill by 28 % but gained no online throughput
    # and ~10 % of p99 TTFT (docs/benchmarks.md, fifteenth session): the front is busy during a prefill too.
    prefill_threads: int | None = None
    # A decode of at most this many rows runs on one compute thread (0: none; opt-in). On 2 cores a decode of
    # up to 8 rows of the tiny benchmark model is ~10-15 % faster on one thread, 16 rows slower; but a
    # batch-1 decode of a hidden-1024 model is 27 % slower (docs/benchmarks.md, twenty-third session).
    small_decode_rows: int = 0
    attention_backend: str = "auto"  # auto | torch | cpu | triton | flashinfer (kernels.registry)
    device: str = "auto"  # auto | cpu | cuda (server.device): where the model, KV pools and tables live
    linear_backend: str = "auto"  # auto | onednn | torch (server.models.packed_linear)
    torch_compile: str = "auto"  # auto | on | off (server.models.compiled): the trunk compiled by inductor
    log_dir: str | None = None
    log_durability: str = "fsync"
    random_seed: int = 0
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    admin_api_key: str | None = None
    tp_size: int = 1
    log_requests: bool = False
    # With --log-requests, as in SGLang: 0 metadata, 1 + sampling params, 2 + text cut to
    # 200 characters, 3 + full text.
    log_requests_level: int = 2
    log_format: str = "console"
    shutdown_grace_s: float = 30.0  # on SIGTERM: how long running requests may finish
    # Prompts one HTTP request may hold (a native batch, an OpenAI prompt list times n): each is
    # tokenized and scheduled, so an unbounded list lets one client stall everyone.
    max_prompts_per_request: int = 256
    reasoning_parser: str | None = None  # deepseek-r1 | qwen3: track <think>...</think> per request
    enable_metrics_sglang_names: bool = False  # /metrics under SGLang's names where one exists

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> ServerArgs:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown server argument(s): {', '.join(unknown)}")
        args = cls(**kwargs)
        args.validate()
        return args

    def compute_threads(self, beside_front: bool) -> int:
        """`num_threads`, or what the machine gives when it is not set (see the field)."""
        if self.num_threads is not None:
            return self.num_threads
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return max(1, cores - 1) if beside_front else cores

    def prefill_compute_threads(self, beside_front: bool) -> int:
        """`prefill_threads`, or the decode's count when it is not set."""
        return self.prefill_threads if self.prefill_threads is not None else self.compute_threads(beside_front)

    def with_changes(self, **kwargs: Any) -> ServerArgs:
        return replace(self, **kwargs)

    def validate(self) -> None:
        if self.max_running_requests < 1:
            raise ConfigError("--max-running-requests must be >= 1")
        if self.max_total_tokens is not None and self.max_total_tokens < 1:
            raise ConfigError("--max-total-tokens must be >= 1")
        if self.context_length is not None and self.context_length < 2:
            raise ConfigError("--context-length must be >= 2")
        if self.max_prefill_tokens < 1:
            raise ConfigError("--max-prefill-tokens must be >= 1")
        if self.log_durability not in DURABILITY_MODES:
            raise ConfigError(f"--log-durability must be one of {', '.join(DURABILITY_MODES)}")
        if self.tp_size != 1:
            raise ConfigError("--tp-size > 1 is not supported yet; run with --tp-size 1")
        if self.log_requests_level not in (0, 1, 2, 3):
            raise ConfigError("--log-requests-level must be 0, 1, 2 or 3")
        if self.max_prompts_per_request < 1:
            raise ConfigError("--max-prompts-per-request must be >= 1")
        if self.shutdown_grace_s < 0:
            raise ConfigError("--shutdown-grace-s must be >= 0")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ConfigError(f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError("--num-threads must be >= 1")
        if self.prefill_threads is not None and self.prefill_threads < 1:
            raise ConfigError("--prefill-threads must be >= 1")
        if self.small_decode_rows < 0:
            raise ConfigError("--small-decode-rows must be >= 0")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"--attention-backend must be one of {', '.join(ATTENTION_BACKENDS)}")
        if self.device not in DEVICES:
            raise ConfigError(f"--device must be one of {', '.join(DEVICES)}")
        if self.linear_backend not in LINEAR_BACKENDS:
            raise ConfigError(f"--linear-backend must be one of {', '.join(LINEAR_BACKENDS)}")
        if self.torch_compile not in TORCH_COMPILE_MODES:
            raise ConfigError(f"--torch-compile must be one of {', '.join(TORCH_COMPILE_MODES)}")
        if self.log_format not in ("console", "json"):
            raise ConfigError("--log-format must be console or json")
