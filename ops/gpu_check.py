"""The CUDA check behind ops/gpu_check.sh: every gpu-marked test on the device, then decode tok/s per
attention backend, as one summary table. Exit 0: nothing failed; 1: something failed (or ran out
of time); 2: no CUDA device here, nothing was checked.

Rows: the kernel tests against their references; the engine on CUDA (greedy parity of each backend
with torch, overlap on and off; torch on CUDA vs the CPU; the forward's event); the seed's abort
window, ten runs per backend; decode tok/s at batch 1/32/128 per backend. A backend whose package
is not installed (flashinfer) shows as SKIP with the reason, never as PASS.
"""
from __future__ import annotations

import argparse
import enum
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXIT_FAILED, EXIT_NO_CUDA = 1, 2
# (test paths, seconds) per pytest run, then the bench; all of it within TOTAL_BUDGET_S (< 5 minutes).
PYTEST_STEPS = ((("tests/kernels",), 100), (("tests/server/test_cuda_engine.py", "tests/server/test_cuda_sampling.py"), 130))
BENCH_TIMEOUT_S = 90
TOTAL_BUDGET_S = 290
# The packages the device machine brings itself; everything else the project needs is installed on demand.
DEVICE_PACKAGES = {"torch", "triton", "flashinfer-python"}
ID_LABELS = {"torch", "triton", "flashinfer", "overlap_on", "overlap_off"}


class Status(enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True, slots=True)
class Row:
    check: str
    status: Status
    detail: str


def missing_requirements() -> list[str]:
    """pyproject's runtime and test requirements not installed here, less the device's own packages."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["test"]
    missing = []
    for req in wanted:
        name = re.match(r"[A-Za-z0-9_.\-]+", req)
        if name is None or name.group(0).lower() in DEVICE_PACKAGES:
            continue
        try:
            importlib.metadata.version(name.group(0))
        except importlib.metadata.PackageNotFoundError:
            missing.append(req.split(";")[0].strip())
    return missing


def _group_key(case: ET.Element) -> str:
    name = case.get("name", "?")
    func, _, params = name.partition("[")
    labels = [p for p in params.rstrip("]").split("-") if p in ID_LABELS]
    return f"{func} [{', '.join(labels)}]" if labels else func


def _outcome(case: ET.Element) -> tuple[Status, str]:
    for tag, status in (("failure", Status.FAIL), ("error", Status.FAIL), ("skipped", Status.SKIP)):
        found = case.find(tag)
        if found is not None:
            return status, (found.get("message") or tag).splitlines()[0][:100]
    return Status.PASS, ""


def rows_from_junit(xml_path: Path) -> list[Row]:
    groups: dict[str, list[tuple[Status, str]]] = defaultdict(list)
    for case in ET.parse(xml_path).iter("testcase"):
        groups[_group_key(case)].append(_outcome(case))
    return [_summarise(key, outcomes) for key, outcomes in groups.items()]


def _summarise(key: str, outcomes: list[tuple[Status, str]]) -> Row:
    counts = {s: sum(o is s for o, _ in outcomes) for s in Status}
    first = {s: next((m for o, m in outcomes if o is s), "") for s in Status}
    detail = f"{counts[Status.PASS]}/{len(outcomes)} passed"
    if counts[Status.FAIL]:
        return Row(key, Status.FAIL, f"{detail}; first failure: {first[Status.FAIL]}")
    if counts[Status.SKIP]:  # shown as SKIP even where some cases passed: a skipped case is never a pass
        return Row(key, Status.SKIP, f"{detail}; skipped: {first[Status.SKIP]}")
    return Row(key, Status.PASS, detail)


def _keep_output(log_dir: Path | None, name: str, proc: subprocess.CompletedProcess[str]) -> None:
    """With --log-dir: a step's whole output, for when the table's one line is not enough."""
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{name}.log").write_text(proc.stdout + proc.stderr)


def run_pytest(paths: tuple[str, ...], timeout_s: int, env: dict[str, str], log_dir: Path | None = None) -> list[Row]:
    path = " ".join(paths)
    with tempfile.TemporaryDirectory(prefix="tl-gpu-check-") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", f"--junitxml={xml}", *paths]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout_s, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return [Row(path, Status.FAIL, f"ran past its {timeout_s} s budget")]
        _keep_output(log_dir, Path(paths[0]).stem, proc)
        if not xml.exists():
            return [Row(path, Status.FAIL, f"pytest exited {proc.returncode} without results: {proc.stderr[-200:]}")]
        rows = rows_from_junit(xml)
        return rows or [Row(path, Status.FAIL, "no gpu test was collected")]


def run_bench(timeout_s: int, env: dict[str, str], log_dir: Path | None = None) -> list[Row]:
    cmd = [sys.executable, "-m", "ops.gpu_bench"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout_s, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return [Row("decode tok/s", Status.FAIL, f"ran past its {timeout_s} s budget")]
    _keep_output(log_dir, "gpu_bench", proc)
    rows = [_bench_row(json.loads(line)) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not rows:
        rows.append(Row("decode tok/s", Status.FAIL, f"ops.gpu_bench exited {proc.returncode}: {proc.stderr[-200:]}"))
    return rows


def _bench_row(cell: dict[str, object]) -> Row:
    name = f"decode tok/s {cell['backend']} batch {cell['batch']}"
    if cell["tok_s"] is not None:
        return Row(name, Status.PASS, f"{float(cell['tok_s']):,.0f} tok/s")  # type: ignore[arg-type]
    error = str(cell["error"])
    missing = cell["backend"] == "flashinfer" and "flashinfer package" in error
    return Row(name, Status.SKIP if missing else Status.FAIL, error[:100])


def is_failure(row: Row) -> bool:
    """A FAIL, or a skip for any reason but flashinfer being absent (the one optional package)."""
    return row.status is Status.FAIL or (row.status is Status.SKIP and "flashinfer" not in row.detail)


def print_table(rows: list[Row], seconds: float) -> None:
    width = max(len(r.check) for r in rows)
    print(f"\n{'check'.ljust(width)}  status  detail")
    print(f"{'-' * width}  ------  {'-' * 40}")
    for r in rows:
        print(f"{r.check.ljust(width)}  {r.status.value:<6}  {r.detail}")
    failed = sum(is_failure(r) for r in rows)
    print(f"\n{len(rows)} rows, {failed} failed, {seconds:.0f} s")


def _within(budget_s: int, deadline: float) -> int:
    """A step's budget, cut to what is left of the whole check's (at least 1 s, so it reports a timeout)."""
    return max(1, min(budget_s, int(deadline - time.monotonic())))


def cuda_device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="tokenledger's CUDA check (ops/gpu_check.sh)")
    p.add_argument("--missing-deps", action="store_true",
                   help="print the requirements not installed here (one a line), and exit")
    p.add_argument("--skip-bench", action="store_true", help="the tests only, without decode tok/s")
    p.add_argument("--log-dir", type=Path, default=None, help="keep each step's whole output there")
    args = p.parse_args(argv)
    if args.missing_deps:
        for requirement in missing_requirements():  # one a line: a requirements file for pip (empty: nothing)
            print(requirement)
        return 0
    device = cuda_device_name()
    if device is None:
        print("gpu_check: no CUDA device is visible to torch here (torch.cuda.is_available() is False); "
              "run it on a machine with a GPU and a CUDA build of torch. Nothing was checked.", file=sys.stderr)
        return EXIT_NO_CUDA
    print(f"gpu_check on {device}", flush=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started, rows = time.monotonic(), []
    deadline = started + TOTAL_BUDGET_S
    for paths, budget in PYTEST_STEPS:
        rows += run_pytest(paths, _within(budget, deadline), env, args.log_dir)
    if not args.skip_bench:
        rows += run_bench(_within(BENCH_TIMEOUT_S, deadline), env, args.log_dir)
    print_table(rows, time.monotonic() - started)
    return EXIT_FAILED if any(is_failure(r) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
