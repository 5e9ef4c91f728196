"""The one rule for a request id, shared by the HTTP/Engine boundary and the ledger.

A rid is a key of the per-request index and travels in every record, so it must be a
non-empty string that encodes to UTF-8 (no lone surrogates) within MAX_RID_BYTES.
"""
from __future__ import annotations

MAX_RID_BYTES = 256


def rid_problem(rid: object) -> str | None:
    """Why `rid` cannot name a request, or None when it can."""
    if not isinstance(rid, str):
        return f"rid must be a string, got {type(rid).__name__}"
    try:
        size = len(rid.encode("utf-8"))
    except UnicodeEncodeError:
        return "rid must be valid Unicode text (it contains a lone surrogate)"
    if not 1 <= size <= MAX_RID_BYTES:
        return f"rid must be 1..{MAX_RID_BYTES} UTF-8 bytes, got {size}"
    return None
