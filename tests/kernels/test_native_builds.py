"""A native kernel's build id names exactly the machine code that ran: other flags make another build,
the same source, compiler, flags and CPU the same one (what SERVER_START's `engine.kernels` compares)."""
from __future__ import annotations

import pytest

from kernels import cpu_attention
from kernels.builds import current_builds, engine_builds
from kernels.native import build_id

pytestmark = pytest.mark.skipif(not cpu_attention.kernel_available(), reason="no C compiler here")


def test_a_kernel_built_with_other_flags_has_another_build_id_and_the_same_build_the_same():
    default = cpu_attention.kernel_build()
    assert default is not None and default.startswith("paged_attention-")
    assert build_id(cpu_attention._library()) == default  # loaded again: the same cached build
    assert build_id(cpu_attention._library(("-mno-avx512f",))) != default


def test_an_engine_records_the_attention_kernel_only_where_it_runs_it():
    on_cpu = engine_builds("cpu", "cpu")
    assert set(on_cpu) == {"paged_attention.c", "gather_rows.c"}
    assert set(engine_builds("torch", "cpu")) == {"gather_rows.c"}  # torch's attention, the C batch gather
    assert engine_builds("flashinfer", "cuda") == {}  # device kernels: `software` names them
    assert current_builds(["paged_attention.c", "no_such_kernel.c"]) == {"paged_attention.c": on_cpu["paged_attention.c"]}
