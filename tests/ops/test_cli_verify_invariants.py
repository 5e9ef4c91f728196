"""`tokenledger verify` on hand-written logs: each invariant violation exits 1 naming rid and LSN."""
from __future__ import annotations

from pathlib import Path

import pytest
from logcli_helpers import abort, begin, cli, commit, discard, finish, good_request, server, write_log

from commitlog import Kind
from commitlog.state import FinishReason
from ops.logcli import checklog
from ops.logcli.checklog import check_log


def _violations(log_dir: Path) -> list[dict]:
    ran = cli("verify", "--log-dir", log_dir, "--json")
    assert ran.rc == 1, (ran.rc, ran.out, ran.err)
    assert "Traceback" not in ran.err
    return ran.json()["violations"]


def test_well_formed_log_passes_and_prints_the_head(tmp_path: Path) -> None:
    log = tmp_path / "log"
    enc = write_log(log, [[server(Kind.SERVER_START)], good_request("a"), good_request("b", 5), [server(Kind.SERVER_STOP)]])
    ran = cli("verify", "--log-dir", log)
    assert ran.rc == 0, ran.out
    assert enc.prev_hash.hex() in ran.out and "OK" in ran.out


def test_i2_commit_with_tokens_after_abort_requested_is_a_violation(tmp_path: Path) -> None:
    log = tmp_path / "log"
    write_log(log, [[begin("r"), commit("r", [5], wm=4)], [abort("r")], [commit("r", [6], wm=5)],
                    [finish("r", "abort", 2, 5)]])
    (v,) = _violations(log)
    assert (v["lsn"], v["rid"], v["check"]) == (4, "r", "I2") and "ABORT_REQUESTED at LSN 3" in v["message"]


def test_i6_finish_total_disagreeing_with_commits_is_a_violation(tmp_path: Path) -> None:
    log = tmp_path / "log"
    write_log(log, [[begin("r"), commit("r", [5, 6], wm=5)], [finish("r", "length", 3, 5)]])
    (v,) = _violations(log)
    assert (v["lsn"], v["rid"], v["check"]) == (3, "r", "I6") and "n_out=3" in v["message"]


@pytest.mark.parametrize("case", ["watermark", "lengths", "after_finish", "double_begin", "open_at_restart",
                                  "fin_reason", "no_begin"])
def test_state_machine_violations_name_rid_and_lsn(tmp_path: Path, case: str) -> None:
    log = tmp_path / "log"
    groups, lsn, check = {
        "watermark": ([[begin("r"), commit("r", [1], wm=9), commit("r", [2], wm=7)]], 3, "watermark"),
        "lengths": ([[begin("r"), commit("r", [1, 2], wm=5, lp=[-1.0])]], 2, "lengths"),
        "after_finish": ([good_request("r"), [commit("r", [9], wm=9)]], 6, "I7"),
        "double_begin": ([[begin("r")], [begin("r")]], 2, "I7"),
        "open_at_restart": ([[server(Kind.SERVER_START), begin("r")], [server(Kind.SERVER_START)]], 3, "I7"),
        "fin_reason": ([[begin("r"), commit("r", [1], wm=4, fin=FinishReason.STOP, matched=1),
                         finish("r", "length", 1, 4)]], 3, "I6"),
        "no_begin": ([[commit("r", [1], wm=4)]], 1, "state"),
    }[case]
    write_log(log, groups)
    violations = _violations(log)
    assert (violations[0]["lsn"], violations[0]["rid"], violations[0]["check"]) == (lsn, "r", check), violations


def test_discard_after_abort_is_not_a_violation(tmp_path: Path) -> None:
    log = tmp_path / "log"
    write_log(log, [[server(Kind.SERVER_START), begin("r"), commit("r", [5], wm=4)], [abort("r")], [discard("r")],
                    [finish("r", "abort", 1, 4)], [server(Kind.SERVER_STOP)]])
    ran = cli("verify", "--log-dir", log, "--json")
    assert ran.rc == 0, ran.out
    assert ran.json()["requests"]["abort"] == 1


def _long_log(log: Path) -> None:
    """Requests that span the ranges parallel jobs split the log into, with violations past the split."""
    groups = [[server(Kind.SERVER_START)]] + [[begin(f"r{i}")] for i in range(4)]
    for step in range(40):
        groups.append([commit(f"r{i}", [step], wm=10 + step) for i in range(4)])
    groups.append([abort("r1")])
    groups.append([commit("r1", [99], wm=60)])  # I2, far from its BEGIN
    groups.append([finish("r0", "length", 40, 49), finish("r1", "abort", 41, 60), finish("r2", "length", 39, 49)])
    groups.append([server(Kind.SERVER_START)])  # r3 still running: I7
    write_log(log, groups)


def test_parallel_ranges_find_exactly_what_one_range_finds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "log"
    _long_log(log)
    one = check_log(str(log), jobs=1)
    monkeypatch.setattr(checklog, "RECORDS_PER_JOB", 10)
    for jobs in (2, 3, 7):
        many = check_log(str(log), jobs=jobs)
        assert many.violations == one.violations, jobs
        assert (many.head, many.num_records, many.merged.finish_counts) == (one.head, one.num_records,
                                                                            one.merged.finish_counts)
    assert [(v.rid, v.check) for v in one.violations] == [("r1", "I2"), ("r2", "I6"), ("r3", "I7")]


@pytest.mark.parametrize(("groups", "message"), [
    ([[begin("r"), commit("r", [1], wm=4), commit("r", [2], wm=5, cached=3)]], "not the request's first"),
    ([[begin("r"), commit("r", [1], wm=2, cached=3)]], "below the cached prefix"),
])
def test_a_cached_prefix_off_the_first_commit_or_beyond_its_watermark_is_a_violation(tmp_path: Path, groups,
                                                                                      message) -> None:
    write_log(tmp_path / "log", groups)
    (v,) = _violations(tmp_path / "log")
    assert v["rid"] == "r" and v["check"] == "watermark" and message in v["message"]


def test_a_cached_prefix_on_the_first_commit_verifies(tmp_path: Path) -> None:
    write_log(tmp_path / "log", [[begin("r"), commit("r", [1], wm=4, cached=3)], [finish("r", "length", 1, 4)]])
    assert cli("verify", "--log-dir", tmp_path / "log").rc == 0
