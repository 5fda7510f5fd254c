"""The CPU's paged attention: a fused decode kernel that reads the block table, over the torch reference.

A decode step (one new token a sequence) goes to `cpu_kernels/paged_decode.c`,
which reads each cached key and value once, in place; the torch reference
would first gather every sequence's context into a new tensor and then read
that copy (three passes over the context instead of one). Prefills and mixed
steps keep the reference path, whose cost is dominated by the projections.

The kernel is plain C, compiled at first use with the machine's C compiler
(`cc -O3 -march=native -fopenmp`, about a second) into a cache keyed by the
source, the flags, the compiler and the CPU, and loaded with ctypes. Its
OpenMP loop runs on torch's own worker threads (the library resolves
libgomp.so.1 to the copy torch has loaded), which are still spinning from the
projection before it: a pool of our own would fight them for the cores. A
step big enough to be worth it is cut by sequences, or at batch 1 by heads.
Where no compiler is found or the build fails, the backend says so once in
the log and every step takes the reference path: slower, never wrong; a
compiler without OpenMP gives a one-thread kernel.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from roseinfer.model.attention import AttentionMetadata, TorchPagedAttention

logger = logging.getLogger("roseinfer.model")

SOURCE = Path(__file__).with_name("cpu_kernels") / "paged_decode.c"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
# A compiler without OpenMP (clang without libomp) still vectorizes the loops; the step then runs
# on one thread.
SINGLE_THREAD_FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-shared", "-fPIC")
KERNELS = {torch.float32: "paged_decode_f32", torch.bfloat16: "paged_decode_bf16"}
SPLIT_ABOVE_ROW_TOKENS = 4096  # (sequences x context x heads) below which one thread does the whole step


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


def _build(compiler: str, version: str, flags: tuple[str, ...]) -> Path:
    """The kernel library built with `flags`, from the cache when this exact build was made before."""
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(flags), version, _cpu_signature()]).encode())
    path = kernel_cache_dir() / f"paged_decode-{key.hexdigest()[:16]}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            built = Path(tmp) / path.name
            subprocess.run(
                [compiler, *flags, "-o", str(built), str(SOURCE), "-lm"],
                check=True,
                capture_output=True,
                text=True,
                timeout=120,
            )
            os.replace(built, path)  # atomic: a concurrent builder finds a whole file or none
    return path


@functools.cache
def load_paged_decode_kernel() -> ctypes.CDLL | None:
    """The compiled kernel library, building it if needed; None (and one log line) if it cannot be."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        logger.warning("roseinfer: no C compiler found; CPU decode attention takes the torch path")
        return None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("roseinfer: the C compiler %s does not run (%s); torch path", compiler, exc)
        return None
    errors = []
    for flags in (FLAGS, SINGLE_THREAD_FLAGS):
        try:
            lib = ctypes.CDLL(str(_build(compiler, version, flags)))
            break
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append(str(getattr(exc, "stderr", "") or exc).strip())
    else:
        logger.warning("roseinfer: the CPU decode attention kernel did not build (%s); torch path", errors)
        return None
    if flags is not FLAGS:
        logger.warning("roseinfer: no OpenMP in %s; the CPU decode attention runs on one thread", compiler)
    for name in KERNELS.values():
        fn = getattr(lib, name)
        fn.restype = ctypes.c_int
        fn.argtypes = (
            [ctypes.c_void_p] * 4  # q, new k, new v, slots
            + [ctypes.c_int64] * 2  # their token stride, cache slots
            + [ctypes.c_void_p] * 5  # k cache, v cache, block tables, context lens, out
            + [ctypes.c_int64] * 8
            + [ctypes.c_float]
        )
    for name in ("paged_decode_max_span", "paged_decode_max_span_heads", "paged_decode_max_block_size"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def kernel_limits(lib: ctypes.CDLL) -> tuple[int, int, int]:
    """(elements, heads) one call may span, and the largest cache block it takes."""
    return lib.paged_decode_max_span(), lib.paged_decode_max_span_heads(), lib.paged_decode_max_block_size()


def plan_pieces(num_seqs: int, heads: int, head_dim: int, threads: int, max_span: int,
                max_span_heads: int) -> tuple[int, int]:
    """(seq_parts, head_group): how the kernel cuts a step into pieces for `threads` threads.

    By sequences when there are at least as many as threads; otherwise (batch 1) each sequence's
    heads are shared out too. Heads always come in groups one call can span.
    """
    group = max(1, min(heads, max_span_heads, max_span // head_dim))
    if num_seqs >= threads:
        return threads, group
    per_seq = -(-threads // num_seqs)  # threads a sequence gets
    return num_seqs, min(group, -(-heads // per_seq))


def _shares_token_layout(tensors: list[torch.Tensor]) -> bool:
    """Whether the kernel can read these [B, H, D] tensors in place: heads and head_dim contiguous,
    and one token stride for all (q, k and v as views of the QKV projection's output are)."""
    q = tensors[0]
    return all(
        t.stride(2) == 1 and t.stride(1) == q.shape[2] and t.stride(0) == q.stride(0) and t.shape == q.shape
        for t in tensors
    )


class CpuPagedAttention(TorchPagedAttention):
    """The torch reference, with decode steps through the fused C kernel (split across threads)."""

    name = "cpu"

    def __init__(self, num_threads: int | None = None) -> None:
        self.kernel = load_paged_decode_kernel()
        self.num_threads = num_threads or torch.get_num_threads()
        self.max_span, self.max_span_heads, self.max_block_size = (
            kernel_limits(self.kernel) if self.kernel is not None else (0, 0, 0)
        )

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
        fits = (
            query.device.type == "cpu"
            and query.dtype in KERNELS
            and k_cache.is_contiguous()
            and k_cache.shape[1] <= self.max_block_size
            and query.shape[-1] <= self.max_span
        )
        if self.kernel is None or not meta.is_decode_only or not fits:
            return super().forward(query, key, value, k_cache, v_cache, meta, scale)
        if torch.compiler.is_compiling():  # one opaque operator for torch.compile: see cpu_decode_attention
            return torch.ops.roseinfer.cpu_decode_attention(
                query, key, value, k_cache, v_cache, meta.slot_mapping, meta.block_tables, meta.context_lens, scale
            )
        return self.decode(query, k_cache, v_cache, meta, scale, key, value)

    def decode(
        self,
        query: torch.Tensor,  # [B, H, D]: one token a sequence
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        key: torch.Tensor | None = None,  # [B, H, D]: the new tokens' K/V, written by the kernel
        value: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The fused kernel: attention of each sequence's one query over its cached context.

        With `key` and `value` the step's new K/V are first written at meta.slot_mapping, by the
        kernel; without, they must already be in the cache.
        """
        new = [query] if key is None else [query, key, value]
        if not _shares_token_layout(new):
            new = [t.contiguous() for t in new]
        query = new[0]
        out = torch.empty(query.shape, dtype=query.dtype)
        num_seqs, heads, head_dim = query.shape
        # The kernel reads int32 tables and int64 slots; convert once a forward, not once a layer.
        state = meta.backend_state
        if "cpu_tables" not in state:
            state["cpu_tables"] = meta.block_tables.to(torch.int32).contiguous()
            state["cpu_lens"] = meta.context_lens.to(torch.int32).contiguous()
            state["cpu_slots"] = meta.slot_mapping.to(torch.int64).contiguous()
        tables, lens, slots = state["cpu_tables"], state["cpu_lens"], state["cpu_slots"]
        kernel = getattr(self.kernel, KERNELS[query.dtype])
        fixed = (heads, head_dim, k_cache.shape[1], tables.shape[1], scale)
        new_kv = (new[1].data_ptr(), new[2].data_ptr(), slots.data_ptr()) if key is not None else (None, None, None)
        num_slots = k_cache.shape[0] * k_cache.shape[1]
        pointers = [query.data_ptr(), *new_kv, query.stride(0), num_slots]
        pointers += [t.data_ptr() for t in (k_cache, v_cache, tables, lens, out)]

        # Waking torch's worker threads for a piece of the step costs a few microseconds: tiny
        # steps (a few short contexts) run on this thread alone.
        work = num_seqs * meta.max_context_len * heads
        threads = self.num_threads if work >= SPLIT_ABOVE_ROW_TOKENS else 1
        seq_parts, head_group = plan_pieces(num_seqs, heads, head_dim, threads, self.max_span, self.max_span_heads)
        status = kernel(*pointers, num_seqs, seq_parts, head_group, threads, *fixed)
        if status == 2:
            raise IndexError(f"a slot in {slots.tolist()} is outside the KV cache ({num_slots} slots)")
        if status:
            raise ValueError(f"head_dim {head_dim} or block size {k_cache.shape[1]} is over the kernel's limit")
        return out


@torch.library.custom_op("roseinfer::cpu_decode_attention", mutates_args=("k_cache", "v_cache"))
def cpu_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """A decode step's KV write and fused attention as one operator, for torch.compile.

    Declaring the two caches as mutated in place lets inductor hand them to
    the kernel as they are. Traced as plain `index_copy_` on a view of the
    cache, the write is functionalized into a copy of the layer's whole cache
    every step; and ctypes calls cannot be traced at all.
    """
    meta = AttentionMetadata(
        slot_mapping, block_tables, context_lens, context_lens, 1, int(context_lens.max())
    )  # query_start_loc is unused by a decode-only step
    return _compiled_backend().decode(query, k_cache, v_cache, meta, scale, key, value)


@cpu_decode_attention.register_fake
def _(query, key, value, k_cache, v_cache, slot_mapping, block_tables, context_lens, scale):
    return query.new_empty(query.shape)  # contiguous, as decode() returns it


@functools.cache
def _compiled_backend() -> CpuPagedAttention:
    return CpuPagedAttention()
