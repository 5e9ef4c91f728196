"""`verify` links every COMMIT/DISCARD to the FORWARD it came from, in launch and packed order
(FORMAT.md, "The schedule"), and refuses a launch that lists an aborted request (I2)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from logcli_helpers import abort, begin, cli, commit, discard, finish, write_log

from commitlog import Entry, Kind
from commitlog.schedule import forward_entry

START = Entry(Kind.SERVER_START, None, {"instance": "x", "pid": 0, "fingerprint": "", "engine": {}})
STOP = Entry(Kind.SERVER_STOP, None, {"instance": "x"})


def fwd(seq: int, rids: list[str], pre: list[int], n: list[int], q: int = 0, mode: str = "extend") -> Entry:
    return forward_entry(seq, mode, q, rids, pre, n)


def _violations(tmp_path: Path, groups: list[list[Entry]]) -> list[dict[str, Any]]:
    log = tmp_path / "log"
    write_log(log, groups)
    ran = cli("verify", "--log-dir", log, "--json")
    assert ran.rc in (0, 1), ran.err
    return [v for v in ran.json()["violations"] if v["check"] in ("schedule", "I2")]


def _sound() -> list[list[Entry]]:
    return [[START, begin("a"), begin("b"), fwd(1, ["a", "b"], [0, 0], [3, 3])],
            [fwd(2, ["a", "b"], [3, 3], [1, 1], q=1, mode="decode"), commit("a", [5], wm=3), commit("b", [6], wm=3)],
            [commit("a", [7], wm=4, fin=None), commit("b", [8], wm=4)],
            [abort("a"), finish("a", "abort", 2, 4), fwd(3, ["b"], [5], [1], q=0, mode="decode")],
            [discard("b"), finish("b", "abort", 2, 4), STOP]]


def test_sound_schedule_links_every_result(tmp_path: Path) -> None:
    assert _violations(tmp_path, _sound()) == []


def test_result_of_no_logged_forward_is_a_violation(tmp_path: Path) -> None:
    groups = _sound()
    groups[0] = groups[0][:-1]  # the first launch's FORWARD is gone
    found = _violations(tmp_path, groups)
    assert found and found[0]["rid"] == "a" and "belongs to no logged forward" in found[0]["message"]


def test_results_out_of_packed_order_are_a_violation(tmp_path: Path) -> None:
    groups = _sound()
    groups[1][1], groups[1][2] = groups[1][2], groups[1][1]  # b's result before a's
    messages = [v["message"] for v in _violations(tmp_path, groups)]
    assert any("has no result for 'a'" in m for m in messages), messages


def test_missing_result_of_a_running_member_is_a_violation(tmp_path: Path) -> None:
    groups = _sound()
    groups[2] = groups[2][:1]  # b's result of forward 2 was removed
    groups[3][1] = finish("a", "abort", 2, 4)
    found = _violations(tmp_path, groups)
    assert any(v["rid"] == "b" and "forward 2" in v["message"] and "no result" in v["message"] for v in found)


def test_launch_listing_an_aborted_request_is_an_i2_violation(tmp_path: Path) -> None:
    groups = [[START, begin("a"), abort("a"), fwd(1, ["a"], [0], [3])], [discard("a"), finish("a", "abort", 0, 0)]]
    found = _violations(tmp_path, groups)
    assert [(v["check"], v["rid"]) for v in found] == [("I2", "a")]


def test_log_from_before_the_schedule_is_not_checked_for_it(tmp_path: Path) -> None:
    old_start = Entry(Kind.SERVER_START, None, {"instance": "x", "pid": 0, "fingerprint": ""})
    groups = [[old_start, begin("a")], [commit("a", [5], wm=3)], [finish("a", "length", 1, 3)]]
    assert _violations(tmp_path, groups) == []
