"""Notebook 08's measurements: one layer's decode attention through the gather (+ SDPA), and through a kernel that
reads keys and values in place through the block table.

- `decode_case`: a decode step's queries over a paged KV cache whose blocks are shuffled and whose unused slots
  hold a poison value, every sequence at the same context length unless `lens` says otherwise;
- `gather_attention`: the gather path (TorchPagedAttention's gather and masked SDPA) without its KV write;
  `ReusedGather`, the same into buffers it keeps from call to call (no fresh memory: what the copy itself costs);
- `measure`: the variants interleaved over a grid of batch x context, each call's time and minor page faults;
- `fault_cost_us`: what one minor page fault costs on this machine, measured apart;
- `fresh_share`, `fault_share`, `on_the_cliff`, `past_malloc_ceiling`, `read_gib_s`: the accounts it prints;
- `gpu_lines`: a GPU run's smallest and largest case in a line each (the committed one where there is no GPU);
- `copy_baseline`: a case's faster gather (fresh memory or kept buffers), what the kernel is fairly compared with;
- `show_lines`, `show_c_loop`: a few lines of a function's source, and the C kernel's loop over the blocks;
- `plot_cases`: the notebook's figure (times, and each case's speed-up with the page faults' part marked).
"""

from __future__ import annotations

import inspect
import random
import resource
import textwrap
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from roseinfer.attention.base import AttentionMetadata
from roseinfer.attention.torch_ref import TorchPagedAttention
from roseinfer.bench.stats import median

POISON = 1e4  # in every slot no sequence owns: a kernel that reads one is far off
MALLOC_MMAP_MAX_MIB = 32  # glibc's largest dynamic mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
PAGE = 4096


def decode_case(batch: int, context: int, heads: int, head_dim: int, block_size: int = 16, seed: int = 0,
                device: str = "cpu", lens: list[int] | None = None):
    """(q [B, H, D], k_cache, v_cache [blocks, block_size, H, D], meta): one decode step's attention inputs.

    Every sequence has `context` cached tokens (or lens[b]); its blocks lie in a shuffled order, and every slot no
    sequence owns holds POISON. Built on the host from one seeded generator (the same case on every device), then
    moved: a kernel cannot read host memory."""
    lens = [context] * batch if lens is None else list(lens)
    gen = torch.Generator().manual_seed(seed)
    blocks_each = -(-max(lens) // block_size)
    num_blocks = batch * blocks_each + 1  # one spare block nobody owns
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)
    tables = torch.tensor([order[b * blocks_each:(b + 1) * blocks_each] for b in range(batch)], dtype=torch.int32)
    k_cache = torch.randn((num_blocks, block_size, heads, head_dim), generator=gen)
    v_cache = torch.randn((num_blocks, block_size, heads, head_dim), generator=gen)
    owned = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    positions = torch.arange(blocks_each * block_size).view(blocks_each, block_size)
    for b, n in enumerate(lens):
        owned[tables[b].long()] = positions < n
    k_cache[~owned] = POISON
    v_cache[~owned] = POISON
    q = torch.randn(batch, heads, head_dim, generator=gen)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    q, k_cache, v_cache, tables, context_lens = (t.to(device) for t in (q, k_cache, v_cache, tables, context_lens))
    meta = AttentionMetadata(
        slot_mapping=torch.full((batch,), -1, device=device), block_tables=tables, context_lens=context_lens,
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device), max_query_len=1,
        max_context_len=max(lens))
    return q, k_cache, v_cache, meta


def gather_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                     scale: float, buffers: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """The gather path (TorchPagedAttention.forward's) without its KV write: every sequence's keys and values copied
    into a [B, longest context, H, D] tensor through the block table, then one masked SDPA. With `buffers` (two
    tensors of B x longest context x H x D elements) the copies go there instead of into new tensors."""
    plan = TorchPagedAttention().plan(meta, k_cache.shape[1], q.shape[0])
    batch, (heads, head_dim) = q.shape[0], q.shape[1:]
    shape = (batch, meta.max_context_len, heads, head_dim)
    flat = [cache.view(-1, heads, head_dim) for cache in (k_cache, v_cache)]
    if buffers is None:
        k, v = (cache.index_select(0, plan["k_slots"]) for cache in flat)
    else:
        k, v = (torch.index_select(cache, 0, plan["k_slots"], out=buffer.view(-1, heads, head_dim))
                for cache, buffer in zip(flat, buffers))
    k, v = (t.view(shape).transpose(1, 2) for t in (k, v))
    return F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=plan["mask"], scale=scale)[:, :, 0]


class ReusedGather:
    """gather_attention into two buffers kept from call to call (grown when a call needs more): the copy and SDPA
    without the fresh memory a new tensor of that size may come in."""

    def __init__(self) -> None:
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        need = q.shape[0] * meta.max_context_len * q.shape[1] * q.shape[2]
        if self.buffers is None or self.buffers[0].numel() < need or self.buffers[0].device != q.device:
            self.buffers = tuple(torch.empty(need, dtype=k_cache.dtype, device=q.device) for _ in range(2))
        return gather_attention(q, k_cache, v_cache, meta, scale, tuple(b[:need] for b in self.buffers))


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt  # minor page faults so far, every thread


def _timed(row: dict, variant: str, fn: Callable, case: tuple, sync: Callable[[], None]) -> None:
    sync()
    faults, start = _faults(), time.perf_counter()
    fn(*case)
    sync()
    row[f"{variant}_ms"].append((time.perf_counter() - start) * 1000)
    row[f"{variant}_faults"].append(_faults() - faults)


def measure(variants: dict[str, Callable], batches: Iterable[int], contexts: Iterable[int], repeats: int,
            heads: int, head_dim: int, device: str = "cpu", warmup: int = 3,
            sync: Callable[[], None] = lambda: None) -> list[dict[str, Any]]:
    """One row per (batch, context): each variant's ms and minor page faults per call (`<key>_ms`, `<key>_faults`),
    `repeats` calls each, interleaved (a slow moment of the machine hits all), after `warmup` calls of each (the
    allocator and the caches settle). Each variant takes (q, k_cache, v_cache, meta); "before" and "after" are
    compared in `speedup`."""
    rows = []
    for batch in batches:
        for context in contexts:
            case = decode_case(batch, context, heads, head_dim, seed=batch + context, device=device)
            bytes_per_token = 2 * heads * head_dim * case[1].element_size()  # a key and a value
            row: dict[str, Any] = {
                "batch": batch, "context": context,
                "gather_mb": batch * case[3].max_context_len * bytes_per_token / 2**20,  # the copy, padded
                "kv_mb": int(case[3].context_lens.sum()) * bytes_per_token / 2**20,  # what attention must read
                **{f"{key}_{what}": [] for key in variants for what in ("ms", "faults")}}
            for _ in range(warmup):
                for fn in variants.values():
                    fn(*case)
            for _ in range(repeats):
                for key, fn in variants.items():
                    _timed(row, key, fn, case, sync)
            row["speedup"] = median(row["before_ms"]) / median(row["after_ms"])
            rows.append(row)
            del case
    return rows


def fault_cost_us(mib: int = 64, runs: int = 5) -> list[float]:
    """µs one minor page fault costs, `runs` times: a first write to a fresh `mib` MiB buffer (every page faulted in,
    zeroed by the kernel) less the fastest of three writes to it after, over the faults the first took. A `mib` past
    MALLOC_MMAP_MAX_MIB makes sure the buffer is fresh: glibc maps a buffer that large anew every time."""
    costs = []
    for _ in range(runs):
        fresh = torch.empty(mib * 2**20 // 4)
        faults, start = _faults(), time.perf_counter()
        fresh.fill_(1.0)
        first, faulted = time.perf_counter() - start, _faults() - faults
        warm = []  # the write without faults, at its fastest of three: one write slowed by a neighbour
        for value in (2.0, 3.0, 4.0):  # would otherwise outweigh the faults' cost
            start = time.perf_counter()
            fresh.fill_(value)
            warm.append(time.perf_counter() - start)
        costs.append((first - min(warm)) * 1e6 / max(faulted, 1))
        del fresh
    return costs


def fresh_share(row: dict[str, Any]) -> float:
    """The share of the gather's median time that fresh memory costs: what the gather into reused buffers
    ("reused_ms") saves, measured (0 where it saves nothing)."""
    return max(0.0, 1 - median(row["reused_ms"]) / median(row["before_ms"]))


def fault_share(row: dict[str, Any], fault_us: float) -> float:
    """The share of the gather's median time its page faults account for, at `fault_us` a fault (priced)."""
    return median(row["before_faults"]) * fault_us / 1000 / median(row["before_ms"])


def on_the_cliff(row: dict[str, Any]) -> bool:
    """Whether the gather faults in about as many fresh pages a call as its copy holds (a quarter or more)."""
    return median(row["before_faults"]) > 0.25 * row["gather_mb"] * 2**20 / PAGE


def past_malloc_ceiling(row: dict[str, Any]) -> bool:
    """Whether the copy's K and V buffers (half the copy each) exceed glibc's largest mmap threshold: such a buffer
    goes back to the operating system when freed and comes back as fresh, zeroed pages on the next call."""
    return row["gather_mb"] / 2 > MALLOC_MMAP_MAX_MIB


def copy_baseline(row: dict[str, Any]) -> tuple[str, list[float]]:
    """(label, ms runs) of the case's faster gather by median: the plain one or the one into kept buffers. Below the
    mmap threshold the plain gather takes no fresh memory, and the kept buffers are not reliably faster."""
    if median(row["reused_ms"]) < median(row["before_ms"]):
        return "gather into kept buffers", row["reused_ms"]
    return "gather + SDPA", row["before_ms"]


def read_gib_s(mib: float, ms: float) -> float:
    return mib / 1024 / (ms / 1000)


def name(row: dict[str, Any]) -> str:
    return f"{row['batch']} x {row['context']}"


def size(row: dict[str, Any]) -> int:
    return row["batch"] * row["context"]


def gpu_lines(rows: list[dict[str, Any]], kv_heads: int, where: str, contexts: str,
              peak_gib_s: float | None = None) -> list[str]:
    """A GPU run's smallest and largest case: gather -> kernel, and the rate at which the kernel read the context
    (against the device's measured read rate, if given) with its batch x kv_heads programs (one per sequence and KV
    head). `contexts` says how the run drew them."""
    lines = []
    for r in (min(rows, key=size), max(rows, key=size)):
        before, after = median(r["before_ms"]), median(r["after_ms"])
        rate = read_gib_s(r["kv_mb"], after)
        of_peak = f" ({rate / peak_gib_s:.1%} of its measured {peak_gib_s:.0f})" if peak_gib_s else ""
        padded = f" (the gather copied {r['gather_mb']:.0f})" if r["gather_mb"] > 1.01 * r["kv_mb"] else ""
        lines.append(f"{where}, {name(r)}: gather {before:.3f} -> kernel {after:.3f} ms ({before / after:.1f}x); the "
                     f"kernel read {r['kv_mb']:.3g} MiB{padded} at {rate:.0f} GiB/s{of_peak}, with "
                     f"{r['batch'] * kv_heads} programs")
    return lines + [f"{where}: contexts {contexts}"]


def committed_read_gib_s(tag: str) -> float | None:
    """The read rate measured on a committed GPU run's machine (results/<tag>/peaks.json, fp32's entry), GiB/s."""
    from roseinfer.bench.results import read_json, repo_root

    path = repo_root() / "results" / tag / "peaks.json"
    rates = [v["mem_bytes_s"] for k, v in (read_json(path).items() if path.exists() else ()) if k.endswith("float32")]
    return max(rates) / 2**30 if rates else None


def show_lines(obj: Any, first: str, last: str) -> None:
    """Print obj's source from the line holding `first` through the line holding `last`."""
    lines = textwrap.dedent(inspect.getsource(obj)).splitlines()
    start = next(i for i, line in enumerate(lines) if first in line)
    stop = next(i for i, line in enumerate(lines) if i >= start and last in line)
    print("\n".join(lines[start:stop + 1]))


def show_c_loop(first: str = "for (int64_t start = 0; start < context", last: str = "store_normalized(") -> None:
    """Print paged_decode.c's loop over one sequence's blocks, without its prefetches, its bf16 branch and its
    grouped-query branch (what remains is the fp32 path the notebook times)."""
    from roseinfer.kernels.cpu import build

    source = (Path(build.__file__).parent / "paged_decode.c").read_text().splitlines()
    start = next(i for i, line in enumerate(source) if first in line)
    lines, skip = [], None
    for line in source[start:]:
        stripped = line.strip()
        if skip is not None:
            skip = None if stripped == skip else skip
        elif stripped.startswith(("#if BF16_DOT", "if (!bf16 && group > 1")):
            skip = "#endif" if stripped.startswith("#if") else "}"
        elif not any(w in line for w in ("prefetch", "#pragma", "next_", "block_ahead", "blocks ahead", "PREFETCH")):
            lines.append(line)
        if last in line:
            break
    print(textwrap.dedent("\n".join(lines)))


def plot_cases(rows: list[dict[str, Any]], labels: tuple[str, str], title: str):
    """Left: ms per call against the batch, a line per context (gather dashed, kernel solid, min-max bands; the
    gather into kept buffers dotted).
    Right: each case's speed-up (median; whisker: the range of the runs' own ratios, run i of each variant being
    interleaved): solid, the faster gather (copy_baseline) over the kernel; hatched, what fresh memory adds; dotted,
    the bytes' 3x."""
    from matplotlib.ticker import NullLocator

    from roseinfer.bench import plots

    fig, (ax1, ax2) = plots.figure(2, width=5.5, height=4.2)
    colors = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e"]
    for color, context in zip(colors, sorted({r["context"] for r in rows})):
        sel = [r for r in rows if r["context"] == context]
        x = [r["batch"] for r in sel]
        for key, style, label in (("before_ms", "--", labels[0]), ("reused_ms", ":", "kept buffers"),
                                  ("after_ms", "-", labels[1])):
            ax1.plot(x, [median(r[key]) for r in sel], style, marker="o" if style != ":" else None, color=color,
                     label=f"{label}, {context}")
            if style != ":":
                ax1.fill_between(x, [min(r[key]) for r in sel], [max(r[key]) for r in sel], color=color, alpha=0.15)
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    batches = sorted({r["batch"] for r in rows})
    ax1.set_xticks(batches, [str(b) for b in batches])
    ax1.xaxis.set_minor_locator(NullLocator())
    plots.plain_log_axis(ax1.yaxis)
    ax1.set(xlabel="batch (every sequence at the context named)", ylabel="ms per call (median; band: min-max)",
            title=title)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=6, handlelength=3, ncol=3, title="variant, context", title_fontsize=7)
    x = list(range(len(rows)))
    full = [r["speedup"] for r in rows]
    copy = [median(copy_baseline(r)[1]) / median(r["after_ms"]) for r in rows]
    ratios = [[b / a for b, a in zip(r["before_ms"], r["after_ms"])] for r in rows]
    ax2.bar(x, copy, color="#d9534f", label="the copy and SDPA (the faster gather)")
    ax2.bar(x, [f - c for f, c in zip(full, copy)], bottom=copy, color="white", edgecolor="#d9534f", hatch="///",
            label="fresh memory for the copy (page faults, mapping)")
    ax2.errorbar(x, full, yerr=[[f - min(r) for f, r in zip(full, ratios)], [max(r) - f for f, r in zip(full, ratios)]],
                 fmt="none", ecolor="#333", capsize=2, lw=0.8)
    for i, r in enumerate(rows):
        if on_the_cliff(r):
            ax2.text(i, max(ratios[i]), f"{fresh_share(r):.0%} of\nthe gather", ha="center", va="bottom", fontsize=6)
    ax2.axhline(1, color="grey", lw=0.8)
    ax2.axhline(3, color="#333", lw=0.8, ls=":", label="bytes: 3 passes against 1")
    ax2.set_xticks(x, [name(r).replace(" x ", "\n") for r in rows], fontsize=7)
    ax2.set(xlabel="batch / context", ylabel=f"{labels[0]} / {labels[1]} (medians)",
            title="speed-up, and what fresh memory adds")
    ax2.set_ylim(top=max(max(r) for r in ratios) * 1.35)
    ax2.legend(fontsize=7, loc="upper left")
    ax2.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
