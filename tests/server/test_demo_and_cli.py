"""The built-in demo model and the CLI's surface."""
from __future__ import annotations

import subprocess
import sys

from ops.cli import build_parser
from server.models.demo import ensure_demo_model


def test_engine_without_model_path_serves_the_cached_demo_model():
    from server import Engine

    first = ensure_demo_model()
    assert ensure_demo_model() == first  # cached, not rebuilt
    engine = Engine(max_total_tokens=2048)
    try:
        out = engine.generate(prompt="Once upon a time", sampling_params={"max_new_tokens": 4, "temperature": 0})
        assert len(out["output_ids"]) == 4 and out["meta_info"]["prompt_tokens"] > 0
        assert engine.runtime.model_dir == first
    finally:
        engine.shutdown()
    assert engine.scheduler.kv_live_tokens == 0


def test_serve_flags_follow_sglang_names():
    ns = build_parser().parse_args(
        ["serve", "--model-path", "/m", "--chunked-prefill-size", "64", "--max-running-requests", "4",
         "--disable-overlap-schedule", "--log-dir", "/l", "--log-durability", "none", "--port", "1"]
    )
    assert (ns.model_path, ns.chunked_prefill_size, ns.max_running_requests) == ("/m", 64, 4)
    assert ns.disable_overlap_schedule and ns.log_dir == "/l" and ns.log_durability == "none"


def test_cli_reports_a_bad_model_directory_without_a_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "ops.cli", "serve", "--model-path", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "no config.json" in proc.stderr
    assert "Traceback" not in proc.stderr
