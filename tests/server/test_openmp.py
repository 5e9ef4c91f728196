"""`release_thread_pool` ends the calling thread's OpenMP workers, in the libgomp torch already runs; `import
server` sets the workers' spin count before torch loads that libgomp, and never over the user's choice."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from server.openmp import DEFAULT_SPIN_COUNT, without_spin_default

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


def _spin_after(imports: str, **env: str) -> list[str]:
    """In a fresh process with `env` added (the wait variables removed first): the spin count in its
    environment after `imports`, and what `import server` reported."""
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    program = f"{imports}\nimport os, server\nprint(os.environ.get('GOMP_SPINCOUNT'), server.SPIN_COUNT_SET_HERE)"
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True,
                         env={**base, **env})
    return out.stdout.split()


def test_import_server_sets_the_spin_count_before_torch_loads_libgomp():
    assert _spin_after("import sys; assert 'torch' not in sys.modules") == [DEFAULT_SPIN_COUNT, "True"]


def test_a_spin_count_or_wait_policy_the_user_set_is_kept():
    assert _spin_after("", GOMP_SPINCOUNT="123") == ["123", "False"]
    assert _spin_after("", OMP_WAIT_POLICY="passive") == ["None", "False"]


def test_once_libgomp_is_loaded_the_spin_count_is_left_alone_since_it_was_read_already():
    words = _spin_after("import torch; from kernels.native import process_libgomp; "
                        "print('loaded' if process_libgomp() else 'none')")
    if words[0] == "none":
        pytest.skip("this torch runs no libgomp")
    assert words[1:] == ["None", "False"]


def test_a_peer_under_comparison_gets_the_environment_without_our_spin_count():
    env = {"GOMP_SPINCOUNT": DEFAULT_SPIN_COUNT, "PATH": "/bin"}
    assert without_spin_default(env, set_here=True) == {"PATH": "/bin"}
    assert without_spin_default(env, set_here=False) == env  # the user's own: the peer gets it too
