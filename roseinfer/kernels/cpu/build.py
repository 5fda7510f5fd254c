"""Build the C kernels of `kernels/cpu/` with the machine's compiler and load them with ctypes.

Each kernel is one C file, compiled at first use (`cc -O3 -march=native
-fopenmp`, about a second) into a cache keyed by the source, the flags, the
compiler and the CPU, so `-march=native` code is never loaded on a CPU it was
not built for. With `-fopenmp` the library needs libgomp.so.1, and the dynamic
loader hands it the copy torch has already loaded: the kernels' parallel loops
run on torch's own worker threads rather than on a second pool fighting them
for the cores. A compiler without OpenMP still builds a one-thread kernel;
no compiler at all, or a failed build, gives None and one log line, and the
caller takes its torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger("roseinfer.kernels")

KERNELS_DIR = Path(__file__).parent  # the C sources sit beside this file
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
# A compiler without OpenMP (clang without libomp) still vectorizes the loops; the kernel then runs
# on one thread.
SINGLE_THREAD_FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-shared", "-fPIC")


def kernel_cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "roseinfer" / "kernels"
    return Path(os.environ.get("ROSEINFER_KERNEL_CACHE", default))


def _cpu_signature() -> str:
    """What -march=native compiles for: the CPU's model and feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
        return "\n".join(dict.fromkeys(lines))
    except OSError:
        return platform.processor() or platform.machine()


def _build(source: Path, compiler: str, version: str, flags: tuple[str, ...]) -> Path:
    """The library built from `source` with `flags`, from the cache when this exact build was made before."""
    key = hashlib.sha256("\0".join([source.read_text(), " ".join(flags), version, _cpu_signature()]).encode())
    path = kernel_cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            built = Path(tmp) / path.name
            subprocess.run(
                [compiler, *flags, "-o", str(built), str(source), "-lm"],
                check=True,
                capture_output=True,
                text=True,
                timeout=120,
            )
            os.replace(built, path)  # atomic: a concurrent builder finds a whole file or none
    return path


def load_kernel_library(source: Path, what: str, fallback: str) -> ctypes.CDLL | None:
    """The compiled library of `source`, building it if needed; None (and one log line) if it cannot be.

    `what` names the kernel and `fallback` the path taken without it, for the log.
    """
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        logger.warning("roseinfer: no C compiler found; %s takes %s", what, fallback)
        return None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("roseinfer: the C compiler %s does not run (%s); %s takes %s", compiler, exc, what, fallback)
        return None
    errors = []
    for flags in (FLAGS, SINGLE_THREAD_FLAGS):
        try:
            lib = ctypes.CDLL(str(_build(source, compiler, version, flags)))
            break
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append(str(getattr(exc, "stderr", "") or exc).strip())
    else:
        logger.warning("roseinfer: the %s kernel did not build (%s); %s", what, errors, fallback)
        return None
    if flags is not FLAGS:
        logger.warning("roseinfer: no OpenMP in %s; the %s runs on one thread", compiler, what)
    return lib
