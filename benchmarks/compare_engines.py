"""roseinfer next to the CPU engines a user would pick instead, same weights, same workloads.

    make peers                               # once: a virtualenv per peer under .peers/
    python benchmarks/compare_engines.py     # all engines, 3 interleaved runs, 2 threads

Engines (--engines): roseinfer-fp32, roseinfer-auto (the dtype the engine
picks for this CPU), roseinfer-int8 (int8 weights and activations, as
CTranslate2's int8), hf (transformers `generate`), vllm-fp32, vllm-bf16
(vLLM's CPU build), ct2-fp32, ct2-int8 (CTranslate2), llamacpp-f32
(llama.cpp via llama-cpp-python; its q8_0 GPT-2 crashed where first run). A peer whose virtualenv is missing is
skipped with a line saying so.

Weights: random GPT-2 124M (--preset gpt2, the default) or another preset's
shape (--preset smollm2-135m: the Llama family with grouped-query attention)
in HF layout from a seed, converted once per peer format with the peer's own
converter and cached (harness/peer_formats.py).

    python benchmarks/compare_engines.py --preset smollm2-135m \
        --output-json results/cpu/compare_engines_smollm2.json
Workloads: fixed, mixed, batch1 (harness/engine_compare.py). Each engine
runs in its own process from its own virtualenv (benchmarks/peers/run_*.py);
the rounds are interleaved, so machine noise hits every engine alike.
Reports output tokens/s and ms/token (median, min–max), the fraction of
requests whose greedy tokens equal roseinfer fp32's, and the fraction of the
roofline floor reached. Writes results/cpu/compare_engines.json and .png.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from harness.engine_compare import (
    WORKLOADS,
    BandwidthWatch,
    around,
    build_workloads,
    prompt_vocab,
    roofline,
    summarize_engine,
)
from harness.peer_formats import add_weights_arguments, ct2_model, gguf_model, weights_cache
from harness.peer_runs import run_engine

from roseinfer.bench import plots
from roseinfer.bench.peer_models import make_hf_weights
from roseinfer.bench.peers import ENGINES, PEERS_DIR, REFERENCE, Engine, installed
from roseinfer.bench.results import cpu_info, make_result, read_json, results_dir, write_json
from roseinfer.bench.roofline import BANDWIDTH_READERS
from roseinfer.bench.same_answer import agreement, matching_prefix
from roseinfer.config import PRESETS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    p.add_argument("--workload", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    add_weights_arguments(p, PEERS_DIR)
    p.add_argument("--num-requests", type=int, default=32, help="requests in the fixed and mixed workloads")
    p.add_argument("--max-new-tokens", type=int, default=None, help="cap every output length (quick runs)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat-runs", type=int, default=3)
    p.add_argument("--output-json", default=None)
    p.add_argument("--quick-roofline", action="store_true",
                   help="measure the peaks at token sizes: the code runs, the ceiling means nothing (tests)")
    p.add_argument("--plot-only", default=None, help="redraw the PNG of this result file, run nothing")
    return p


def model_paths(engines: list[Engine], args, weights: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """Each engine's converted model, converting what is missing; engines that cannot convert are skipped."""
    hf_dir = make_hf_weights(weights, args.preset, args.seed, args.projection_scale)
    paths, skipped = {}, {}
    for engine in engines:
        python = engine.python(args.peers_dir)
        try:
            if engine.model_format == "hf":
                paths[engine.name] = hf_dir
            elif engine.model_format.startswith("ct2-"):
                paths[engine.name] = ct2_model(
                    weights, hf_dir, python, engine.model_format.removeprefix("ct2-")
                )
            else:
                script = args.peers_dir / engine.venv / "src" / "convert_hf_to_gguf.py"
                paths[engine.name] = gguf_model(weights, hf_dir, python, script)
        except RuntimeError as err:
            skipped[engine.name] = str(err)
    return paths, skipped


def run_round(args, engines, paths, workloads, work_dir, tag, runs, versions, failed, watch, bandwidths) -> None:
    """Every engine once, in order; an engine that fails is reported and left out of later rounds. The read
    bandwidth is measured between engines (the ceiling takes the fastest reading of the whole run), and each run
    keeps the better reading either side of it."""
    before = watch.read()
    for engine in engines:
        if engine.name in failed:
            continue
        print(f"[{tag}] {engine.name} ...", flush=True)
        try:
            out = run_engine(
                engine, paths[engine.name], workloads, args.threads, work_dir, tag, args.peers_dir
            )
        except RuntimeError as err:
            print(f"  FAILED: {err}", flush=True)
            failed[engine.name] = str(err)
            runs.pop(engine.name, None)
            bandwidths.pop(engine.name, None)
            continue
        after = watch.read()
        versions[engine.name] = out["engine"]
        runs.setdefault(engine.name, []).append(out["workloads"])
        bandwidths.setdefault(engine.name, []).append(around(before, after))
        before = after


def roofline_dtype(engine: str, versions: dict[str, dict]) -> str | None:
    """Whose ceiling an engine is measured against: fp32, bf16 or int8 (None: its precision is unknown)."""
    precision = ENGINES[engine].precision
    if precision == "auto":
        precision = {"float32": "fp32", "bfloat16": "bf16"}.get(versions.get(engine, {}).get("dtype"), "")
    return precision if precision in ("fp32", "bf16", "int8") else None


def summarize(args, runs, workloads, versions: dict[str, dict] | None = None,
              bandwidths: dict[str, list[dict[str, float]]] | None = None,
              best_bandwidth: dict[str, float] | None = None) -> dict[str, Any]:
    """Per workload: each engine's median and spread, its greedy agreement with the reference, and its share of
    the roofline: its median over the ceiling at the fastest bandwidth read in the whole run (a reading beside a
    run can fall well below what the run itself met: this machine's read bandwidth swings 30-56 GB/s within
    minutes). The ceilings at the readings beside each run are kept too (run_roofline_tok_s)."""
    results = {}
    reference = runs.get(REFERENCE, next(iter(runs.values()), None))
    bandwidths = bandwidths or {}

    def ceiling(requests, bandwidth=None):
        return roofline(PRESETS[args.preset], requests, args.threads, small=args.quick_roofline, bandwidth=bandwidth)

    for name, requests in workloads.items():
        floors = ceiling(requests, best_bandwidth)
        block: dict[str, Any] = {
            "num_requests": len(requests),
            "useful_output_tokens": sum(r["max_new_tokens"] for r in requests),
            "prompt_tokens": sum(len(r["prompt"]) for r in requests),
            "roofline_tok_s": floors,
            "engines": {},
        }
        for engine, engine_runs in runs.items():
            s = summarize_engine([run[name] for run in engine_runs], requests)
            tokens, expected = engine_runs[0][name]["token_ids"], reference[0][name]["token_ids"]
            s["same_tokens_as_reference"] = agreement(tokens, expected)
            s["matching_prefix_with_reference"] = matching_prefix(tokens, expected)
            s["fraction_of_fp32_roofline"] = s["output_throughput_tok_s"] / floors["fp32_tok_s"]
            own = roofline_dtype(engine, versions or {})
            s["roofline_dtype"] = own
            s["fraction_of_own_roofline"] = s["output_throughput_tok_s"] / floors[f"{own}_tok_s"] if own else None
            s["run_roofline_tok_s"] = [ceiling(requests, b) for b in (bandwidths or {}).get(engine, [])]
            block["engines"][engine] = s
        results[name] = block
    return results


def report(results: dict[str, Any]) -> None:
    for name, block in results.items():
        print(
            f"\n[{name}] {block['num_requests']} requests, {block['useful_output_tokens']} output tokens; "
            "roofline floor " + ", ".join(f"{v:.0f} tok/s {k.removesuffix('_tok_s')}"
                                          for k, v in block["roofline_tok_s"].items())
        )
        for engine, s in block["engines"].items():
            runs = ", ".join(f"{x:.1f}" for x in s["runs_tok_s"])
            print(
                f"  {engine:<15} {s['output_throughput_tok_s']:8.1f} tok/s  {s['ms_per_token']:7.2f} ms/token  "
                f"(runs {runs})  same tokens as {REFERENCE}: {s['same_tokens_as_reference']:.0%} of requests, "
                f"{s['matching_prefix_with_reference']:.0%} before the first difference"
                + ("" if s["exact_output_lengths"] else "  WRONG OUTPUT LENGTHS")
            )


def plot(results: dict[str, Any], out: Path) -> None:
    fig, axes = plots.figure(len(results), width=6.0)
    for ax, (name, block) in zip(axes, results.items()):
        engines = list(block["engines"])
        per_token = name == "batch1"
        key = "runs_ms_per_token" if per_token else "runs_tok_s"
        colors = [
            plots.COLORS["after"] if e.startswith("roseinfer") else plots.COLORS["before"] for e in engines
        ]
        plots.before_after_bars(
            ax,
            engines,
            [block["engines"][e][key] for e in engines],
            "ms per output token (lower is better)" if per_token else "output tokens/s",
            f"{name}: {block['num_requests']} request(s)",
            colors,
        )
        ax.tick_params(axis="x", rotation=60)
        if not per_token:
            ax.axhline(
                block["roofline_tok_s"]["fp32_tok_s"],
                color="black",
                linestyle="--",
                linewidth=0.8,
                label="fp32 roofline floor",
            )
            ax.legend(loc="upper left", fontsize=8)
    plots.save(fig, out)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.plot_only:
        plot(read_json(args.plot_only)["metrics"], Path(args.plot_only).with_suffix(".png"))
        return 0
    engines, skipped = installed(ENGINES, args.engines, args.peers_dir)
    weights = weights_cache(args)
    paths, unconverted = model_paths(engines, args, weights)
    for name, why in unconverted.items():
        print(f"skipping {name}: {why}")
    skipped |= unconverted
    engines = [e for e in engines if e.name in paths]
    all_workloads = build_workloads(
        args.num_requests, args.seed, args.max_new_tokens, prompt_vocab(PRESETS[args.preset])
    )
    workloads = {k: v for k, v in all_workloads.items() if k in args.workload}
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "output_json"}
    config |= cpu_info() | {
        "weights": f"random {args.preset}, seed {args.seed}, projections x{args.projection_scale:g}, HF layout",
        "reference_engine": REFERENCE,
        "greedy": True,
        "ignore_eos": True,
        "bandwidth_readers": list(BANDWIDTH_READERS),
    }
    default_name = "compare_engines" + ("" if args.preset == "gpt2" else f"_{args.preset}")
    out = Path(args.output_json) if args.output_json else results_dir("cpu") / f"{default_name}.json"
    runs: dict[str, list[dict]] = {}
    versions: dict[str, dict] = {}
    failed: dict[str, str] = {}
    bandwidths: dict[str, list[dict[str, float]]] = {}
    watch = BandwidthWatch(args.threads, small=args.quick_roofline)
    with tempfile.TemporaryDirectory(prefix="roseinfer-peers-") as tmp:
        for round_ in range(args.repeat_runs):  # interleaved: every engine once per round
            tag = f"round{round_ + 1}of{args.repeat_runs}"
            run_round(args, engines, paths, workloads, Path(tmp), tag, runs, versions, failed, watch, bandwidths)
            # Written after every round, so a long run that is cut short still leaves its data.
            results = summarize(args, runs, workloads, versions, bandwidths, watch.best())
            config |= {
                "completed_rounds": round_ + 1,
                "engine_versions": versions,
                "skipped": skipped | failed,
                "bandwidth_readings_gb_s": [{k: round(v / 1e9, 2) for k, v in r.items()} for r in watch.readings],
                "run_bandwidth_gb_s": {e: [{k: round(v / 1e9, 2) for k, v in b.items()} for b in runs_]
                                       for e, runs_ in bandwidths.items()},
            }
            write_json(out, make_result("compare_engines", "engines", config, results, "cpu"))
            plot(results, out.with_suffix(".png"))
    report(results)
    print(f"\nwrote {out} and {out.with_suffix('.png')}")
    for name, why in (skipped | failed).items():
        print(f"skipped {name}: {why.splitlines()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
