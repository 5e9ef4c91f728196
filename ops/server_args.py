"""CLI flags generated from `ServerArgs`: one flag per field, SGLang's spelling."""
from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING, fields
from typing import Any

from server.config import DURABILITY_MODES, ServerArgs

HELP = {
    "model_path": "Hugging Face model directory (default: the built-in demo model)",
    "chunked_prefill_size": "max prompt tokens per extend step; <= 0 disables chunking",
    "max_total_tokens": "KV cache capacity in tokens (default: derived from memory)",
    "disable_overlap_schedule": "process each step's result before launching the next",
    "log_dir": "directory of the write-ahead log (LMDB); default: the user state directory, the one every "
               "log command reads by default",
    "log_durability": f"WAL durability: {', '.join(DURABILITY_MODES)}",
    "num_threads": "compute threads of the forward (default: every core, less one for the HTTP front under serve)",
    "prefill_threads": "compute threads of a forward that prefills prompt tokens, on CPU (default: the decode's, "
                       "--num-threads)",
    "small_decode_rows": "on CPU, a decode of at most this many rows runs on one compute thread (default 0: off; "
                         "faster for the tiny model's few-row decodes on 2 cores, slower for a bigger model's)",
    "attention_backend": "attention kernel: auto (the fastest that runs here), torch (portable reference), "
                         "cpu (C kernel, fp32 on CPU), triton (Triton kernels, CUDA), flashinfer (CUDA, fp16/bf16)",
    "device": "where the model and KV cache live: auto (CUDA when torch sees a device, else cpu), cpu, cuda",
    "enable_mixed_chunk": "put the running decode requests into the same forward as a prefill chunk "
                          "(one mixed batch) instead of waiting for the prefill to finish",
    "disable_radix_cache": "turn off the prefix cache (a radix tree of finished requests' committed KV that "
                           "later prompts with the same prefix reuse instead of recomputing)",
    "linear_backend": "matmuls of the linear layers: auto (onednn where it runs for a model of hidden size 512 or "
                      "more, else torch), onednn (weights packed once at "
                      "load, fp32 on CPU), torch (nn.Linear)",
    "torch_compile": "compile the model's trunk with inductor (torch.compile): auto (on for fp32 on CPU with the "
                     "cpu attention kernel, unless TOKENLEDGER_TORCH_COMPILE=off), on, off (eager); compiling "
                     "takes seconds at start-up",
    "enable_metrics_sglang_names": "export the /metrics series that SGLang also has under SGLang's names "
                                   "(sglang:num_running_reqs, ...); docs/api.md has the mapping",
    "max_prompts_per_request": "prompts one HTTP request may hold (a batch, or an OpenAI prompt list times n); "
                               "more is refused with 400",
}


def add_server_args(parser: argparse.ArgumentParser) -> None:
    hints = typing.get_type_hints(ServerArgs)
    for f in fields(ServerArgs):
        flag = "--" + f.name.replace("_", "-")
        kind = _base_type(hints[f.name])
        default = None if f.default is MISSING else f.default
        help_text = HELP.get(f.name, "") + (f" (default: {default})" if default not in (None, False) else "")
        if kind is bool:
            parser.add_argument(flag, action="store_true", help=help_text or None)
        else:
            parser.add_argument(flag, type=kind, default=default, help=help_text or None)


def server_args_from(ns: argparse.Namespace) -> ServerArgs:
    values: dict[str, Any] = {f.name: getattr(ns, f.name) for f in fields(ServerArgs)}
    return ServerArgs.from_kwargs(**values)


def _base_type(hint: Any) -> type:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint
