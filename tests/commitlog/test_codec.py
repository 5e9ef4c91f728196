"""Record codec: every byte of a value is covered by the CRC; LSN binds value to key; chain links."""
from __future__ import annotations

import pytest

from commitlog import CorruptRecordError, Encoder, Entry, Kind
from commitlog.codec import GENESIS_HASH, HEADER_SIZE, chain, decode_value, lsn_key


def _group() -> list[tuple[bytes, bytes]]:
    enc = Encoder()
    entries = [Entry(Kind.BEGIN, "r", {"prompt": [1, 2], "params": {}, "grammar": None, "arrival": 0}),
               Entry(Kind.COMMIT, "r", {"ids": [3], "lp": [-0.25]}),
               Entry(Kind.SERVER_STOP, None, {})]
    return enc.encode(entries, ts_ns=123).records


def test_record_roundtrip_keeps_lsn_kind_rid_payload_and_time() -> None:
    records = [decode_value(k, v) for k, v in _group()]
    assert [(r.lsn, r.kind, r.rid, r.ts_ns) for r in records] == [
        (1, Kind.BEGIN, "r", 123), (2, Kind.COMMIT, "r", 123), (3, Kind.SERVER_STOP, None, 123)]
    assert records[1].payload == {"ids": [3], "lp": [-0.25]}


def test_every_single_byte_flip_in_a_value_is_reported_with_its_lsn() -> None:
    key, value = _group()[1]
    for i in range(len(value)):
        for mask in (0x01, 0x80):
            bad = bytearray(value)
            bad[i] ^= mask
            with pytest.raises(CorruptRecordError) as info:
                decode_value(key, bytes(bad))
            assert info.value.lsn == 2 and "LSN 2" in str(info.value)


def test_truncated_value_is_reported_with_its_lsn() -> None:
    key, value = _group()[0]
    for cut in (0, 5, HEADER_SIZE, len(value) - 1):
        with pytest.raises(CorruptRecordError) as info:
            decode_value(key, value[:cut])
        assert info.value.lsn == 1


def test_value_moved_under_another_key_is_rejected() -> None:
    (_, first), (second_key, _), _ = _group()
    with pytest.raises(CorruptRecordError, match="disagree"):
        decode_value(second_key, first)


def test_hash_chain_links_each_record_to_its_predecessor() -> None:
    records = [decode_value(k, v) for k, v in _group()]
    prev = GENESIS_HASH
    for record in records:
        assert record.chain_hash == chain(prev, record.body)
        prev = record.chain_hash


def test_encoder_continues_lsns_and_chain_across_groups() -> None:
    enc = Encoder()
    g1 = enc.encode([Entry(Kind.SERVER_START, None, {})])
    g2 = enc.encode([Entry(Kind.SERVER_STOP, None, {})])
    assert (g1.first_lsn, g2.first_lsn, g2.records[0][0]) == (1, 2, lsn_key(2))
    r1, r2 = decode_value(*g1.records[0]), decode_value(*g2.records[0])
    assert r2.chain_hash == chain(r1.chain_hash, r2.body)


def test_encoder_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        Encoder().encode([])
    with pytest.raises(ValueError):
        Encoder(next_lsn=0)
