"""Leave the cores' OpenMP workers to the one thread that runs the engine's steps.

torch runs its parallel CPU operators on OpenMP, and OpenMP (libgomp, the
runtime torch ships on Linux) keeps a separate pool of worker threads for
each thread that starts parallel work. Loading and warming an engine in the
main thread gives the main thread a pool; the manager's worker thread, which
runs every step, then gets a second one. With more pool threads than cores,
libgomp stops letting idle workers spin between parallel regions (its
"throttled" spin count): each of the ~300 operators of a decode step then
waits for its workers to wake up from sleep. On a 2-core CPU that made a gpt2
decode step at batch 16 about a fifth slower in the worker thread than the
same step in the main thread (`python benchmarks/benchmark_worker_thread.py`).

`release_openmp_workers()` frees the calling thread's pool with OpenMP 5's
`omp_pause_resource_all`; the next parallel operator that thread runs starts
a new pool. Managers call it from the thread that creates them, before their
worker starts, so that the worker's pool is the only one while they serve.

The libgomp paused is the one torch's own library links, by the name it
records (a wheel may ship `libgomp-<hash>.so.1` while a system libgomp.so.1 is
loaded too); where torch links no libgomp, none is paused, and the log says so.
"""

from __future__ import annotations

import ctypes
import logging
import os
import struct

logger = logging.getLogger("roseinfer.engine")

OMP_PAUSE_HARD = 2  # omp_pause_resource_t: free the threads, not just park them
PT_LOAD, PT_DYNAMIC, DT_NEEDED, DT_STRTAB = 1, 2, 1, 5


def elf_needed(path: str) -> list[str]:
    """The DT_NEEDED names of a 64-bit little-endian ELF shared library (the libraries it links), [] if unreadable.

    Only the headers and the dynamic string table are read, not the (for torch, 500 MB) file.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4:6] != b"\x02\x01":
                return []
            phoff, = struct.unpack_from("<Q", head, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            segments = [struct.unpack_from("<IIQQQQ", table, i * phentsize) for i in range(phnum)]
            loads = [(vaddr, offset, size) for kind, _, offset, vaddr, _, size in segments if kind == PT_LOAD]
            dynamic = next(((offset, size) for kind, _, offset, _, _, size in segments if kind == PT_DYNAMIC), None)
            if dynamic is None:
                return []
            f.seek(dynamic[0])
            raw = f.read(dynamic[1])
            entries = [struct.unpack_from("<qQ", raw, i) for i in range(0, len(raw) - 15, 16)]
            strtab = next(value for tag, value in entries if tag == DT_STRTAB)
            base = next(offset + strtab - vaddr for vaddr, offset, size in loads if vaddr <= strtab < vaddr + size)
            names = []
            for tag, value in entries:
                if tag == DT_NEEDED:
                    f.seek(base + value)
                    names.append(f.read(256).split(b"\0", 1)[0].decode())
            return names
    except (OSError, struct.error, StopIteration, UnicodeDecodeError):
        return []


def _mapped_paths() -> list[str]:
    """Every file this process has mapped, in the order of /proc/self/maps ([] where it cannot tell)."""
    try:
        with open("/proc/self/maps") as maps:
            return list(dict.fromkeys(line.split(maxsplit=5)[-1].strip() for line in maps))
    except OSError:
        return []


def torch_cpu_library() -> str | None:
    """The path of torch's CPU library as this process mapped it, None if it is not found.

    The copy in the imported torch package's lib/ folder comes first: another file of that
    name may be mapped too (a test's stand-in, a second install).
    """
    import torch

    own = os.path.join(os.path.dirname(os.path.realpath(torch.__file__)), "lib")
    found = [p for p in _mapped_paths() if os.path.basename(p).startswith("libtorch_cpu.")]
    return next((p for p in found if os.path.dirname(os.path.realpath(p)) == own), found[0] if found else None)


def _loaded_copy(name: str, torch_library: str | None) -> str:
    """The mapped file torch's `name` resolved to: its own folder's copy (or its wheel's torch.libs)
    when one is mapped, else the first mapped file of that name, else the name.

    A system libgomp.so.1 loaded by a C kernel has the same soname as torch's own copy, and
    dlopen by soname may hand back either; the path says which.
    """
    mapped = [p for p in _mapped_paths() if os.path.basename(p) == name]
    if torch_library is not None:
        torch_dir = os.path.dirname(torch_library)
        wheel_libs = os.path.join(os.path.dirname(os.path.dirname(torch_dir)), "torch.libs")
        own = [p for p in mapped if os.path.dirname(p) in (torch_dir, wheel_libs)]
        mapped = own + mapped
    return mapped[0] if mapped else name


def torch_openmp_runtime(torch_library: str | None) -> str | None:
    """The libgomp torch's library links, by the name it links it under, None where it links none.

    Wheels may ship a renamed copy (`torch.libs/libgomp-<hash>.so.1`) beside a system libgomp.so.1
    that another library (a C kernel built with -fopenmp) loaded: only torch's copy holds the
    pools of torch's threads, so the name comes from torch's own library, not the first mapping.
    """
    if torch_library is None:
        return None
    return next((name for name in elf_needed(torch_library) if name.startswith("libgomp")), None)


def release_openmp_workers(torch_library: str | None = None) -> bool:
    """Free the calling thread's OpenMP worker pool; False where the runtime cannot (nothing changes).

    `torch_library` (default: the libtorch_cpu this process mapped) says whose libgomp that is.
    """
    torch_library = torch_library or torch_cpu_library()
    name = torch_openmp_runtime(torch_library)
    if name is None:
        logger.info("roseinfer: torch's OpenMP runtime is not a libgomp found here; no worker pool freed")
        return False
    try:
        # RTLD_NOLOAD: the copy already loaded under that name, pools and all, never a fresh one
        # (pausing a fresh copy would free nothing).
        runtime = ctypes.CDLL(_loaded_copy(name, torch_library), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        pause = runtime.omp_pause_resource_all
    except (OSError, AttributeError):  # not loaded after all, or a libgomp older than OpenMP 5
        logger.info("roseinfer: %s cannot pause its workers; no worker pool freed", name)
        return False
    pause.argtypes = [ctypes.c_int]
    pause.restype = ctypes.c_int
    released = pause(OMP_PAUSE_HARD) == 0  # nonzero inside a parallel region: nothing was freed
    if not released:
        logger.debug("omp_pause_resource_all refused; the calling thread keeps its OpenMP workers")
    return released
