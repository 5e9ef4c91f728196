"""Record codec: the byte layout of one log record, its CRC and its SHA-256 hash chain.

The layout is specified in FORMAT.md; this module is the only code that knows it.
"""
from __future__ import annotations

import enum
import hashlib
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from commitlog.errors import CorruptRecordError, FormatVersionError

FORMAT_VERSION = 1
GENESIS_HASH = bytes(32)
_HEADER = struct.Struct(">BBI32s")  # version, kind, crc32, chain hash
HEADER_SIZE = _HEADER.size
_BODY_FIELDS = 5  # [lsn, kind, ts_ns, rid, payload]
META_CHECKPOINT = b"checkpoint_lsn"  # meta key -> LSN key of the newest CHECKPOINT

Payload = dict[str, Any]


class Kind(enum.IntEnum):
    SERVER_START = 1
    BEGIN = 2
    COMMIT = 3
    DISCARD = 4
    ABORT_REQUESTED = 5
    FINISH = 6
    RECOVERED = 7
    SERVER_STOP = 8
    CHECKPOINT = 9
    FORWARD = 10  # one launched forward: its mode and members in packed order (the schedule)


@dataclass(slots=True)
class Entry:
    """A record before it has an LSN: what transactions and the ledger produce."""

    kind: Kind
    rid: str | None
    payload: Payload


@dataclass(slots=True)
class Record:
    """A decoded, CRC-checked record. `body` is kept so the chain can be re-verified."""

    lsn: int
    kind: Kind
    ts_ns: int
    rid: str | None
    payload: Payload
    chain_hash: bytes
    body: bytes = field(repr=False)


@dataclass(slots=True)
class EncodedGroup:
    """One step's records, ready for one LMDB write transaction."""

    first_lsn: int
    last_lsn: int
    records: list[tuple[bytes, bytes]]
    index: list[tuple[bytes, bytes]]  # rid -> packed LSNs, once per finished request
    live_puts: list[tuple[bytes, bytes]] = field(default_factory=list)
    live_deletes: list[bytes] = field(default_factory=list)
    deletes: list[tuple[bytes, bytes | None]] = field(default_factory=list)  # (LSN key, rid)
    meta: list[tuple[bytes, bytes]] = field(default_factory=list)
    last_hash: bytes = b""  # the chain hash of `last_lsn`: once the group is durable, it is the chain head


def lsn_key(lsn: int) -> bytes:
    return lsn.to_bytes(8, "big")


def pack_lsns(lsns: list[int]) -> bytes:
    return struct.pack(f">{len(lsns)}Q", *lsns)


def unpack_lsns(packed: bytes | memoryview) -> list[int]:
    """An index value back to its LSNs; a length that is not a multiple of 8 is a damaged entry."""
    if len(packed) % 8:
        raise CorruptRecordError(f"index entry of {len(packed)} bytes is not a list of 8-byte LSNs (damaged)")
    return list(struct.unpack(f">{len(packed) // 8}Q", packed))


def key_lsn(key: bytes | memoryview) -> int:
    return int.from_bytes(key, "big")


def chain(prev_hash: bytes, body: bytes) -> bytes:
    return hashlib.sha256(prev_hash + body).digest()


def _crc(version: int, kind: int, chain_hash: bytes, body: bytes) -> int:
    return zlib.crc32(body, zlib.crc32(chain_hash, zlib.crc32(bytes((version, kind)))))


# The CRC's first two bytes (this format's version, the kind) are one of a few: their CRC is computed once.
_HEAD_CRC = {int(kind): zlib.crc32(bytes((FORMAT_VERSION, int(kind)))) for kind in Kind}


def encode_value(lsn: int, entry: Entry, ts_ns: int, prev_hash: bytes,
                 pack: Callable[[Any], bytes] = msgpack.packb) -> tuple[bytes, bytes]:
    """Return (value, chain_hash) for `entry` at `lsn`, chained after `prev_hash`. `pack`: a
    `msgpack.Packer().pack` the caller keeps (the same bytes as `packb`, without a Packer per call)."""
    kind = int(entry.kind)
    body = pack([lsn, kind, ts_ns, entry.rid, entry.payload])
    chain_hash = hashlib.sha256(prev_hash + body).digest()  # `chain`, inlined: once per record
    crc = zlib.crc32(body, zlib.crc32(chain_hash, _HEAD_CRC[kind]))
    return _HEADER.pack(FORMAT_VERSION, kind, crc, chain_hash) + body, chain_hash


def stray_key_message(key: bytes) -> str:
    """A key LMDB sorts among the LSNs but that names none: it is reported, never taken for an LSN."""
    return (f"records-table key {key.hex()} ({len(key)} bytes) is not an 8-byte LSN: inserted or damaged; "
            "salvage copies the log without it")


def decode_value(key: bytes, value: bytes) -> Record:
    """Decode and CRC-check one record; any defect raises CorruptRecordError naming the LSN."""
    if len(key) != 8:
        raise CorruptRecordError(stray_key_message(key))  # no LSN: its bytes name none
    lsn = key_lsn(key)
    kind, ts_ns, rid, payload, chain_hash, body = decode_fields(lsn, value)
    return Record(lsn, Kind(kind), ts_ns, rid, payload, chain_hash, body)


def decode_fields(lsn: int, value: bytes) -> tuple[int, int, str | None, Payload, bytes, bytes]:
    """`decode_value`'s checks without building a Record: (kind, ts_ns, rid, payload, chain hash, body).

    For whole-log scans, where a Record and a Kind per record cost as much as the checks.
    """
    if len(value) < HEADER_SIZE + 1:
        raise CorruptRecordError(f"value is {len(value)} bytes, shorter than a header", lsn)
    version, kind, crc, chain_hash = _HEADER.unpack_from(value)
    body = bytes(value[HEADER_SIZE:])
    if crc != _crc(version, kind, chain_hash, body):
        raise CorruptRecordError("CRC32 mismatch (bytes changed on disk or in transit)", lsn)
    if version != FORMAT_VERSION:
        raise FormatVersionError(f"record LSN {lsn} has format {version}; this code reads {FORMAT_VERSION}")
    fields = _unpack_body(body, lsn)
    if fields[0] != lsn or fields[1] != kind:
        raise CorruptRecordError(f"body says LSN {fields[0]} kind {fields[1]}; key/header disagree", lsn)
    return kind, fields[2], fields[3], fields[4], chain_hash, body


_KINDS = frozenset(int(k) for k in Kind)


def scan_value(lsn: int, value: bytes, prev_hash: bytes) -> tuple[int, int, str | None, Payload, bytes, bool]:
    """For whole-log scans: `decode_fields` plus the chain check against `prev_hash`, with less overhead.

    Returns (kind, ts_ns, rid, payload, chain hash, chained); payload arrays are tuples. The
    checks are decode_fields', which runs (and raises the precise error) when a fast check fails.
    """
    if len(value) <= HEADER_SIZE:
        return _scan_slow(lsn, value, prev_hash)
    version, kind, crc, chain_hash = _HEADER.unpack_from(value)
    body = value[HEADER_SIZE:]
    if crc != zlib.crc32(body, zlib.crc32(chain_hash, zlib.crc32(value[:2]))) or version != FORMAT_VERSION:
        return _scan_slow(lsn, value, prev_hash)
    chained = hashlib.sha256(prev_hash + body).digest() == chain_hash
    try:
        fields = msgpack.unpackb(body, use_list=False)
    except (ValueError, msgpack.UnpackException):
        return _scan_slow(lsn, value, prev_hash)
    if fields.__class__ is not tuple or len(fields) != _BODY_FIELDS:
        return _scan_slow(lsn, value, prev_hash)
    lsn_f, kind_f, ts_f, rid_f, payload_f = fields
    if (lsn_f != lsn or kind_f != kind or kind not in _KINDS or ts_f.__class__ is not int
            or payload_f.__class__ is not dict or not (rid_f is None or rid_f.__class__ is str)):
        return _scan_slow(lsn, value, prev_hash)
    return kind, ts_f, rid_f, payload_f, chain_hash, chained


def _scan_slow(lsn: int, value: bytes, prev_hash: bytes) -> tuple[int, int, str | None, Payload, bytes, bool]:
    kind, ts_ns, rid, payload, chain_hash, body = decode_fields(lsn, value)
    return kind, ts_ns, rid, payload, chain_hash, chain(prev_hash, body) == chain_hash


def _unpack_body(body: bytes, lsn: int) -> list[Any]:
    try:
        fields = msgpack.unpackb(body)
    except (ValueError, msgpack.UnpackException) as exc:
        raise CorruptRecordError(f"body is not valid msgpack ({exc})", lsn) from None
    if not (isinstance(fields, list) and len(fields) == _BODY_FIELDS):
        raise CorruptRecordError("body is not a 5-field array", lsn)
    lsn_f, kind_f, ts_f, rid_f, payload_f = fields
    ok = (
        isinstance(lsn_f, int) and isinstance(ts_f, int) and isinstance(payload_f, dict)
        and (rid_f is None or isinstance(rid_f, str)) and kind_f in Kind._value2member_map_
    )
    if not ok:
        raise CorruptRecordError("body fields have the wrong types", lsn)
    return fields


class Encoder:
    """Assigns LSNs and chains hashes on the caller's thread, so the writer thread only writes.

    It also remembers each running request's LSNs, so the per-request index costs one put
    per request (at FINISH) instead of one per record.
    """

    __slots__ = ("next_lsn", "prev_hash", "_request_lsns", "_pack")

    def __init__(self, next_lsn: int = 1, prev_hash: bytes = GENESIS_HASH,
                 request_lsns: dict[str, list[int]] | None = None) -> None:
        if next_lsn < 1:
            raise ValueError(f"next_lsn must be >= 1, got {next_lsn}")
        self.next_lsn = next_lsn
        self.prev_hash = prev_hash
        self._request_lsns = request_lsns or {}
        # One Packer for every record (autoreset: each call returns its own bytes). Groups are
        # encoded one at a time (the ledger's callers hold its lock), so it is never shared.
        self._pack = msgpack.Packer().pack

    def encode(self, entries: list[Entry], ts_ns: int | None = None) -> EncodedGroup:
        if not entries:
            raise ValueError("a group needs at least one entry")
        ts = time.time_ns() if ts_ns is None else ts_ns
        first = lsn = self.next_lsn
        prev = self.prev_hash
        records: list[tuple[bytes, bytes]] = []
        group = EncodedGroup(first, first + len(entries) - 1, records, [])
        for entry in entries:
            key = lsn_key(lsn)
            value, prev = encode_value(lsn, entry, ts, prev, self._pack)
            records.append((key, value))
            if entry.rid is not None:
                self._track(group, entry, lsn, key)
            elif entry.kind is Kind.CHECKPOINT:
                group.meta.append((META_CHECKPOINT, key))
            lsn += 1
        self.next_lsn, self.prev_hash = lsn, prev
        group.last_hash = prev
        return group

    def _track(self, group: EncodedGroup, entry: Entry, lsn: int, key: bytes) -> None:
        assert entry.rid is not None
        if entry.kind is Kind.BEGIN:
            self._request_lsns[entry.rid] = [lsn]
            group.live_puts.append((entry.rid.encode(), key))
            return
        lsns = self._request_lsns.setdefault(entry.rid, [])
        lsns.append(lsn)
        if entry.kind is Kind.FINISH:
            del self._request_lsns[entry.rid]
            group.live_deletes.append(entry.rid.encode())
            group.index.append((entry.rid.encode(), pack_lsns(lsns)))
