"""The chain head: (LSN, stored chain hash) of one durable record, as published and as
`tokenledger verify --expect-head LSN:HASH` takes it back (FORMAT.md, "Publishing the head")."""
from __future__ import annotations

from dataclasses import dataclass

from commitlog.errors import CorruptRecordError
from commitlog.reader import LogReader


@dataclass(frozen=True, slots=True)
class ChainHead:
    lsn: int
    chain_hash: bytes

    @property
    def text(self) -> str:
        """The `LSN:HASH` form `verify --expect-head` parses."""
        return f"{self.lsn}:{self.chain_hash.hex()}"

    def to_dict(self) -> dict[str, int | str]:
        return {"lsn": self.lsn, "hash": self.chain_hash.hex(), "expect_head": self.text}


def read_head(reader: LogReader, durable_lsn: int | None = None) -> ChainHead | None:
    """The head of the last record at or below `durable_lsn` (None: the last record), read from the log.

    A reader in another process sees records the writer has committed but (with durability
    `periodic` or `none`) not yet synced; capping at the writer's reported durable LSN keeps a
    published head from naming a record a power cut could still take back. None for an empty log."""
    last = reader.last_lsn()
    lsn = last if durable_lsn is None else min(last, durable_lsn)
    if lsn <= 0:
        return None
    # Decoding checks its CRC (a damaged record raises CorruptRecordError): the hash given is the one stored.
    record = next((r for r in reader.records(lsn, lsn) if r.lsn == lsn), None)
    if record is None:
        raise CorruptRecordError("the record the chain head would name is missing", lsn)
    return ChainHead(record.lsn, record.chain_hash)
