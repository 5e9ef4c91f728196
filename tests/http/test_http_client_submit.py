"""`SchedulerClient.submit` makes a rid live only once its message exists: a request whose
message cannot be packed leaves nothing behind that would answer 409 to the next use of its rid."""
from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from server.config import ServerArgs
from server.http.client import SchedulerClient
from server.messages import ReadyMsg
from server.request import LogprobRequest, RequestSpec
from server.sampling.params import SamplingParams


def test_a_request_whose_message_cannot_be_packed_leaves_no_live_rid(tmp_path: Path) -> None:
    async def run() -> None:
        client = SchedulerClient(ServerArgs(model_path=str(tmp_path)), tmp_path / "log")
        try:
            client.ready = ReadyMsg.__new__(ReadyMsg)  # healthy, without spawning a scheduler
            # Built without validate(): an int beyond 64 bits that no message can carry.
            spec = RequestSpec("unpackable", [5, 6], SamplingParams(temperature=2**70), LogprobRequest())
            with pytest.raises((OverflowError, TypeError, ValueError)):
                client.submit(spec)
            assert not client.is_live("unpackable")
        finally:
            client._ctx.destroy(linger=0)
            shutil.rmtree(client._ipc_dir, ignore_errors=True)

    asyncio.run(run())
