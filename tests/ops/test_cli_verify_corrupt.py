"""Damaged logs: `verify` exits 2 with the first bad LSN and the salvage command, never a traceback;
`salvage` copies every record before the damage."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from logcli_helpers import cli, cli_subprocess, record_values, write_pristine_log

from commitlog import LogReader


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pristine_log(tmp_path_factory.mktemp("pristine") / "log")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _flip_in_value(log: Path, value: bytes, offset: int, mask: int) -> None:
    data = bytearray((log / "data.mdb").read_bytes())
    at = data.find(value)
    assert at >= 0
    while at >= 0:  # copy-on-write leaves stale copies in free pages; flip every copy
        data[at + offset] ^= mask
        at = data.find(value, at + 1)
    (log / "data.mdb").write_bytes(bytes(data))


@pytest.mark.parametrize("seed", range(16))
def test_flipped_byte_in_any_record_exits_2_with_its_lsn_and_salvage_recovers_what_precedes(
        pristine: Path, tmp_path: Path, seed: int) -> None:
    values = record_values(pristine)
    rng = random.Random(seed)
    lsn = rng.choice(sorted(values))
    log = _copy(pristine, tmp_path / "log")
    _flip_in_value(log, values[lsn], rng.randrange(len(values[lsn])), 1 << rng.randrange(8))
    ran = cli("verify", "--log-dir", log, "--json")
    assert ran.rc == 2 and "Traceback" not in ran.err
    error = ran.json()["error"]
    assert error["lsn"] == lsn and error["salvage_command"] == f"tokenledger salvage --log-dir {log} --out {log}.salvaged"
    text = cli("verify", "--log-dir", log)
    assert text.rc == 2 and f"LSN {lsn}" in text.out and "tokenledger salvage" in text.out

    salvaged = cli("salvage", "--log-dir", log, "--out", tmp_path / "out", "--json")
    assert salvaged.rc == 0 and salvaged.json()["lost_lsns"] == [lsn]
    copied = record_values(tmp_path / "out")
    reader = LogReader.open(pristine)
    before = {r.lsn: (r.kind, r.rid, r.payload) for r in reader.records(1, lsn - 1)}
    reader.close()
    reader = LogReader.open(tmp_path / "out")
    after = {r.lsn: (r.kind, r.rid, r.payload) for r in reader.records(1, lsn - 1)}
    reader.close()
    assert after == before and lsn not in copied
    again = cli("verify", "--log-dir", tmp_path / "out", "--json")
    assert again.rc in (0, 1) and again.json()["salvage_lost_lsns"] == [lsn]  # 1: its request lost a record


@pytest.mark.parametrize("seed", range(6))
def test_random_bytes_anywhere_in_the_file_never_give_a_traceback(pristine: Path, tmp_path: Path, seed: int) -> None:
    log = _copy(pristine, tmp_path / "log")
    data = bytearray((log / "data.mdb").read_bytes())
    rng = random.Random(1000 + seed)
    for _ in range(8 * (seed + 1)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    (log / "data.mdb").write_bytes(bytes(data))
    ran = cli_subprocess("verify", "--log-dir", log)
    assert "Traceback" not in ran.err + ran.out
    assert ran.rc in (0, 1, 2), (ran.rc, ran.err)
    if ran.rc == 2:
        assert "error" in ran.err or "CORRUPT" in ran.out or "UNREADABLE" in ran.out


@pytest.mark.parametrize("keep", [0, 100, 8192, "half", "minus_page"])
def test_truncated_file_exits_2_with_a_message(pristine: Path, tmp_path: Path, keep: object) -> None:
    log = _copy(pristine, tmp_path / "log")
    size = (log / "data.mdb").stat().st_size
    cut = {"half": size // 2, "minus_page": size - 4096}.get(keep, keep)  # type: ignore[call-overload]
    with open(log / "data.mdb", "r+b") as f:
        f.truncate(int(cut))  # type: ignore[arg-type]
    ran = cli_subprocess("verify", "--log-dir", log)
    assert ran.rc == 2 and "Traceback" not in ran.err
    assert "truncated" in ran.out or "not a valid LMDB file" in ran.out


def test_missing_log_dir_is_unreadable_not_a_traceback(tmp_path: Path) -> None:
    ran = cli_subprocess("verify", "--log-dir", tmp_path / "nope")
    assert ran.rc == 2 and "no log at" in ran.out and "Traceback" not in ran.err
    for command in ("replay", "audit", "export"):
        ran = cli_subprocess(command, "--log-dir", tmp_path / "nope")
        assert ran.rc == 2 and "no log at" in ran.err and "Traceback" not in ran.err, command
