"""ops/gpu_check on a machine without CUDA: a clear message and exit code 2, from the module and from
the shell script; and the summary's rules (a skip is never a pass) on a hand-made pytest report."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ops import gpu_check
from ops.gpu_check import Row, Status, is_failure, rows_from_junit

ROOT = Path(__file__).resolve().parents[2]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer given where CUDA is absent")


@no_cuda
def test_gpu_check_without_cuda_says_so_and_exits_2(capsys):
    assert gpu_check.main([]) == gpu_check.EXIT_NO_CUDA == 2
    err = capsys.readouterr().err
    assert "no CUDA device is visible to torch" in err and "Nothing was checked" in err


@no_cuda
def test_gpu_check_script_without_cuda_exits_2_before_installing_anything():
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run([str(ROOT / "ops" / "gpu_check.sh")], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "nothing was checked" in proc.stderr and "installing" not in proc.stdout


def test_missing_requirements_never_names_the_device_packages():
    missing = gpu_check.missing_requirements()
    assert all(not r.lower().startswith(("torch", "triton", "flashinfer")) for r in missing)


JUNIT = """<testsuites><testsuite>
<testcase classname="t" name="test_parity[torch-overlap_on]"/>
<testcase classname="t" name="test_parity[triton-overlap_on]"><failure message="assert [1] == [2]"/></testcase>
<testcase classname="t" name="test_abort[torch-0]"/>
<testcase classname="t" name="test_abort[torch-1]"/>
<testcase classname="t" name="test_abort[flashinfer-0]"><skipped message="flashinfer is not installed"/></testcase>
<testcase classname="t" name="test_kernel[reqs0-2]"/>
<testcase classname="t" name="test_kernel[reqs1-4]"><skipped message="needs triton"/></testcase>
</testsuite></testsuites>"""


def test_summary_groups_by_backend_and_never_counts_a_skip_as_a_pass(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text(JUNIT)
    rows = {r.check: r for r in rows_from_junit(xml)}
    assert rows["test_parity [torch, overlap_on]"].status is Status.PASS
    assert rows["test_parity [triton, overlap_on]"].status is Status.FAIL
    assert rows["test_abort [torch]"] == Row("test_abort [torch]", Status.PASS, "2/2 passed")
    assert rows["test_abort [flashinfer]"].status is Status.SKIP
    assert rows["test_kernel"].status is Status.SKIP and rows["test_kernel"].detail.startswith("1/2 passed")
    assert not is_failure(rows["test_abort [flashinfer]"])  # flashinfer is the one optional package
    assert is_failure(rows["test_kernel"]) and is_failure(rows["test_parity [triton, overlap_on]"])


def test_missing_deps_prints_nothing_when_nothing_is_missing(capsys, monkeypatch):
    monkeypatch.setattr(gpu_check, "missing_requirements", lambda: [])
    assert gpu_check.main(["--missing-deps"]) == 0 and capsys.readouterr().out == ""
    monkeypatch.setattr(gpu_check, "missing_requirements", lambda: ["lmdb>=1.4", "structlog>=24.1"])
    assert gpu_check.main(["--missing-deps"]) == 0 and capsys.readouterr().out == "lmdb>=1.4\nstructlog>=24.1\n"
