"""fp32 against bf16 on the CPU, through oneDNN's bf16 kernel and roseinfer's own (notebook 11).

- `variants` / `engine_bf16`: the decode paths compared, and the bf16 one the engine takes on this CPU;
- `kernel_inner_loop`: the kernel's inner loop, cut from linear_bf16.c for the notebook to print;
- `kernel_error`: roseinfer's bf16 kernel against fp32 arithmetic on the same bf16 inputs;
- `agreement` (`agreement_from` on given logits): how far bf16's logits and greedy tokens are from fp32's;
- `interleaved_runs`: one decode step per variant, timed in interleaved rounds;
- `speed_table`: the step times and the verdicts (fp32 -> the engine's bf16, oneDNN's bf16 -> the kernel);
- `floor_table`: each variant's roofline floor and the share of it each reaches;
- `plot_steps`: step time and speed-up over fp32 against the batch.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from roseinfer.bench.roofline import decode_step_cost
from roseinfer.bench.same_answer import matching_prefix
from roseinfer.bench.stats import Verdict, median, verdict

FP32, ONEDNN, KERNEL = "fp32", "bf16 oneDNN", "bf16 roseinfer kernel"
# name: (dtype, cpu_linear). fp32 is the engine as notebook 10 ran it: "auto" lets it take its own fp32 kernel
# and notebook 09's one C call where they win; the bf16 variants name their projections' kernel.
ALL_VARIANTS = {FP32: ("float32", "auto"), ONEDNN: ("bfloat16", "onednn"), KERNEL: ("bfloat16", "roseinfer")}
COLORS = {FP32: "#7f7f7f", ONEDNN: "#1f77b4", KERNEL: "#d62728"}


def variants(kernel: bool) -> dict[str, tuple[str, str]]:
    """The variants this CPU can run: the kernel's only where it loads (AVX512-BF16 and a C compiler)."""
    return {name: v for name, v in ALL_VARIANTS.items() if kernel or name != KERNEL}


def engine_bf16(kernel: bool, amx: bool) -> str:
    """The bf16 path the engine takes here (`bf16_kernel_wanted`): the kernel where it runs, unless AMX."""
    return KERNEL if kernel and not amx else ONEDNN


def kernel_inner_loop(source: str) -> str:
    """The loop over k-pairs of linear_bf16.c's ROWS_KERNEL macro, without the macro's line continuations."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if "for (int64_t p = 0; p < pairs" in line)
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("}")
               and len(lines[i]) - len(lines[i].lstrip()) == indent)
    return "\n".join(line.rstrip().rstrip("\\").rstrip()[indent:] for line in lines[start:end + 1])


def kernel_error(rows: Sequence[int] = (1, 13, 50), seed: int = 0) -> dict[str, float]:
    """Worst relative error of roseinfer's bf16 kernel against fp32 arithmetic on the same bf16 inputs, per
    gpt2 projection shape (relative to each output, or to 0.01 for outputs nearer zero). Needs the kernel."""
    from roseinfer.models.packed_linear import PackedLinear

    g = torch.Generator().manual_seed(seed)
    worst = {}
    for name, (fan_in, fan_out, activation) in {"c_fc + GELU": (768, 3072, "gelu_tanh"),
                                                 "c_attn": (768, 2304, "none")}.items():
        weight = (torch.randn(fan_out, fan_in, generator=g) * 0.05).bfloat16()
        bias = torch.randn(fan_out, generator=g).bfloat16()
        layer = PackedLinear(weight, bias, activation, cpu_linear="roseinfer")
        if layer.kernel != "roseinfer":
            raise RuntimeError("roseinfer's bf16 kernel does not run on this CPU")
        worst[name] = 0.0
        for n in rows:
            x = torch.randn(n, fan_in, generator=g).bfloat16()
            exact = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
            if activation == "gelu_tanh":
                exact = torch.nn.functional.gelu(exact, approximate="tanh")
            err = ((layer(x).float() - exact).abs() / (exact.abs() + 1e-2)).max().item()
            worst[name] = max(worst[name], err)
    return worst


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


@dataclass
class Agreement:
    """bf16 variants against fp32: logits on fp32's own histories, and greedy tokens generated on their own."""

    new_tokens: int
    distinct: float  # median distinct tokens in fp32's greedy requests
    typical_margin: float  # median of fp32's top-1 minus top-2 logit over every generated position
    logit_error: dict[str, list[float]] = field(default_factory=dict)  # per request: worst |b - f| / max |f|
    next_token: dict[str, float] = field(default_factory=dict)  # share of positions picking fp32's next token
    prefix: dict[str, float] = field(default_factory=dict)  # mean share of tokens before the first difference
    identical: dict[str, int] = field(default_factory=dict)  # requests identical to fp32's
    split_margin: dict[str, float | None] = field(default_factory=dict)  # median fp32 margin at first differences
    requests: int = 0

    def table(self) -> str:
        rows = [[name, f"{median(e):.2%} / {max(e):.2%}", f"{self.next_token[name]:.1%}", f"{self.prefix[name]:.0%}",
                 f"{self.identical[name]}/{self.requests}",
                 "-" if self.split_margin[name] is None else f"{self.split_margin[name]:.3f}"]
                for name, e in self.logit_error.items()]
        header = ["vs fp32", "logit error, median / worst", "next token same", "tokens before 1st diff",
                  "identical", "fp32 top-2 margin there"]
        return (format_table(header, rows) + f"\nfp32: top-2 margin at all positions {self.typical_margin:.3f} "
                f"(median); {self.distinct:g} distinct tokens of {self.new_tokens} a request (median)")


def agreement_from(tokens: Mapping[str, list[list[int]]], logits: Mapping[str, list[torch.Tensor]],
                   prompt_lens: Sequence[int], new_tokens: int) -> Agreement:
    """`tokens[name]`: each request's greedy tokens; `logits[name]`: each variant's logits [len, vocab] over
    fp32's history (prompt + fp32's tokens). "fp32" is the reference; every other name is compared with it."""
    gen = [slice(n - 1, n - 1 + new_tokens) for n in prompt_lens]  # rows that predict the generated tokens
    ref = logits[FP32]
    top2 = [f[g].topk(2, dim=-1).values for f, g in zip(ref, gen)]
    margins = [(t[:, 0] - t[:, 1]).tolist() for t in top2]
    result = Agreement(new_tokens, statistics.median(len(set(t)) for t in tokens[FP32]),
                       statistics.median(m for request in margins for m in request), requests=len(prompt_lens))
    for name in (n for n in logits if n != FP32):
        result.logit_error[name] = [((b - f).abs().max() / f.abs().max()).item() for b, f in zip(logits[name], ref)]
        result.next_token[name] = statistics.mean(
            (b[g].argmax(-1) == f[g].argmax(-1)).float().mean().item() for b, f, g in zip(logits[name], ref, gen))
        result.prefix[name] = matching_prefix(tokens[name], tokens[FP32])
        result.identical[name] = sum(a == b for a, b in zip(tokens[name], tokens[FP32]))
        firsts = [_first_difference(a, b) for a, b in zip(tokens[name], tokens[FP32])]
        at_split = [margins[r][i] for r, i in enumerate(firsts) if i is not None and i < len(margins[r])]
        result.split_margin[name] = statistics.median(at_split) if at_split else None
    return result


def agreement(engines: Mapping, prompts: list[list[int]], new_tokens: int) -> tuple[Agreement, dict]:
    """Greedy tokens from each engine, and each engine's logits over fp32's own histories, compared."""
    from roseinfer import SamplingParams

    greedy = SamplingParams(max_new_tokens=new_tokens, stop_on_eos=False)
    tokens = {name: [o.token_ids for o in e.generate(prompts, greedy)] for name, e in engines.items()}
    histories = [p + t for p, t in zip(prompts, tokens[FP32])]
    logits = {name: [e.prompt_logits(h) for h in histories] for name, e in engines.items()}
    return agreement_from(tokens, logits, [len(p) for p in prompts], new_tokens), tokens


def interleaved_runs(engines: Mapping, batches: Sequence[int], context: int, rounds: int,
                     repeats: int) -> dict[str, dict[int, list[float]]]:
    """ms of one decode step (the median of `repeats`), `rounds` runs per variant and batch, variants interleaved."""
    from roseinfer.bench.decode_step import decode_batch, step_times_ms

    runs = {name: {b: [] for b in batches} for name in engines}
    with torch.inference_mode():
        for batch in batches:
            with contextlib.ExitStack() as stack:
                steps = {name: stack.enter_context(decode_batch(e, batch, context)) for name, e in engines.items()}
                for _ in range(rounds):
                    for name, e in engines.items():
                        runs[name][batch].append(statistics.median(step_times_ms(e, steps[name], repeats)))
    return runs


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(" | ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in [header, *rows])


def _ratio(v: Verdict) -> str:
    if not v.significant:
        return f"same (p {v.p_value:.2g})"
    return f"{v.ratio:.2f}x (p {v.p_value:.2g})"


def speed_table(runs: Mapping[str, Mapping[int, list[float]]], engine: str) -> tuple[str, dict[str, dict[int, Verdict]]]:
    """Median step ms per variant and batch, and the verdicts: "fp32 -> engine" (fp32 against the engine's bf16)
    and, where the kernel ran, "oneDNN -> kernel". A ratio is speed after over before; "same": no difference
    the rank test can show."""
    batches = list(runs[FP32])
    verdicts = {"fp32 -> engine": {b: verdict(f"batch {b}", runs[FP32][b], runs[engine][b], "ms", False)
                                   for b in batches}}
    if KERNEL in runs:
        verdicts["oneDNN -> kernel"] = {b: verdict(f"batch {b}", runs[ONEDNN][b], runs[KERNEL][b], "ms", False)
                                        for b in batches}
    short = {FP32: "fp32", ONEDNN: "bf16 oneDNN", KERNEL: "bf16 kernel"}
    header = ["batch", *(f"{short[name]} ms" for name in runs), "speed: engine's bf16 / fp32"]
    if KERNEL in runs:
        header.append("speed: kernel / oneDNN")
    rows = [[str(b), *(f"{median(runs[name][b]):.3g}" for name in runs), *(_ratio(v[b]) for v in verdicts.values())]
            for b in batches]
    return format_table(header, rows), verdicts


def paired_ratio(before: Sequence[float], after: Sequence[float]) -> float:
    """Median of before / after over interleaved rounds: robust to one noisy round."""
    return median([b / a for b, a in zip(before, after)])


def roofs(peaks: Mapping[str, Mapping], variant_dtypes: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Each variant's roof: one read bandwidth for all (the better of the two measurements: reading memory does
    not depend on the dtype), and its dtype's matmul peak, roseinfer's kernel's capped at twice fp32's (AVX512-BF16's
    dot products: the bf16 peak may come from AMX tiles it does not use)."""
    bandwidth = max(p["mem_bytes_s"] for p in peaks.values())
    out = {}
    for name, dtype in variant_dtypes.items():
        flops = peaks[dtype]["matmul_flops"]
        if name == KERNEL:
            flops = min(flops, 2 * peaks["float32"]["matmul_flops"])
        out[name] = {"matmul_flops": flops, "mem_bytes_s": bandwidth}
    return out


@dataclass
class FloorRow:
    batch: int
    bound: dict[str, str]  # variant -> "bytes" or "FLOPs"
    floor_ms: dict[str, float]
    share: dict[str, float]  # floor / measured median


def floor_table(config, peaks: Mapping[str, Mapping], runs: Mapping[str, Mapping[int, list[float]]], context: int,
                engine: str, native: bool) -> tuple[str, list[FloorRow]]:
    """Each variant's floor (bytes and FLOPs against `roofs`) and the share of it reached, per batch. Without bf16
    units the bf16 "peak" is a fallback's speed, not a roof: only fp32's floor is drawn then."""
    dtypes = {name: ALL_VARIANTS[name][0] for name in runs if native or ALL_VARIANTS[name][0] == "float32"}
    roof = roofs(peaks, dtypes)
    rows = []
    for b in runs[FP32]:
        costs = {n: decode_step_cost(config, [context] * b, 4 if d == "float32" else 2) for n, d in dtypes.items()}
        floor = {n: costs[n].floor_s(roof[n]) * 1000 for n in dtypes}
        rows.append(FloorRow(b, {n: costs[n].bound(roof[n]) for n in dtypes}, floor,
                             {n: floor[n] / median(runs[n][b]) for n in dtypes}))
    bf16 = engine if engine in dtypes else None
    short = {FP32: "fp32", ONEDNN: "oneDNN", KERNEL: "kernel"}
    header = ["batch", "set by", "floor ms: fp32, bf16", "speed-up: floors, measured",
              "share of floor: " + ", ".join(short[n] for n in dtypes)]
    table = []
    for r in rows:
        measured = median(runs[FP32][r.batch]) / median(runs[engine][r.batch])
        floors = f"{r.floor_ms[FP32]:.3g}, " + (f"{r.floor_ms[bf16]:.3g}" if bf16 else "-")
        ratio = f"{r.floor_ms[FP32] / r.floor_ms[bf16]:.2f}x, " if bf16 else "-, "
        table.append([str(r.batch), "/".join(dict.fromkeys(r.bound.values())), floors, ratio + f"{measured:.2f}x",
                      ", ".join(f"{r.share[n]:.0%}" for n in dtypes)])
    peak_line = (f"peaks: matmul fp32 {peaks['float32']['matmul_flops'] / 1e9:.0f}, bf16 "
                 f"{peaks['bfloat16']['matmul_flops'] / 1e9:.0f} GFLOP/s"
                 + (f" (the kernel's {roof[KERNEL]['matmul_flops'] / 1e9:.0f})" if KERNEL in roof else "")
                 + f"; read {next(iter(roof.values()))['mem_bytes_s'] / 1e9:.0f} GB/s")
    return peak_line + "\n" + format_table(header, table), rows


def plot_steps(runs: Mapping[str, Mapping[int, list[float]]], title: str):
    """Step ms against the batch (band: the runs' min-max), and each bf16 variant's speed over fp32's median."""
    from roseinfer.bench import plots

    batches = list(runs[FP32])
    fig, (ax1, ax2) = plots.figure(2, width=5.5)
    plots.curve(ax1, {n: (batches, [runs[n][b] for b in batches]) for n in runs}, "batch size (sequences in the step)",
                "ms per decode step (band: min-max of runs)", title, logx=True, colors=COLORS)
    plots.curve(ax2, {n: (batches, [[median(runs[FP32][b]) / t for t in runs[n][b]] for b in batches])
                      for n in runs if n != FP32},
                "batch size", "speed-up over fp32 (x)", "output tokens per second, relative to fp32", logx=True,
                colors=COLORS)
    ax2.axhline(1, color="grey", lw=0.8)
    return fig
