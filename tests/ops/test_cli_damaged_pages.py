"""The tools survive what they exist for (issue 10 D.16): a damaged B-tree page or a far-away key
never kills `salvage`, `replay`, `audit` or `export`; salvage copies what is readable, reports
exactly what it lost, and never presents an empty log as its result."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from logcli_helpers import cli, cli_subprocess, record_values, write_pristine_log

from commitlog.codec import lsn_key
from commitlog.wal import Durability, Wal, WalConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "commitlog"))
from commitlog_helpers import damage_index_pages  # noqa: E402

PAGE = 4096
DAMAGED_LSN = 100


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pristine_log(tmp_path_factory.mktemp("pristine") / "log")


def _damage_page_of(log: Path, value: bytes, how: str) -> None:
    """Overwrite the header ('header': LMDB says MDB_CORRUPTED) or the node pointers ('pointers':
    reading it kills the process with SIGBUS/SIGSEGV) of the leaf page holding `value`."""
    data = bytearray((log / "data.mdb").read_bytes())
    page = data.find(value) // PAGE
    start, size = (page * PAGE, 16) if how == "header" else (page * PAGE + 16, 48)
    data[start:start + size] = b"\xff" * size
    (log / "data.mdb").write_bytes(bytes(data))


def _damaged(pristine: Path, tmp_path: Path, how: str) -> Path:
    log = tmp_path / "log"
    shutil.copytree(pristine, log)
    _damage_page_of(log, record_values(pristine)[DAMAGED_LSN], how)
    return log


@pytest.mark.parametrize("how", ["header", "pointers"])
def test_readers_on_a_damaged_page_exit_2_with_the_salvage_command_never_a_crash(
        pristine: Path, tmp_path: Path, how: str) -> None:
    log = _damaged(pristine, tmp_path, how)
    for command in ("replay", "audit", "export"):
        ran = cli_subprocess(command, "--log-dir", log)
        assert ran.rc == 2, (command, ran.rc, ran.err[-500:])
        assert "Traceback" not in ran.err and "tokenledger salvage" in ran.err, (command, ran.err)


@pytest.mark.parametrize("how", ["header", "pointers"])
def test_salvage_of_a_damaged_page_copies_every_readable_record_and_names_the_lost_ones(
        pristine: Path, tmp_path: Path, how: str) -> None:
    log = _damaged(pristine, tmp_path, how)
    out = tmp_path / "out"
    ran = cli_subprocess("salvage", "--log-dir", log, "--out", out, "--json")
    assert ran.rc == 0 and "Traceback" not in ran.err, (ran.rc, ran.err[-500:])
    report = ran.json()
    lost = set(report["lost_lsns"]) | {n for a, b in report["lost_ranges"] for n in range(a, b + 1)}
    copied = record_values(out)
    original = record_values(pristine)
    assert DAMAGED_LSN in lost and DAMAGED_LSN not in copied
    assert set(copied) - {max(copied)} | lost == set(original)  # every record is either copied or named lost
    assert len(lost) < len(original) // 2  # the records after the damaged page were copied too
    assert max(original) - 1 in copied
    for lsn in set(copied) - {max(copied)}:  # the closing CHECKPOINT is new
        assert copied[lsn][38:] == original[lsn][38:]  # same body; only the chain hash is recomputed
    checked = cli("verify", "--log-dir", out, "--json")
    assert checked.rc in (0, 1)
    body = checked.json()  # verify on the copy names the same losses
    assert set(body["salvage_lost_lsns"]) | {n for a, b in body["salvage_lost_ranges"] for n in range(a, b + 1)} == lost


def test_salvage_skips_a_record_under_a_far_away_key(pristine: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    shutil.copytree(pristine, log)
    values = record_values(pristine)
    wal = Wal.open(log, WalConfig(durability=Durability.NONE))
    with wal.env.begin(write=True) as txn:
        txn.put(lsn_key(2**62), values[5], db=wal.records)
    wal.close()
    ran = cli_subprocess("salvage", "--log-dir", log, "--out", tmp_path / "out", "--json")
    assert ran.rc == 0 and "Traceback" not in ran.err, ran.err[-500:]
    report = ran.json()
    assert report["lost_lsns"] == [] and report["skipped_keys"] == [lsn_key(2**62).hex()]
    assert report["checkpoint_lsn"] == max(values) + 1  # LSNs go on from the real end, not from 2**62


def test_salvage_never_presents_an_empty_log(pristine: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    shutil.copytree(pristine, log)
    data = bytearray((log / "data.mdb").read_bytes())
    for page in range(2, len(data) // PAGE):  # every page past the two meta pages
        data[page * PAGE:page * PAGE + 16] = b"\xff" * 16
    (log / "data.mdb").write_bytes(bytes(data))
    out = tmp_path / "out"
    ran = cli_subprocess("salvage", "--log-dir", log, "--out", out)
    assert ran.rc == 2 and "Traceback" not in ran.err and "no record" in ran.err, (ran.rc, ran.err[-500:])
    assert not (out / "data.mdb").exists()


@pytest.mark.parametrize("seed", range(6))
def test_random_page_damage_never_crashes_a_reader_and_salvage_never_writes_an_empty_log(
        pristine: Path, tmp_path: Path, seed: int) -> None:
    import random

    log = tmp_path / "log"
    shutil.copytree(pristine, log)
    data = bytearray((log / "data.mdb").read_bytes())
    rng = random.Random(seed)
    for _ in range(1 + seed):
        page = rng.randrange(2, len(data) // PAGE)
        at = page * PAGE + rng.randrange(64)
        data[at:at + 16] = bytes(rng.randrange(256) for _ in range(16))
    (log / "data.mdb").write_bytes(bytes(data))
    for command in ("replay", "audit", "export"):
        ran = cli_subprocess(command, "--log-dir", log)
        assert ran.rc in (0, 2) and "Traceback" not in ran.err, (command, ran.rc, ran.err[-500:])
    out = tmp_path / "out"
    ran = cli_subprocess("salvage", "--log-dir", log, "--out", out, "--json", timeout=120)
    assert ran.rc in (0, 2) and "Traceback" not in ran.err, (ran.rc, ran.err[-500:])
    if ran.rc == 0:
        assert ran.json()["num_copied"] > 0 and cli("verify", "--log-dir", out).rc in (0, 1)
    else:
        assert not (out / "data.mdb").exists()


def test_an_unreadable_index_page_is_an_index_violation_for_verify_and_readers_refuse_the_log(
        pristine: Path, tmp_path: Path) -> None:
    """The records are sound and salvage rebuilds the index from them, so verify reports the damaged
    by_rid page as an index violation (exit 1), as it does a rewritten entry; the readers, which cannot
    back an account without the index, refuse the log (exit 2), naming salvage. Found by the page fuzz."""
    log = tmp_path / "log"
    shutil.copytree(pristine, log)
    damage_index_pages(log, "req-20")
    ran = cli("verify", "--log-dir", log, "--json")
    body = ran.json()
    assert ran.rc == 1 and body["error"] is None, (ran.rc, body["error"])
    assert [v["check"] for v in body["violations"]] == ["index"]
    assert "cannot read" in body["violations"][0]["message"] and "salvage" in body["violations"][0]["message"]
    for command in ("replay", "audit", "export"):
        read = cli_subprocess(command, "--log-dir", log)
        assert read.rc == 2 and "tokenledger salvage" in read.err, (command, read.rc, read.err[-500:])
