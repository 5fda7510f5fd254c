"""A roofline floor: how fast could this step be on this device at all?

A forward step has to do some FLOPs (the matmuls, the attention) and move
some bytes (every weight once, each context's keys and values). With the
device's measured matmul peak P and memory bandwidth W, no implementation can
finish a step faster than max(FLOPs / P, bytes / W). Dividing that floor by
a measured time says what fraction of the hardware a result uses.

Peaks are measured, not taken from a datasheet: a large matmul in the run's
dtype, and a large read from memory (see `measure_peaks`). On a shared machine
one measurement can land anywhere in a wide range, so the notebooks use
`machine_peaks`: several measurements, taken once per machine (per boot) and kept in
results/<device>/peaks.json, so every notebook divides by the same figures and
can show their spread.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from roseinfer.config import ModelConfig
from roseinfer.models.registry import model_family


@dataclass(frozen=True)
class StepCost:
    flops: float
    bytes: float

    def __add__(self, other: StepCost) -> StepCost:
        return StepCost(self.flops + other.flops, self.bytes + other.bytes)

    def floor_s(self, peaks: dict[str, float]) -> float:
        return max(self.flops / peaks["matmul_flops"], self.bytes / peaks["mem_bytes_s"])

    def bound(self, peaks: dict[str, float]) -> str:
        """Which of the two sets the floor: "FLOPs" or "bytes"."""
        return "FLOPs" if self.flops / peaks["matmul_flops"] > self.bytes / peaks["mem_bytes_s"] else "bytes"


def step_cost(
    config: ModelConfig, new_tokens: int, attended: float, num_logits: int, elem_bytes: int, kv_read: float,
    weight_bytes: float | None = None,
) -> StepCost:
    """One forward pass.

    new_tokens: tokens computed this step; attended: sum over them of the
    context each attends to; num_logits: rows that go through the LM head;
    kv_read: context tokens whose K/V must be read from the cache; elem_bytes:
    the K/V's element size, and the weights' unless weight_bytes says (int8 weights: 1).
    """
    e, layers, v = config.n_embd, config.n_layer, config.vocab_size
    q, kv = config.n_head * config.head_dim, config.n_kv_head * config.head_dim  # widths; kv < q under GQA
    mlp = model_family(config.family).mlp_matrices * e * config.intermediate_size
    matmul_params = layers * (e * (q + 2 * kv) + q * e + mlp)  # q/k/v, output, MLP (GPT-2: 12 e^2 a layer)
    flops = 2 * new_tokens * matmul_params + 2 * num_logits * e * v + 4 * layers * q * attended
    weights = (matmul_params + v * e) * (elem_bytes if weight_bytes is None else weight_bytes)
    kv_bytes = 2 * layers * kv * elem_bytes * (kv_read + new_tokens)  # read the context, write the new
    return StepCost(flops, weights + kv_bytes)


def decode_step_cost(config: ModelConfig, context_lens: Sequence[int], elem_bytes: int,
                     weight_bytes: float | None = None) -> StepCost:
    total = float(sum(context_lens))
    return step_cost(config, len(context_lens), total, len(context_lens), elem_bytes, total, weight_bytes)


def prefill_cost(config: ModelConfig, prompt_lens: Sequence[int], elem_bytes: int,
                 weight_bytes: float | None = None) -> StepCost:
    attended = sum(n * (n + 1) / 2 for n in prompt_lens)
    return step_cost(config, sum(prompt_lens), attended, len(prompt_lens), elem_bytes, 0.0, weight_bytes)


def continuous_batching_floor(
    config: ModelConfig,
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    max_batch: int,
    elem_bytes: int,
    peaks: dict[str, float],
    weight_bytes: float | None = None,
) -> dict[str, float]:
    """Floor for a whole workload run by an ideal continuous-batching engine.

    Requests are admitted in order as slots free up; each admission costs its
    prefill, each step one token per running request.
    """
    waiting = list(zip(prompt_lens, output_lens))[::-1]
    running: list[list[int]] = []  # [context length, tokens left]
    total = 0.0
    steps = 0
    while waiting or running:
        admitted = []
        while waiting and len(running) < max_batch:
            p, o = waiting.pop()
            admitted.append(p)
            if o > 1:
                running.append([p + 1, o - 1])
        if admitted:
            total += prefill_cost(config, admitted, elem_bytes, weight_bytes).floor_s(peaks)
        if running:
            total += decode_step_cost(config, [c for c, _ in running], elem_bytes, weight_bytes).floor_s(peaks)
            steps += 1
            for r in running:
                r[0] += 1
                r[1] -= 1
            running = [r for r in running if r[1] > 0]
    return {"floor_s": total, "decode_steps": steps}


def workload_ceiling_tok_s(
    config: ModelConfig,
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    dtype: torch.dtype,
    device: str = "cpu",
    small: bool = False,
    mem_bytes_s: float | None = None,
) -> float:
    """Output tok/s of an ideal engine running the whole workload at once at this device's peaks.

    dtype torch.int8: int8 weights (one byte each) and int8 products at their measured peak, fp32 K/V.
    small=True measures the peaks at token sizes: it exercises the code (tests), its ceiling means nothing.
    mem_bytes_s: a read bandwidth measured beside the run being judged, in place of the one measured once a
    process (a virtual machine's drifts within minutes, so a ceiling taken at another time can be exceeded).
    """
    peaks = measure_peaks(device, dtype, small)
    if mem_bytes_s is not None:
        peaks = peaks | {"mem_bytes_s": mem_bytes_s}
    int8 = dtype == torch.int8
    elem_bytes = 4 if int8 else torch.empty((), dtype=dtype).element_size()
    floor = continuous_batching_floor(config, prompt_lens, output_lens, len(prompt_lens), elem_bytes, peaks,
                                      weight_bytes=1 if int8 else None)
    return sum(output_lens) / floor["floor_s"]


@functools.lru_cache(maxsize=8)
def measure_peaks(
    device: str = "cpu", dtype: torch.dtype = torch.float32, small: bool = False
) -> dict[str, float]:
    """Measured matmul FLOP/s (in dtype) and memory bandwidth (bytes/s) on the device.

    Each peak is the best of several ways to reach it, because a ceiling that
    an engine beats is no ceiling:
    - matmul: a square `torch.mm`, and on a CPU also oneDNN's packed linear at a
      large row count (the kernel the engines' projections use; BLAS's `mm`
      can be far slower, e.g. MKL on an AMD CPU);
    - memory (`mem_bytes_s`, a *read* bandwidth): the fastest of a read-only sum
      over 1 GiB and one row through 512 MB of weights by oneDNN's packed
      projection and by roseinfer's fp32 kernel (a batch-1 decode step: its
      kernels prefetch, and read faster than the sum). A copy is measured too (`copy_bytes_s`, bytes read plus written):
      on a 2-core slice of a server CPU it moves more bytes a second than two
      cores can *read* (~1.6x on an AMD EPYC), so it would be a ceiling no
      weight-reading step can approach; it is reported, not used.
    small=True: a token-sized measurement that only exercises the code (CI), not a peak.
    """
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    # Both buffers are larger than any CPU cache (a cached copy would report the cache's speed).
    big = torch.empty((1 if small else 256 if cuda else 1024) << 20, device=dev, dtype=torch.uint8)
    dst = torch.empty_like(big)

    def best(fn, reps: int) -> float:
        return _best_time(fn, reps, dev)

    copy = {"copy_bytes_s": 2 * big.numel() / best(lambda: dst.copy_(big), 5)}
    if dtype == torch.int8:  # int8 products (the int8 engines' matmuls); the memory is read as for fp32
        return {"matmul_flops": max(ops / best(run, 5) for run, ops in _int8_matmul_cases(dev, small)),
                "mem_bytes_s": read_bandwidth_meter(dev, torch.float32, small)()} | copy
    n = 128 if small else 4096 if cuda else 1536
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    flops = [2 * n**3 / best(lambda: torch.mm(a, b), 5)]
    packed = _packed_linear_case(dev, dtype, small)
    if packed is not None:
        run, case_flops = packed
        flops.append(case_flops / best(run, 5))
    return {
        "matmul_flops": max(flops),
        "mem_bytes_s": read_bandwidth_meter(dev, dtype, small)(),
    } | copy


def _best_time(fn, reps: int, dev: torch.device) -> float:
    """The fastest of `reps` timed calls (after one untimed), in seconds."""
    cuda = dev.type == "cuda"
    fn()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize(dev)
        t = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t)
    return min(times)


# What read_bandwidth_meter takes the fastest of (results record it: ceilings measured before roseinfer's kernel
# joined were read without it).
BANDWIDTH_READERS = ("a sum over 1 GiB", "oneDNN's packed projection of one row through 512 MB",
                     "roseinfer's fp32 kernel on one row through 512 MB")


def read_bandwidth_meter(device="cpu", dtype: torch.dtype = torch.float32, small: bool = False):
    """A function that measures the memory's read bandwidth now, in bytes/s: the fastest of a sum over
    1 GiB and one row through 512 MB of weights by oneDNN's packed projection and by roseinfer's fp32
    kernel (see measure_peaks). roseinfer's is there because an engine runs it: a ceiling is the best of
    the readers the engines use, on every CPU class (roseinfer.cpu_class caps the other two).

    Its buffers are built once, so a benchmark that compares a step with its floor can measure the
    bandwidth beside each of its rounds: a virtual machine's drifts within minutes."""
    dev = torch.device(device)
    stream = torch.ones((1 << 20) if small else (1 << 28), device=dev, dtype=torch.float32)  # 1 GiB
    gemvs = [case for case in (_packed_gemv_case(dev, dtype, small), _own_gemv_case(dev, small)) if case is not None]

    def measure() -> float:
        reads = [stream.numel() * stream.element_size() / _best_time(stream.sum, 5, dev)]
        for run, weight_bytes in gemvs:
            reads.append(weight_bytes / _best_time(run, 3, dev))
        return max(reads)

    return measure


PEAK_KEYS = ("matmul_flops", "mem_bytes_s")


def machine_peaks(
    device: str = "cpu", dtype: torch.dtype = torch.float32, small: bool = False, measurements: int = 5
) -> dict[str, float | list[float]]:
    """`measure_peaks` taken `measurements` times, once per machine (per boot), and reused by every notebook.

    Each peak is the best of its measurements (a ceiling is what the machine can reach; a slow
    measurement is a neighbour's noise), and `<key>_runs` keeps them all so a reader sees the
    spread. The file results/<device>/peaks.json holds one entry per dtype for this machine
    (processor, its features, threads, torch, and this boot: two virtual machines with the same
    processor name can differ several-fold), so a new machine measures its own and the file is
    rewritten for it. small=True (CI's token sizes) is measured each time and never kept.
    """
    from roseinfer.bench.results import boot_id, cpu_info, device_name, read_json, results_dir, write_json

    machine = "|".join([device_name(device), repr(sorted(cpu_info()["cpu_flags"].items())), torch.__version__,
                        boot_id()])
    key = f"{machine}|{dtype}"
    path = results_dir(device) / "peaks.json"
    # Only this boot's entries are kept: the file describes the machine the committed results ran on.
    stored = {k: v for k, v in read_json(path).items() if k.startswith(machine + "|")} \
        if path.exists() and not small else {}
    if key in stored:
        return stored[key]
    runs = [measure_peaks.__wrapped__(device, dtype, small) for _ in range(measurements)]
    peaks: dict[str, float | list[float]] = {}
    for name in PEAK_KEYS:
        values = [run[name] for run in runs]
        peaks[name] = max(values)
        peaks[f"{name}_runs"] = values
        peaks[f"{name}_median"] = statistics.median(values)
    if not small:
        write_json(path, stored | {key: peaks})
    return peaks


def describe_peaks(peaks: dict) -> str:
    """One line for a notebook: the peaks it divides by, and how far apart their measurements were."""
    def spread(name: str, scale: float, unit: str) -> str:
        runs = peaks.get(f"{name}_runs") or [peaks[name]]
        return (f"{peaks[name] / scale:.0f} {unit} (best of {len(runs)} measurements on this machine, "
                f"which ranged {min(runs) / scale:.0f}–{max(runs) / scale:.0f})")

    return (f"Peaks measured on this machine: matmul {spread('matmul_flops', 1e9, 'GFLOP/s')}; "
            f"memory read bandwidth {spread('mem_bytes_s', 1e9, 'GB/s')}.")


def _packed_linear_case(dev: torch.device, dtype: torch.dtype, small: bool):
    """(run, flops) of one oneDNN packed projection, 512 rows x 768 -> 3072 (gpt2's MLP), or None."""
    from roseinfer.models.packed_linear import packing_available

    if not packing_available(dev, dtype):
        return None
    rows, k, n = (16, 64, 128) if small else (512, 768, 3072)
    weight = torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k, dtype=dtype), rows)
    x = torch.randn(rows, k, dtype=dtype)
    return (lambda: torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")), 2 * rows * k * n


def _int8_matmul_cases(dev: torch.device, small: bool) -> list:
    """[(run, ops)] of int8 x int8 matmuls, 512 rows x 768 -> 3072 (gpt2's MLP): torch._int_mm (oneDNN), and
    roseinfer's kernel (linear_w8a8.c, x quantized in the call) where it builds. An int8 product counts as
    a multiply and an add, as a FLOP does."""
    rows, k, n = (16, 64, 128) if small else (512, 768, 3072)
    a = torch.randint(-127, 128, (rows, k), dtype=torch.int8, device=dev)
    b = torch.randint(-127, 128, (k, n), dtype=torch.int8, device=dev)
    cases = [(lambda: torch._int_mm(a, b), 2 * rows * k * n)]
    if dev.type == "cpu":
        from roseinfer.kernels.cpu.bindings import load_w8a8_linear_kernel, quantize_w8a8_panels, w8a8_linear

        lib = load_w8a8_linear_kernel()
        if lib is not None:
            packed, scale, colsum = quantize_w8a8_panels(torch.randn(n, k), lib.linear_w8a8_panel_columns())
            x = torch.randn(rows, k)
            cases.append((lambda: w8a8_linear(x, packed, scale, colsum, None, False, n, k), 2 * rows * k * n))
    return cases


def _own_gemv_case(dev: torch.device, small: bool):
    """(run, bytes) of one row through roseinfer's fp32 panels larger than any cache, or None (no kernel)."""
    from roseinfer.kernels.cpu.bindings import f32_linear, load_f32_linear_kernel, pack_f32_panels

    lib = load_f32_linear_kernel() if dev.type == "cpu" else None
    if lib is None:
        return None
    k, n = (64, 256) if small else (4096, 4096)
    count = 4 if small else (512 << 20) // (k * n * 4)
    panels = [pack_f32_panels(torch.randn(n, k), lib.linear_f32_panel_columns()) for _ in range(count)]
    x = torch.randn(1, k)

    def run() -> None:
        for p in panels:
            f32_linear(x, p, None, False, n)

    return run, count * k * n * 4


def _packed_gemv_case(dev: torch.device, dtype: torch.dtype, small: bool):
    """(run, bytes) of one row through packed weights larger than any cache, or None."""
    from roseinfer.models.packed_linear import packing_available

    if not packing_available(dev, dtype):
        return None
    elem = torch.empty((), dtype=dtype).element_size()
    k, n = (64, 256) if small else (4096, 4096)
    count = 4 if small else (512 << 20) // (k * n * elem)
    weights = [torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k, dtype=dtype), 1) for _ in range(count)]
    x = torch.randn(1, k, dtype=dtype)

    def run() -> None:
        for w in weights:
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

    return run, count * k * n * elem
