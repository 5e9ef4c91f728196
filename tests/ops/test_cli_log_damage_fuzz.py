"""Fuzzed damage to a real log (issue 10, "Keep the classes covered"): whatever is done to the four
LMDB tables (records, by_rid, live, meta) or to raw pages of `data.mdb`,

- every post-mortem command exits 0, 1 or 2, prints no traceback, and no read of it hits a bug
  (an `internal` outcome in a forked reader);
- `verify`, `replay`, `audit` and `export` agree on whether the log is sound (exit 0 for all, or
  non-zero for all), and `audit --rid` refuses every rid whose index or live entry verify rejects;
- a restart (`Ledger.open`, what `serve` and the Engine do) refuses, with a typed error naming the
  salvage command, every log verify rejects for a reason recovery is there to catch (records, keys,
  checkpoint, live table: FORMAT.md "Recovery"; the base log fits in the tail recovery checks), and
  accepts every log verify accepts. The per-request index is outside recovery's reach (proving it
  costs a full scan) except for an unreadable page at its root or edges; readers and verify catch the
  rest instead.

The base log is built once, by a real Ledger: retention's CHECKPOINT with a kept request, a reused
rid, an abort with its DISCARD, logprobs, and two requests a crash left running. Each example damages
a copy. Examples are derandomized, so CI sees the same ones; `make test-slow` runs many more.
"""
from __future__ import annotations

import multiprocessing
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from unittest import mock

import lmdb
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from logcli_helpers import Ran, cli

import commitlog.isolate
from commitlog import CommitLogError, CorruptRecordError, FinishReason, Ledger, RetentionPolicy, apply_retention
from commitlog.isolate import Outcome

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "commitlog"))
from commitlog_helpers import FAST, crash, sync_flush  # noqa: E402

PAGE = 4096
TABLES = ("records", "by_rid", "live", "meta")
READERS = ("replay", "audit", "export")
RESTART_TIMEOUT_S = 60
QUICK = settings(max_examples=12, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(QUICK, max_examples=300)


# --- the base log ---------------------------------------------------------------------------------

def _request(ledger: Ledger, rid: str, tokens: list[int], finish: bool = True) -> None:
    ledger.begin(rid, [1, 2, 3], {"max_new_tokens": len(tokens), "seed": 0})
    for i, token in enumerate(tokens):
        txn = ledger.txn(rid)
        txn.append_token(token, -0.25 * (i + 1), [(token, -0.25), (token + 1, -1.5)])
        txn.advance_watermark(4 + i)
        if finish and i == len(tokens) - 1:
            txn.set_finish(FinishReason.LENGTH, len(tokens))
        txn.commit()
    sync_flush(ledger)


def _aborted(ledger: Ledger, rid: str) -> None:
    from commitlog import DoomSource

    _request(ledger, rid, [5, 6], finish=False)
    ledger.doom(rid, "client asked", DoomSource.API)
    txn = ledger.txn(rid)
    txn.append_token(7, -0.5)
    txn.commit()  # doomed: rolled back, DISCARD then FINISH abort
    sync_flush(ledger)


def build_base_log(log: Path) -> None:
    """~70 records, all within recovery's tail check (256): a crash left `run-1` and `run-2` open."""
    ledger = Ledger.open(log, FAST, model_fingerprint="fp-fuzz", tokenizer_dir="/nonexistent/tokenizer")
    _request(ledger, "old-0", [11, 12, 13])
    _request(ledger, "keep", [21], finish=False)  # running across the retention cut: listed as kept
    _request(ledger, "old-1", [14, 15])
    apply_retention(ledger, RetentionPolicy(max_age_s=0))
    sync_flush(ledger)
    txn = ledger.txn("keep")
    txn.append_token(22, -0.1)
    txn.set_finish(FinishReason.STOP, "</s>")
    txn.commit()
    sync_flush(ledger)
    for i in range(3):
        _request(ledger, f"a{i}", [30 + i, 40 + i, 50 + i])
    _aborted(ledger, "ab")
    _request(ledger, "again", [61])
    _request(ledger, "again", [62, 63])  # the rid used again once it finished
    _request(ledger, "run-1", [71, 72], finish=False)
    _request(ledger, "run-2", [81], finish=False)
    crash(ledger)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    log = tmp_path_factory.mktemp("pristine") / "log"
    build_base_log(log)
    verdict = judge(log, tmp_path_factory.mktemp("pristine-check"))
    assert verdict.sound == {"verify": True, "replay": True, "audit": True, "export": True}, verdict
    assert verdict.restart == "ok", verdict
    return log


# --- damage ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Edit:
    """One edit of one table, made through LMDB; `pick`/`other` choose keys (modulo the table's size)."""

    op: str  # flip | truncate | delete | stray | copy | swap
    table: str
    pick: int
    other: int = 0
    offset: int = 0
    byte: int = 1
    stray: str = "longer"  # longer | shorter | far

    def apply(self, txn: lmdb.Transaction, db: Any) -> None:
        items = list(txn.cursor(db))
        if not items:
            return
        key, value = items[self.pick % len(items)]
        other_key, other_value = items[self.other % len(items)]
        if self.op == "flip" and value:
            at = self.offset % len(value)
            txn.put(key, value[:at] + bytes([value[at] ^ self.byte]) + value[at + 1:], db=db)
        elif self.op == "truncate":
            txn.put(key, value[:self.offset % max(1, len(value))], db=db)
        elif self.op == "delete":
            txn.delete(key, db=db)
        elif self.op == "stray":
            txn.put(self._stray_key(key), other_value, db=db)
        elif self.op == "copy" and key != other_key:
            txn.put(other_key, value, db=db)
        elif self.op == "swap":
            txn.put(key, other_value, db=db)
            txn.put(other_key, value, db=db)

    def _stray_key(self, key: bytes) -> bytes:
        if self.stray == "longer":
            return key + bytes([self.byte])
        if self.stray == "shorter" and len(key) > 1:
            return key[:-1]
        return (2**62 + self.offset).to_bytes(8, "big") if self.table == "records" else b"\xff" + key


@dataclass(frozen=True)
class PageFlip:
    """Overwrite `size` bytes at `offset` of page `page` (modulo the file's pages) with `fill`."""

    page: int
    offset: int
    size: int
    fill: bytes

    def apply(self, data: bytearray) -> None:
        at = (self.page % (len(data) // PAGE)) * PAGE + self.offset % PAGE
        patch = (self.fill * self.size)[:self.size]
        data[at:at + len(patch)] = patch


def damage(log: Path, edits: list[Edit], flips: list[PageFlip]) -> None:
    if edits:
        env = lmdb.open(str(log), max_dbs=8, map_size=64 << 20)
        try:
            with env.begin(write=True) as txn:
                for edit in edits:
                    edit.apply(txn, env.open_db(_db_name(edit.table), txn=txn, create=False))
        finally:
            env.close()
    if flips:
        data = bytearray((log / "data.mdb").read_bytes())
        for flip in flips:
            flip.apply(data)
        (log / "data.mdb").write_bytes(bytes(data))


def _db_name(table: str) -> bytes:
    return table.encode()


edits = st.builds(
    Edit, op=st.sampled_from(["flip", "flip", "truncate", "delete", "stray", "copy", "swap"]),
    table=st.sampled_from(TABLES), pick=st.integers(0, 10_000), other=st.integers(0, 10_000),
    offset=st.integers(0, 10_000), byte=st.integers(1, 255), stray=st.sampled_from(["longer", "shorter", "far"]))
page_flips = st.builds(PageFlip, page=st.integers(0, 10_000), offset=st.integers(0, PAGE - 1),
                       size=st.integers(1, 64), fill=st.binary(min_size=1, max_size=8))


# --- judging one damaged log ----------------------------------------------------------------------

@dataclass
class Verdict:
    ran: dict[str, Ran]
    sound: dict[str, bool]
    restart: str  # ok | refused: ... | error: ... (a bug) | crashed: ...
    internal: list[str]  # reader children that hit a bug (status `internal`)
    verify_checks: set[str]  # the checks of verify's violations, plus `failure` when it exit 2
    flagged_rids: set[str]  # rids verify names in an index or live violation


@contextmanager
def _watch_internal() -> Iterator[list[str]]:
    """Collect every forked reader's outcome of status `internal` (a bug, whatever it printed)."""
    seen: list[str] = []
    receive = commitlog.isolate._receive

    def watched(conn: Any, proc: Any) -> Outcome:
        outcome = receive(conn, proc)
        if outcome.status == "internal":
            seen.append(outcome.message)
        return outcome

    with mock.patch.object(commitlog.isolate, "_receive", watched):
        yield seen


def _run(*argv: str | Path) -> Ran:
    try:
        ran = cli(*argv)
    except BaseException as exc:  # noqa: BLE001 - the property under test: nothing escapes the CLI
        pytest.fail(f"tokenledger {' '.join(map(str, argv))} raised {type(exc).__name__}: {exc}")
    assert ran.rc in (0, 1, 2), (argv, ran.rc, ran.err[-800:])
    assert "Traceback" not in ran.out + ran.err, (argv, ran.err[-2000:])
    return ran


def _restart_verdict(log: str) -> str:
    try:
        ledger = Ledger.open(log, FAST)
    except CorruptRecordError as exc:  # says what to do: salvage, or (nothing readable) restore a backup
        named = "tokenledger salvage" in str(exc) or "backup" in str(exc)
        return f"{'refused' if named else 'error: no way out named'}: CorruptRecordError: {exc}"
    except CommitLogError as exc:  # e.g. FormatVersionError: salvage cannot help, the message says what to do
        return f"refused: {type(exc).__name__}: {exc}"
    except BaseException as exc:  # noqa: BLE001 - `serve` would die with a traceback
        return f"error: {type(exc).__name__}: {exc}"
    ledger.close()
    return "ok"


def _restart_child(log: str, conn: Connection) -> None:
    conn.send(_restart_verdict(log))
    conn.close()


def restart(log: Path) -> str:
    """`Ledger.open` in a forked child (not a daemon: it forks its own preflight reader): a crash there is a
    finding, not the end of the test run."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_restart_child, args=(str(log), send))
    proc.start()
    send.close()
    try:
        verdict = recv.recv() if recv.poll(RESTART_TIMEOUT_S) else None
    except EOFError:  # the child died before it answered: reported below as the crash it is
        verdict = None
    proc.join(RESTART_TIMEOUT_S)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return "error: the restart hung"
    return str(verdict) if verdict is not None else f"crashed: exit status {proc.exitcode}"


def judge(log: Path, scratch: Path) -> Verdict:
    with _watch_internal() as internal:
        ran = {"verify": _run("verify", "--log-dir", log, "--json", "--jobs", "1"),
               "replay": _run("replay", "--log-dir", log),
               "audit": _run("audit", "--log-dir", log, "--json"),
               "export": _run("export", "--log-dir", log)}
        body = ran["verify"].json()
        checks = {v["check"] for v in body["violations"]} | ({"failure"} if body["error"] else set())
        flagged = {v["rid"] for v in body["violations"] if v["check"] in ("index", "live") and v["rid"]}
        for rid in sorted(flagged):
            ran[f"audit --rid {rid}"] = _run("audit", "--log-dir", log, "--rid", rid, "--json")
        ran["salvage"] = _run("salvage", "--log-dir", log, "--out", scratch / "salvaged", "--json")
        if ran["salvage"].rc == 0:
            ran["verify salvaged"] = _run("verify", "--log-dir", scratch / "salvaged", "--jobs", "1")
    sound = {name: ran[name].rc == 0 for name in ("verify", *READERS)}
    return Verdict(ran, sound, restart(log), internal, checks, flagged)


def check_damaged(pristine: Path, edits: list[Edit], flips: list[PageFlip]) -> None:
    with tempfile.TemporaryDirectory(prefix="fuzzlog-") as tmp:
        log = Path(tmp) / "log"
        shutil.copytree(pristine, log)
        damage(log, edits, flips)
        v = judge(log, Path(tmp))
        summary = {name: (r.rc, r.err.strip().splitlines()[-1:] if r.err.strip() else "") for name, r in v.ran.items()}
        assert not v.internal, (v.internal, summary)
        assert len(set(v.sound.values())) == 1, ("readers disagree on soundness", summary)
        assert v.ran["salvage"].rc in (0, 2) and v.ran.get("verify salvaged", v.ran["salvage"]).rc in (0, 1, 2)
        for rid in v.flagged_rids:
            assert v.ran[f"audit --rid {rid}"].rc == 2, (f"audit --rid {rid} shows what verify rejects", summary)
        assert not v.restart.startswith(("error", "crashed")), (v.restart, summary)
        if v.sound["verify"] and not flips:
            assert v.restart == "ok", ("restart refuses a log verify accepts", v.restart, summary)
        elif v.verify_checks - {"index"}:
            assert v.restart.startswith("refused"), ("restart accepts a log verify rejects", v.verify_checks, summary)


# --- the tests ------------------------------------------------------------------------------------

def _fuzz_tables(pristine: Path, table_edits: list[Edit]) -> None:
    check_damaged(pristine, table_edits, [])


def _fuzz_pages(pristine: Path, flips: list[PageFlip]) -> None:
    check_damaged(pristine, [], flips)


TableCase = Callable[[Path, list[Edit]], None]


@QUICK
@given(table_edits=st.lists(edits, min_size=1, max_size=3))
def test_table_damage_is_refused_alike_by_every_reader_and_by_a_restart(pristine: Path, table_edits: list[Edit]) -> None:
    _fuzz_tables(pristine, table_edits)


@QUICK
@given(flips=st.lists(page_flips, min_size=1, max_size=3))
def test_page_damage_never_crashes_a_command_and_readers_agree(pristine: Path, flips: list[PageFlip]) -> None:
    _fuzz_pages(pristine, flips)


@pytest.mark.slow
@SLOW
@given(table_edits=st.lists(edits, min_size=1, max_size=4))
def test_table_damage_many_examples(pristine: Path, table_edits: list[Edit]) -> None:
    _fuzz_tables(pristine, table_edits)


@pytest.mark.slow
@SLOW
@given(flips=st.lists(page_flips, min_size=1, max_size=4))
def test_page_damage_many_examples(pristine: Path, flips: list[PageFlip]) -> None:
    _fuzz_pages(pristine, flips)
