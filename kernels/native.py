"""Builds a C kernel from `kernels/csrc` with the system compiler once, caches the shared library
and loads it with ctypes.

No torch headers and no extension machinery: the kernels take raw pointers, so a build is one
`cc` call of well under a second. The library is cached under a name that hashes the source, the
flags, the compiler and the CPU (it is built with -march=native), and is written atomically, so
processes that start together neither rebuild it twice nor load a half-written file.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import platformdirs

SOURCE_DIR = Path(__file__).with_name("csrc")
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fPIC", "-shared", "-pthread", "-std=c11")
# For a kernel that runs its loop on several threads: it then shares the process's OpenMP runtime. torch
# loads its libgomp first, and the loader gives a later library asking for the same soname that copy, so
# the kernel's team is the compiled graph's own warm threads rather than threads created per call.
OPENMP_FLAGS = ("-fopenmp",)
LIBGOMP_SONAME = "libgomp.so.1"
BUILD_TIMEOUT_S = 120


class NativeBuildError(RuntimeError):
    """No compiler, or it refused the source: the caller falls back to a portable backend."""


def cache_dir() -> Path:
    return Path(os.environ.get("TOKENLEDGER_KERNEL_CACHE") or platformdirs.user_cache_dir("tokenledger")) / "kernels"


def load(source_name: str, openmp: bool = False, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The shared library built from `csrc/<source_name>`, building it on first use. `openmp`: built with
    OpenMP where the compiler has it and the process runs a libgomp, else without (the source then keeps a
    pthread fallback). `extra_flags` follow the usual ones (`-mno-avx512f`: the build a CPU without
    AVX-512 gets, on this one)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise NativeBuildError("no C compiler (cc or gcc) on PATH")
    # Only where the process already runs a libgomp under that soname: otherwise (a torch on another
    # OpenMP runtime, or none) the build would load a second runtime whose workers compete with the first.
    if openmp and process_libgomp() is not None:
        try:
            return _load(compiler, source_name, (*FLAGS, *OPENMP_FLAGS, *extra_flags))
        except NativeBuildError:
            pass  # no OpenMP runtime to link here
    return _load(compiler, source_name, (*FLAGS, *extra_flags))


def build_id(library: ctypes.CDLL) -> str:
    """Which build a loaded library is: its cached file's name, `<source stem>-<key>`, the key hashing the
    source, the compiler, the flags and the CPU (`_build_key`). Two runs that print the same id ran the same
    machine code; SERVER_START records it (`engine.kernels`) for re-execution to compare."""
    return Path(library._name).stem


def process_libgomp() -> ctypes.CDLL | None:
    """The libgomp this process already runs (torch's), never a copy loaded here; None where there is none."""
    try:
        return ctypes.CDLL(LIBGOMP_SONAME, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None


def _load(compiler: str, source_name: str, flags: tuple[str, ...]) -> ctypes.CDLL:
    source = (SOURCE_DIR / source_name).read_bytes()
    library = cache_dir() / f"{Path(source_name).stem}-{_build_key(source, compiler, flags)}.so"
    if not library.exists():
        _build(compiler, flags, SOURCE_DIR / source_name, library)
    return ctypes.CDLL(str(library))


def _build_key(source: bytes, compiler: str, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256(source)
    digest.update(" ".join((compiler, *flags, platform.machine(), _cpu_flags())).encode())
    return digest.hexdigest()[:16]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _build(compiler: str, flags: tuple[str, ...], source: Path, library: Path) -> None:
    library.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=library.name, suffix=".part", dir=library.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *flags, str(source), "-o", partial, "-lm"], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise NativeBuildError(f"{compiler} could not build {source.name}: {done.stderr.strip()[-2000:]}")
        os.replace(partial, library)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NativeBuildError(f"{compiler} could not build {source.name}: {exc}") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
