"""`verify` over the synthetic interleaved log used for the 1,000,000-record benchmark."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from logcli_helpers import cli_subprocess

from ops.logcli import checklog
from ops.logcli.checklog import check_log
from ops.logcli.synthlog import write_log


def test_synthetic_log_verifies_the_same_in_one_range_and_in_many(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "log"
    num = write_log(log, 5000, concurrency=16)
    one = check_log(str(log), jobs=1)
    assert one.exit_code == 0 and one.num_records == num and one.merged.finish_counts.get("abort")
    monkeypatch.setattr(checklog, "RECORDS_PER_JOB", 500)
    many = check_log(str(log), jobs=5)
    assert (many.exit_code, many.head, many.num_records) == (0, one.head, num)
    assert many.merged.finish_counts == one.merged.finish_counts


@pytest.mark.slow
def test_verify_a_million_records_in_under_ten_seconds(tmp_path: Path) -> None:
    log = tmp_path / "log"
    write_log(log, 1_000_000)
    started = time.perf_counter()
    ran = cli_subprocess("verify", "--log-dir", log, timeout=120)
    elapsed = time.perf_counter() - started
    assert ran.rc == 0, ran.out
    assert elapsed < 10, f"verify took {elapsed:.1f} s"
