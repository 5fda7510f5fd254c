"""Build the C kernels of `kernels/cpu/` with the machine's compiler and load them with ctypes.

Each kernel is one C file, compiled at first use (`cc -O3 -march=native
-fopenmp`, about a second) into a cache keyed by the source, the flags, the
compiler (its path and version), the architecture and the CPU (its
/proc/cpuinfo identity on every platform, and what the compiler makes of
`-march=native` here), so native code is never loaded on a CPU it was not
built for. With `-fopenmp` the library needs libgomp.so.1, and the dynamic
loader hands it the copy torch has already loaded: the kernels' parallel loops
run on torch's own worker threads rather than on a second pool fighting them
for the cores.

Fallbacks, each said once in the log: a compiler without OpenMP still builds a
one-thread kernel; a compiler that refuses `-march=native` (older clang on
macOS or ARM) builds a portable one; a cached library that does not load (a
half-written or damaged file) is rebuilt; no compiler at all, or a failed
build, gives None, and the caller takes its torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger("roseinfer.kernels")

KERNELS_DIR = Path(__file__).parent  # the C sources sit beside this file
OPENMP = ("-fopenmp",)


def target_flags() -> tuple[str, ...]:
    """-march=native, or the class ROSEINFER_KERNEL_MARCH names (roseinfer.cpu_class sets it, e.g. x86-64-v3
    to build the AVX2 class's kernels on a wider CPU)."""
    return (f"-march={os.environ.get('ROSEINFER_KERNEL_MARCH') or 'native'}",)


def flag_sets() -> tuple[tuple[str, ...], ...]:
    """Tried in order: the fast build, then without OpenMP (clang without libomp still vectorizes the
    loops, on one thread), then both again without -march for compilers that refuse it."""
    return tuple(
        ("-O3", *arch, threads, "-shared", "-fPIC") for arch in (target_flags(), ()) for threads in (*OPENMP, "-fopenmp-simd")
    )
CPUINFO = Path("/proc/cpuinfo")
# The /proc/cpuinfo fields that say which CPU this is and what it can do: x86 ("model name",
# "flags"), ARM ("CPU implementer", "CPU part", "Features"), POWER ("cpu"), RISC-V ("isa", "uarch").
CPU_FIELDS = frozenset({
    "vendor_id", "cpu family", "model", "model name", "flags", "Features", "CPU implementer", "CPU architecture",
    "CPU variant", "CPU part", "CPU revision", "cpu", "isa", "uarch",
})


def kernel_cache_dir() -> Path:
    """ROSEINFER_KERNEL_CACHE, else $XDG_CACHE_HOME or ~/.cache under roseinfer/kernels, else the temp dir.

    The home directory is looked up only when needed: a container may have no HOME (and no
    passwd entry), and setting ROSEINFER_KERNEL_CACHE must be enough there.
    """
    if os.environ.get("ROSEINFER_KERNEL_CACHE"):
        return Path(os.environ["ROSEINFER_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):  # no HOME and no passwd entry for this user
            # One directory per user: a library loaded from a directory others can write is theirs to run.
            return Path(tempfile.gettempdir()) / f"roseinfer-kernels-{getattr(os, 'getuid', lambda: 0)()}"
    return Path(base) / "roseinfer" / "kernels"


def cpu_signature() -> str:
    """The architecture and the CPU's identity and features, from /proc/cpuinfo where there is one."""
    parts = [platform.machine(), platform.system()]
    try:
        for line in CPUINFO.read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() in CPU_FIELDS:
                parts.append(f"{name.strip()}: {value.strip()}")
    except OSError:  # macOS, Windows: what platform knows
        parts.append(platform.processor())
    return "\n".join(dict.fromkeys(parts))  # one line per distinct value, not one per core


@functools.cache
def native_target(compiler: str) -> str:
    """What `compiler -march=native` compiles for here (gcc's -m options, clang's target cpu and features).

    The compiler's own reading of the CPU is the exact key where /proc/cpuinfo is thin.
    """
    try:
        run = subprocess.run([compiler, "-###", "-march=native", "-x", "c", "-c", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    tokens = (run.stderr + run.stdout).replace('"', " ").split()
    kept = [t for i, t in enumerate(tokens)
            if t.startswith(("-m", "+")) or (i and tokens[i - 1] in ("-target-cpu", "-target-feature"))]
    return " ".join(kept)


def source_texts(source: Path) -> list[str]:
    """The source and the local headers it includes (`#include "name.h"`, beside it): what the library is built from."""
    text = source.read_text()
    headers = re.findall(r'^#include "([^"]+)"', text, flags=re.MULTILINE)
    return [text, *((source.parent / name).read_text() for name in headers)]


def cache_path(source: Path, compiler: str, version: str, flags: tuple[str, ...]) -> Path:
    """Where the library built from `source` with `flags` by this compiler on this CPU is cached."""
    identity = [*source_texts(source), " ".join(flags), compiler, version, cpu_signature(), native_target(compiler)]
    key = hashlib.sha256("\0".join(identity).encode()).hexdigest()[:16]
    return kernel_cache_dir() / f"{source.stem}-{key}.so"


def _compile(source: Path, compiler: str, flags: tuple[str, ...], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        built = Path(tmp) / path.name
        subprocess.run([compiler, *flags, "-o", str(built), str(source), "-lm"],
                       check=True, capture_output=True, text=True, timeout=120)
        os.replace(built, path)  # atomic: a concurrent builder finds a whole file or none


def _load(source: Path, compiler: str, version: str, flags: tuple[str, ...]) -> ctypes.CDLL:
    """The library built with `flags`, from the cache when this exact build was made before.

    A cached file that does not load (cut short by a full disk or a killed build, or damaged since)
    is built again once, rather than taken for a sign that these flags do not work here.
    """
    path = cache_path(source, compiler, version, flags)
    if path.exists():
        try:
            return ctypes.CDLL(str(path))
        except OSError as exc:
            logger.warning("roseinfer: the cached kernel %s does not load (%s); building it again", path, exc)
            path.unlink(missing_ok=True)
    _compile(source, compiler, flags, path)
    return ctypes.CDLL(str(path))


def _compiler() -> tuple[str, str] | str:
    """(compiler, its --version text), or why there is none to use."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return "no C compiler found"
    try:
        return compiler, subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the C compiler {compiler} does not run ({exc})"


def load_kernel_library(source: Path, what: str, fallback: str) -> ctypes.CDLL | None:
    """The compiled library of `source`, building it if needed; None (and one log line) if it cannot be.

    `what` names the kernel and `fallback` the path taken without it, for the log.
    """
    found = _compiler()
    if isinstance(found, str):
        logger.warning("roseinfer: %s; %s takes %s", found, what, fallback)
        return None
    compiler, version = found
    errors = []
    for flags in flag_sets():
        try:
            lib = _load(source, compiler, version, flags)
            break
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append(str(getattr(exc, "stderr", "") or exc).strip())
    else:
        logger.warning("roseinfer: the %s kernel did not build (%s); %s", what, errors, fallback)
        return None
    if target_flags()[0] not in flags:
        logger.warning("roseinfer: %s refuses %s; the %s is built for any CPU of this "
                       "architecture (slower)", compiler, target_flags()[0], what)
    if OPENMP[0] not in flags:
        logger.warning("roseinfer: no OpenMP in %s; the %s runs on one thread", compiler, what)
    return lib
