"""The KV pool's host memory: a fork (the log's reader child) must not leave its pages copy-on-write, or
every first K/V write after it traps once per page in the forward."""
from __future__ import annotations

import os
import resource

import torch

from server.host_memory import unforked_zeros
from server.memory import TokenToKVPool

PAGE = os.sysconf("SC_PAGE_SIZE")


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _fork_a_child_that_exits() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def test_kv_pool_writes_take_no_page_faults_after_the_process_forked():
    pool = TokenToKVPool(16_384, 2, 2, 32, torch.float32)  # 4 MB a buffer
    buffers = pool.k_buffers + pool.v_buffers
    pages = sum(b.nbytes for b in buffers) // PAGE
    _fork_a_child_that_exits()
    before = _minor_faults()
    for b in buffers:
        b.fill_(1.0)
    # torch.zeros here took one fault a page (~4,100): the fork had marked them all copy-on-write.
    assert _minor_faults() - before < pages // 20


def test_unforked_zeros_is_a_zeroed_writable_tensor_that_outlives_its_name():
    t = unforked_zeros((5, 3, 8), torch.bfloat16)
    assert t.shape == (5, 3, 8) and t.dtype == torch.bfloat16 and t.device.type == "cpu"
    assert torch.count_nonzero(t) == 0
    t[2, 1] = 3.0
    assert float(t.float().sum()) == 24.0
