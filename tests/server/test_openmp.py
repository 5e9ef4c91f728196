"""`release_thread_pool` ends the calling thread's OpenMP workers, in the libgomp torch already runs."""
from __future__ import annotations

import subprocess
import sys

import pytest

# In a process of its own: it sets torch's thread count and counts the process's threads.
_PROGRAM = """
import os, torch
from server.openmp import release_thread_pool, _libgomp
if _libgomp() is None:
    print("no-libgomp"); raise SystemExit(0)
threads = lambda: len(os.listdir("/proc/self/task"))
torch.set_num_threads(2)
before = threads()
a = torch.randn(1024, 1024)
a @ a  # a parallel region on this thread: its pool gains a worker
with_pool = threads()
released = release_thread_pool()
after = threads()
a @ a  # a later region starts a worker again
print(before, with_pool, released, after, threads())
"""


def test_releasing_the_pool_ends_this_threads_openmp_workers_and_a_later_region_starts_new_ones():
    out = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=120, check=True)
    words = out.stdout.split()
    if words == ["no-libgomp"]:
        pytest.skip("this torch runs no libgomp: nothing to release")
    before, with_pool, released, after, again = words
    assert int(with_pool) > int(before), out.stdout  # the region's worker exists
    assert released == "True"
    assert int(after) == int(with_pool) - 1, out.stdout  # ... and is gone
    assert int(again) == int(with_pool), out.stdout

