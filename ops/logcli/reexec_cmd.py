"""`tokenledger replay --reexecute`: prove each logged token by re-running the logged schedule.

Exit 0: every selected request proven. Exit 1: a divergence, or a request that could not be
re-executed (each says why). Exit 2: the log is damaged, or the model cannot be loaded.
"""
from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from ops.logcli.common import EXIT_CORRUPT, EXIT_OK, EXIT_VIOLATION, dumps, fail, open_log, progress_bar, stdout


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reexecute", action="store_true",
                   help="re-run the logged forwards with the model and prove every token and logprob bit for bit")
    p.add_argument("--model-path", default=None, metavar="P",
                   help="with --reexecute: this checkpoint instead of the logged one (no fingerprint check)")
    p.add_argument("--isolated", action="store_true",
                   help="with --reexecute: each request alone (a log from another machine): tokens must match, "
                        "logprobs within 1e-4, greedy ties named")
    p.add_argument("--json", action="store_true", help="with --reexecute: print one JSON object")


def run(args: argparse.Namespace) -> int:
    from ops.reexec.compare import LOGPROB_TOLERANCE, Status
    from ops.reexec.driver import Options, reexecute
    from ops.reexec.plan import build_plan
    from ops.reexec.runtime import build_differences

    with open_log(args.log_dir) as reader:
        instances = build_plan(reader.records())
    options = Options(args.model_path, args.isolated, frozenset(args.rid) if args.rid else None)
    total = sum(len(i.events) for i in instances)
    done = [0]
    with progress_bar("re-execute", total) as bar:
        def tick() -> None:
            done[0] += 1
            bar(done[0])
        try:
            findings = reexecute(instances, options, tick)
        except Exception as exc:  # noqa: BLE001 - the model or its kernels failed: a message, never a traceback
            from server.errors import TokenLedgerError

            if isinstance(exc, TokenLedgerError):
                raise
            return fail(f"re-execution failed inside the engine: {type(exc).__name__}: {exc}")
    if options.rids is not None and not findings:
        return fail(f"no request {sorted(options.rids)} in {args.log_dir}")
    code = EXIT_OK if all(f.status is Status.PROVEN for f in findings) else EXIT_VIOLATION
    differences = list(dict.fromkeys(n for i in instances if i.engine is not None for n in build_differences(i.engine)))
    if args.json:
        print(dumps({"log_dir": args.log_dir, "mode": "isolated" if args.isolated else "logged schedule",
                     "logprob_tolerance": LOGPROB_TOLERANCE if args.isolated else 0.0, "exit_code": code,
                     "build_differences": differences, "requests": [_as_json(f) for f in findings]}))
    else:
        _print(findings, args.isolated)
        if differences:
            stdout().print("note: this machine is not the one that served, so a divergence here may come from that "
                           "rather than from the log (re-execute there, or use --isolated):\n  " + "\n  ".join(differences))
    return code


def _as_json(f: Any) -> dict[str, Any]:
    d = f.divergence
    return {"rid": f.rid, "incarnation": f.incarnation, "status": f.status.value, "reason": f.reason,
            "tokens_checked": f.tokens_checked, "logprobs_checked": f.logprobs_checked,
            "discarded_rerun": f.discarded_rerun, "greedy_ties": f.ties,
            "divergence": None if d is None else {"position": d.position, "what": d.what, "logged": _jsonable(d.logged),
                                                  "recomputed": _jsonable(d.recomputed)}}


def _jsonable(value: Any) -> Any:
    return [list(v) if isinstance(v, tuple) else v for v in value] if isinstance(value, list) else value


def _print(findings: list[Any], isolated: bool) -> None:
    from ops.reexec.compare import Status

    mode = "each request alone (--isolated)" if isolated else "the logged schedule, bit for bit"
    table = Table("rid", "status", "tokens", "logprobs", "discarded re-run", "detail",
                  title=f"{len(findings)} request(s) re-executed: {mode}")
    for f in findings:
        rid = f.rid if f.incarnation == 1 else f"{f.rid} (#{f.incarnation})"
        detail = f.divergence.describe() if f.divergence else (f.reason or "")
        if f.ties:
            detail = (detail + "; " if detail else "") + f"greedy tie(s) at output position {f.ties}"
        table.add_row(rid, f.status.value, str(f.tokens_checked), str(f.logprobs_checked), str(f.discarded_rerun), detail)
    out = stdout()
    out.print(table)
    counts = {s: sum(f.status is s for f in findings) for s in Status}
    out.print(", ".join(f"{n} {s.value}" for s, n in counts.items()))
    first = next((f for f in findings if f.status is Status.DIVERGED), None)
    if first is not None and first.divergence is not None:
        out.print(f"first divergence: {first.rid} at {first.divergence.describe()}")


__all__ = ["EXIT_CORRUPT", "add_arguments", "run"]
