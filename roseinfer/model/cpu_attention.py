"""The CPU's paged attention: a fused decode kernel that reads the block table, over the torch reference.

A decode step (one new token a sequence) goes to `cpu_kernels/paged_decode.c`,
which reads each cached key and value once, in place; the torch reference
would first gather every sequence's context into a new tensor and then read
that copy (three passes over the context instead of one). Prefills and mixed
steps keep the reference path, whose cost is dominated by the projections.

The kernel is plain C, compiled at first use with the machine's C compiler
(`cc -O3 -march=native`, about a second) into a cache keyed by the source,
the flags, the compiler and the CPU, and loaded with ctypes. Where no compiler
is found or the build fails, the backend says so once in the log and every
step takes the reference path: slower, never wrong.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from roseinfer.model.attention import AttentionMetadata, TorchPagedAttention, write_kv

logger = logging.getLogger("roseinfer.model")

SOURCE = Path(__file__).with_name("cpu_kernels") / "paged_decode.c"
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-shared", "-fPIC")
KERNELS = {torch.float32: "paged_decode_f32", torch.bfloat16: "paged_decode_bf16"}
SPLIT_ABOVE_ROW_TOKENS = 12 * 2048  # (rows x context) below which one thread does the whole step


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


@functools.cache
def load_paged_decode_kernel() -> ctypes.CDLL | None:
    """The compiled kernel library, building it if needed; None (and one log line) if it cannot be."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        logger.warning("roseinfer: no C compiler found; CPU decode attention takes the torch path")
        return None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        key = hashlib.sha256(
            "\0".join([SOURCE.read_text(), " ".join(FLAGS), version, _cpu_signature()]).encode()
        ).hexdigest()[:16]
        path = kernel_cache_dir() / f"paged_decode-{key}.so"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                built = Path(tmp) / path.name
                subprocess.run(
                    [compiler, *FLAGS, "-o", str(built), str(SOURCE), "-lm"],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                os.replace(built, path)  # atomic: a concurrent builder finds a whole file or none
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        logger.warning("roseinfer: the CPU decode attention kernel did not build (%s); torch path", detail)
        return None
    for name in KERNELS.values():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 6 + [ctypes.c_float]
    return lib


class CpuPagedAttention(TorchPagedAttention):
    """The torch reference, with decode steps through the fused C kernel (split across threads)."""

    name = "cpu"

    def __init__(self, num_threads: int | None = None) -> None:
        self.kernel = load_paged_decode_kernel()
        self.num_threads = num_threads or torch.get_num_threads()
        self._pool = ThreadPoolExecutor(self.num_threads - 1) if self.num_threads > 1 else None

    @property
    def fused(self) -> bool:
        return self.kernel is not None

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,  # [num_blocks, block_size, H, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        fits = query.device.type == "cpu" and query.dtype in KERNELS and k_cache.is_contiguous()
        if self.kernel is None or not meta.is_decode_only or not fits:
            return super().forward(query, key, value, k_cache, v_cache, meta, scale)
        write_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        return self.decode(query, k_cache, v_cache, meta, scale)

    def decode(
        self,
        query: torch.Tensor,  # [B, H, D]: one token a sequence, its K/V already in the cache
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """The fused kernel alone: attention of each sequence's one query over its cached context."""
        query = query.contiguous()
        out = torch.empty_like(query)
        num_seqs, heads, head_dim = query.shape
        # The kernel reads int32 (the graph path's int64 tables never come here, but be exact).
        tables = meta.block_tables.to(torch.int32).contiguous()
        lens = meta.context_lens.to(torch.int32).contiguous()
        kernel = getattr(self.kernel, KERNELS[query.dtype])
        fixed = (heads, head_dim, k_cache.shape[1], tables.shape[1], scale)
        pointers = [t.data_ptr() for t in (query, k_cache, v_cache, tables, lens, out)]

        def rows(begin: int, end: int) -> int:
            return kernel(*pointers, begin, end, *fixed)

        total = num_seqs * heads
        # Handing rows to another thread costs tens of microseconds: worth it only for real work.
        work = num_seqs * meta.max_context_len * heads
        threads = self.num_threads if work >= SPLIT_ABOVE_ROW_TOKENS else 1
        bounds = [total * i // threads for i in range(threads + 1)]
        chunks = [(b, e) for b, e in itertools.pairwise(bounds) if e > b]
        pending = [self._pool.submit(rows, b, e) for b, e in chunks[1:]] if self._pool else []
        status = [rows(*chunks[0])] + [f.result() for f in pending]
        if any(status):
            raise ValueError(
                f"head_dim {head_dim} or block size {k_cache.shape[1]} is over the kernel's limit"
            )
        return out
