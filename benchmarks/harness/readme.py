"""README sections rendered from results/, so no figure in the README is typed by hand.

A section sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`;
`render_readme()` replaces its body with what RENDERERS[NAME] makes of the
result files. `python benchmarks/update_readme.py` rewrites README.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from roseinfer.bench.results import read_json, repo_root
from roseinfer.bench.stats import median, verdict


def _fmt(x: float) -> str:
    return f"{x:,.1f}" if x < 1000 else f"{x:,.0f}"


def _ms(x: float) -> str:
    """Milliseconds to three figures or so: 89.8, 7.04, 0.348."""
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def _measured_on(results: list[dict]) -> str:
    """The machines and days a table's results come from: figures from different machines must not be compared."""
    # The processor, without the "(N threads)" that device_name adds: a thread count is a run's own setting
    # (notebook 05 measures on one thread), not another machine.
    runs = sorted({(re.sub(r" \(\d+ threads\)$", "", r["device_name"]), r["date"][:10]) for r in results})
    return "\n\n*Measured on " + "; ".join(f"{name}, {day}" for name, day in runs) + ".*" if runs else ""


def batching_section(results: Path) -> str:
    rows, seen = [], []
    for path in sorted(results.glob("*/batching.json")):
        r = read_json(path)
        seen.append(r)
        m = r["metrics"]
        for name in ("static", "continuous"):
            runs = m[name]["runs_tok_s"]
            rows.append(
                f"| {r['device']} | {r['config']['model']} | {name} | {_fmt(m[name]['output_throughput_tok_s'])} "
                f"({_fmt(min(runs))}–{_fmt(max(runs))}) | {m[name]['steps']} | {m[name]['wasted_fraction']:.0%} |"
            )
        rows.append(f"| | | **continuous / static** | **{m['speedup']:.2f}×** | | |")
    if not rows:
        return "_no results yet: run the command above_"
    header = (
        "| device | model | variant | output tok/s, median (min–max) | steps | wasted rows |\n"
        "|---|---|---|---|---|---|"
    )
    return header + "\n" + "\n".join(rows) + _measured_on(seen)


def gpu_check_section(results: Path) -> str:
    """benchmarks/gpu_check.py on each GPU measured: same tokens as the CPU, then a decode step's time."""
    out, seen = [], []
    for path in sorted(results.glob("*/gpu_check.json")):
        r = read_json(path)
        if r["device"] in ("cpu", "virtual") or r["config"].get("tiny"):
            continue
        seen.append(r)
        m = r["metrics"]
        same = [
            f"{model} {sum(c['equal_to_cpu'] for n, c in checks.items() if n.startswith('cuda_'))}"
            f"/{sum(n.startswith('cuda_') for n in checks)}"
            for model, checks in m.get("tokens", {}).items()
        ]
        bf16 = all(c["bf16_graph_equals_eager"]["equal"] for c in m.get("tokens", {}).values())
        out.append(f"**{r['device_name']}** (torch {r['torch_version']}). Greedy tokens in fp32 on CUDA (Triton with "
                   f"CUDA graphs, Triton eager, torch eager) equal to the fp32 CPU engine's, variants equal per model: "
                   f"{', '.join(same)}; bf16 graph replay {'equals' if bf16 else 'differs from'} bf16 eager.")
        steps = m.get("steps", {}).get("rows", [])
        if steps:
            by = {(s["variant"], s["batch"], s["context"]): s for s in steps}
            out.append("\n| gpt2 bf16 decode step (ms) | torch eager | Triton eager | Triton + CUDA graphs | floor |"
                       "\n|---|---|---|---|---|")
            ends = (min(s["context"] for s in steps), max(s["context"] for s in steps))  # the shortest and longest
            for batch, context in sorted({(s["batch"], s["context"]) for s in steps if s["context"] in ends}):
                cells = [by.get((v, batch, context)) for v in ("torch_eager", "triton_eager", "triton_graphs")]
                out.append(f"| batch {batch}, context {context} | "
                           + " | ".join(f"{c['step_ms']:.2f}" if c else "—" for c in cells)
                           + f" | {next(c for c in cells if c)['floor_ms']:.3f} |")
        if "offline" in m:
            off = m["offline"]["runs"]
            out.append(f"\nOffline, 128 prompts × 256 tokens → 64 new (gpt2 bf16): {_fmt(m['offline']['output_tok_s'])} "
                       f"output tok/s ({_fmt(min(off))}–{_fmt(max(off))}).")
    if not out:
        return "_no GPU run committed yet: on a GPU, run the command above_"
    return "\n".join(out) + _measured_on(seen)


def compare_hf_section(results: Path) -> str:
    rows, seen = [], []
    for path in sorted(results.glob("*/compare_hf.json")):
        r = read_json(path)
        seen.append(r)
        systems = [
            s for s in ("roseinfer", "hf_generate", "hf_generate_batch") if s in r["config"]["systems"]
        ]
        for workload, block in r["metrics"].items():
            cells = []
            for s in systems:
                runs = block[s]["runs_tok_s"]
                ratio = "" if s == "roseinfer" else f" → **{block[f'roseinfer_over_{s}']:.2f}×**"
                share = block[s].get("fraction_of_roofline")
                ceiling = f"; {share:.0%} of the roofline, {_fmt(block['roofline_tok_s'])}" if share else ""
                cells.append(
                    f"{_fmt(block[s]['output_throughput_tok_s'])} ({_fmt(min(runs))}–{_fmt(max(runs))}){ratio}{ceiling}"
                )
            rows.append(
                f"| {r['device']} | {r['config']['model']} | {workload} | " + " | ".join(cells) + " |"
            )
    if not rows:
        return "_no results yet: run the command above_"
    return (
        "| device | model | workload | roseinfer tok/s | HF `generate` tok/s → roseinfer ÷ HF | "
        "HF `generate_batch` tok/s → roseinfer ÷ HF |\n|---|---|---|---|---|---|\n" + "\n".join(rows)
        + _measured_on(seen)
    )


def _engine_row(m: dict, engine: str, versions: dict[str, str]) -> str:
    """One engine: tok/s on fixed and mixed, ms/token at batch 1, greedy agreement, roofline share."""
    cells = [engine, ", ".join(f"{k} {v}" for k, v in versions.items())]
    for workload, key, runs_key in (
        ("fixed", "output_throughput_tok_s", "runs_tok_s"),
        ("mixed", "output_throughput_tok_s", "runs_tok_s"),
        ("batch1", "ms_per_token", "runs_ms_per_token"),
    ):
        s = m.get(workload, {}).get("engines", {}).get(engine)
        cells.append(f"{_fmt(s[key])} ({_fmt(min(s[runs_key]))}–{_fmt(max(s[runs_key]))})" if s else "—")
    blocks = [b["engines"][engine] for b in m.values() if engine in b["engines"]]
    cells.append(" / ".join(f"{s['same_tokens_as_reference']:.0%}" for s in blocks))
    shares = [b.get("fraction_of_own_roofline") for b in blocks]
    own = next((b.get("roofline_dtype") for b in blocks if b.get("roofline_dtype")), None)
    cells.append(f"{' / '.join(f'{x:.0%}' for x in shares)} of {own}" if own and None not in shares else "—")
    return "| " + " | ".join(cells) + " |"


def _bandwidth_range(readings: list[dict[str, float]]) -> str:
    fp32 = [r["fp32"] for r in readings]
    return f"{min(fp32):.0f}–{max(fp32):.0f}"


def compare_engines_section(results: Path) -> str:
    parts = []
    for path in sorted(results.glob("*/compare_engines*.json")):  # GPT-2, and other presets beside it
        r = read_json(path)
        m, c = r["metrics"], r["config"]
        flags = ", ".join(f for f, present in c["cpu_flags"].items() if present)
        held = c.get("emulated_class")
        where = f"**`{path.parent.name}/`**: " + (f"held to the {held} class (roseinfer.cpu_class) on " if held else "")
        parts.append(
            f"{where}{r['device_name']} [{flags}], {c['threads']} threads, {c['weights']}; median of "
            f"{c['completed_rounds']} interleaved runs (min–max); {r['date'][:10]}, commit {r['git_commit']}."
        )
        engines = dict.fromkeys(e for block in m.values() for e in block["engines"])
        rows = [_engine_row(m, e, c["engine_versions"].get(e, {})) for e in engines]
        parts.append(
            "| engine | versions | fixed tok/s | mixed tok/s | batch 1 ms/token | same greedy tokens as "
            f"{c['reference_engine']} ({' / '.join(m)}) | share of its dtype's roofline ({' / '.join(m)}) |\n"
            "|---|---|---|---|---|---|---|\n" + "\n".join(rows)
        )
        # The ceilings of the dtypes some engine ran in (under the AVX2 class none runs bf16: its ceiling is moot).
        used = {s.get("roofline_dtype") for b in m.values() for s in b["engines"].values()}
        floors = "; ".join(
            f"{w} " + ", ".join(f"{_fmt(v)} {k.removesuffix('_tok_s')}" for k, v in b["roofline_tok_s"].items()
                                if k.removesuffix("_tok_s") in used)
            for w, b in m.items()
        )
        # Runs before roseinfer's kernel joined the bandwidth readers say nothing of them: they had two.
        readers = c.get("bandwidth_readers") or ["a sum over 1 GiB", "a one-row packed projection through 512 MB of "
                                                 "weights"]
        readers = "the fastest of " + ", ".join(readers[:-1]) + " and " + readers[-1] if len(readers) > 2 \
            else "the faster of " + " and ".join(readers)
        parts.append(
            f"Roofline ceiling in output tok/s, the workload run by an ideal engine at the matmul and "
            f"memory-read peaks measured in the same run (`bench/roofline.py`: the best of `torch.mm` and "
            f"oneDNN's packed projection for FLOP/s; for read bandwidth {readers}; int8: one byte a weight, fp32 K/V, "
            f"and the int8 products of `torch._int_mm` or roseinfer's int8 kernel, the faster): {floors}. Each "
            f"engine is measured against the ceiling of its own dtype"
            + (f", at the fastest of {len(c['bandwidth_readings_gb_s'])} read-bandwidth readings taken between "
               f"engine runs ({_bandwidth_range(c['bandwidth_readings_gb_s'])} GB/s fp32: this machine's bandwidth "
               f"swings within minutes, so a reading beside a run can sit far below what the run met)."
               if c.get("bandwidth_readings_gb_s") else ", at a bandwidth measured once in the run.")
        )
        parts.extend(f"Not run: {e}: {why.splitlines()[0]}" for e, why in c["skipped"].items())
    return "\n\n".join(parts) or "_no results yet: run the command above_"


def _served_row(name: str, b: dict, versions: dict[str, str]) -> str:
    runs = b["runs_output_throughput_tok_s"]
    version = f"vLLM {versions['vllm']}" if name.startswith("vllm") else f"roseinfer {versions['roseinfer']}"
    ready = ", ".join(
        f"{s:.1f}" + (f" ({how})" if how else "") for s, how in zip(b["runs_ready_s"], b["runs_compile"])
    )
    first = "yes" if b["first_chunk_carries_token"] else "**no**"
    return (
        f"| {name} | {version}, {b['server']['dtype']} | {_fmt(b['output_throughput_tok_s'])} "
        f"({_fmt(min(runs))}–{_fmt(max(runs))}) | {b['ttft_ms']['median']:.0f} / {b['ttft_ms']['p99']:.0f} | "
        f"{b['tpot_ms']['median']:.1f} | {b['itl_ms']['median']:.1f} | {first} ({b['responses_seen']} seen) | "
        f"{b['extra_chunks']} | {ready} |"
    )


def compare_served_section(results: Path) -> str:
    parts = []
    for path in sorted(results.glob("*/compare_served.json")):
        r = read_json(path)
        m, c = r["metrics"], r["config"]
        flags = ", ".join(f for f, present in c["cpu_flags"].items() if present)
        client = f"`{c['client']}`" + (
            f" (vLLM {c['versions']['vllm']})" if c["client"].startswith("vllm") else ""
        )
        parts.append(
            f"{r['device_name']} [{flags}], {c['threads']} threads, {c['weights']}; load: {client} "
            f"--backend {c['backend']}, {c['num_prompts']} prompts of {c['input_len']} tokens → "
            f"{c['output_len']} new tokens, all at once, EOS ignored; median of {c['completed_rounds']} "
            f"interleaved rounds (min–max), each on a freshly started server; {r['date'][:10]}, "
            f"commit {r['git_commit']}."
        )
        rows = [_served_row(name, b, c["versions"]) for name, b in m["engines"].items()]
        parts.append(
            "| server | version, dtype | output tok/s | TTFT median / p99 (ms) | TPOT median (ms) | "
            "ITL median (ms) | first chunk carries a token (responses seen) | chunks beyond one per token | "
            "ready in (s), per round |\n|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows)
        )
        ratios = m["roseinfer_over_vllm_output_tok_s"]
        if ratios:
            parts.append(
                "roseinfer ÷ vLLM-CPU, output tok/s: "
                + ", ".join(f"{dtype} **{x:.2f}×**" for dtype, x in ratios.items())
                + "."
            )
        parts.extend(f"Not run: {e}: {why.splitlines()[0]}" for e, why in c["skipped"].items())
    return "\n\n".join(parts) or "_no results yet: run the command above_"


def served_levers_section(results: Path) -> str:
    """The two changes behind the served figures, from benchmark_sampler and benchmark_worker_thread."""
    parts = []
    for path in sorted(results.glob("*/sampler.json")):
        r = read_json(path)
        rows = [
            f"{x['rows']} rows: {_fmt(x['exponential_race_us'])} µs → {_fmt(x['inverse_cdf_us'])} µs"
            for x in r["metrics"]["rows"]
        ]
        at16 = next((x for x in r["metrics"]["rows"] if x["rows"] == 16), r["metrics"]["rows"][0])
        parts.append(
            f"*Drawing sampled tokens* ({r['device_name']}, {r['date'][:10]}, `python benchmarks/benchmark_sampler.py`): "
            f"an exponential race draws one random number per vocabulary entry, {at16['rows']} × 50,257 = "
            f"{at16['rows'] * 50257:,} of them at {at16['race_ns_per_draw']:.0f} ns each for {at16['rows']} rows; "
            f"the inverse-CDF lookup draws one per row. Medians of interleaved runs: " + "; ".join(rows) + "."
        )
    for path in sorted(results.glob("*/worker_thread.json")):
        r = read_json(path)
        rows = [
            f"batch {x['batch']}: {x['main_thread_ms']:.1f} ms in the main thread, {x['worker_thread_ms']:.1f} in the "
            f"worker ({x['worker_over_main']:.2f}×), {x['worker_thread_released_ms']:.1f} once the main thread's pool "
            f"is freed ({x['released_over_main']:.2f}×)"
            for x in r["metrics"]["rows"]
        ]
        c = r["config"]
        parts.append(
            f"*Where the step runs* ({r['device_name']}, {c['model']} {c['dtype']}, {r['date'][:10]}, "
            f"`python benchmarks/benchmark_worker_thread.py`, medians of {c['rounds']} interleaved fresh processes): "
            + "; ".join(rows)
            + "."
        )
    return "\n\n".join(parts) or "_no results yet: run the commands above_"


def serving_section(results: Path) -> str:
    rows, seen = [], []
    for path in sorted(results.glob("*/serving-sweep.json")):
        r = read_json(path)
        seen.append(r)
        for name, block in r["metrics"].items():
            for p in block["points"]:
                rate = "all at once" if p["request_rate"] == float("inf") else f"{p['request_rate']:g}/s"
                rows.append(
                    f"| {r['device']} | {name} | {rate} | {_fmt(p['output_throughput_tok_s'])} | "
                    f"{p['ttft_ms']['p50']:.0f} | {p['tpot_ms']['p50']:.1f} | {p['failed']} |"
                )
    if not rows:
        return "_no results yet: run the command above_"
    return (
        "| device | server | request rate | output tok/s | TTFT p50 (ms) | TPOT p50 (ms) | failed |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + _measured_on(seen)
    )


def _noise(before, after) -> str:
    """What the notebooks' rank test says of the runs, when it cannot call a difference."""
    return (
        ""
        if verdict("", before, after, "", higher_is_better=True).significant
        else " (no difference the rank test can show)"
    )


def _headline_nb01_kv_cache(m: dict) -> str:
    return f"one step at {m['contexts'][-1]} tokens of context: {m['before_ms'][-1]:.1f} → {m['after_ms'][-1]:.1f} ms"


def _headline_nb02_batching(m: dict) -> str:
    return (
        f"{m['batch_sizes'][-1]} requests: {_fmt(m['before_tok_s'][-1])} → {_fmt(m['after_tok_s'][-1])} "
        "output tok/s"
    )


def _headline_nb03_continuous_batching(m: dict) -> str:
    return (
        f"queue wait p50 {_fmt(median(m['before_queue_wait_p50_ms']))} → "
        f"{_fmt(median(m['after_queue_wait_p50_ms']))} ms; "
        f"{m['wasted_fraction']:.0%} → {m['continuous_wasted_fraction']:.0%} wasted rows (measured); "
        f"{_fmt(median(m['before_runs_tok_s']))} → {_fmt(median(m['after_runs_tok_s']))} output tok/s"
    )


def _headline_nb04_scheduler_manager(m: dict) -> str:
    return (
        f"{m['concurrency'][-1]} streams: TTFT p50 {m['before_ttft_p50_ms'][-1]:.0f} → "
        f"{m['after_ttft_p50_ms'][-1]:.0f} ms, {_fmt(m['before_tok_s'][-1])} → {_fmt(m['after_tok_s'][-1])} tok/s"
    )


def _headline_nb05_worker_wakeup_event(m: dict) -> str:
    idle = m["idle"]
    return (
        f"TTFT p50 at light load {median(m['before_ttft_p50_ms']):.2f} → {median(m['after_ttft_p50_ms']):.2f} ms; "
        f"idle wake-ups {idle['polling']['wakeups_per_s']:.0f} → {idle['current']['wakeups_per_s']:.0f} /s"
    )


def _headline_nb06_scheduler_accessors(m: dict) -> str:
    return (
        f"streaming {_fmt(median(m['before_tok_s']))} → {_fmt(median(m['after_tok_s']))} tok/s"
        f"{_noise(m['before_tok_s'], m['after_tok_s'])}"
    )


def _headline_nb07_batched_worker_lookups(m: dict) -> str:
    return (
        f"batch {m['batch']}: {m['batch']} → 1 lock acquisitions per step; the worker's lookup "
        f"{m['before_lookup_us']:.0f} → {m['after_lookup_us']:.0f} µs of a {m['after_tpot_ms']:.1f} ms step; "
        f"TPOT p50 {m['before_tpot_ms']:.2f} → {m['after_tpot_ms']:.2f} ms"
        f"{_noise(m['before_tpot_runs_ms'], m['after_tpot_runs_ms'])}"
    )


def _headline_nb08_paged_attention(m: dict) -> str:
    big = max(m["rows"], key=lambda r: r["batch"] * r["context"])
    return (
        f"one layer's decode attention at batch {big['batch']} × {big['context']}: "
        f"{_ms(median(big['before_ms']))} → {_ms(median(big['after_ms']))} ms ({m['after']}; "
        f"the gather copied {big['gather_mb']:.0f} MiB)"
        + ("" if m["gpu_reference"] else "; the Triton kernel's GPU timing: not yet measured")
    )


def _headline_nb09_one_call(m: dict) -> str:
    parts = []
    for model, t in m["timings"].items():
        loop, one = median(t["loop_x_floor"]), median(t["one_call_x_floor"])
        parts.append(f"{model} {loop:.2f} → {one:.2f}× its floor ({median(t['loop_ms']):.1f} → "
                     f"{median(t['one_call_ms']):.1f} ms)")
    return "decode step at batch 1, a call per operation → one C call: " + "; ".join(parts)


def _headline_nb09_cuda_graphs(m: dict) -> str:
    if m["rows"]:
        eager = {r["batch"]: r["step_ms"] for r in m["rows"] if r["variant"] == "triton_eager"}
        graph = {r["batch"]: r["step_ms"] for r in m["rows"] if r["variant"] == "triton_graphs"}
        small, big = min(set(eager) & set(graph)), max(set(eager) & set(graph))
        return (f"gpt2 bf16 decode step, eager → CUDA graph replay: batch {small} {eager[small]:.2f} → "
                f"{graph[small]:.2f} ms, batch {big} {eager[big]:.2f} → {graph[big]:.2f} ms")
    return None  # no GPU rows: the CPU's row is nb09_one_call's


def _headline_nb10_prefix_cache(m: dict) -> str:
    before, after = m["variants"]
    head = f"{m['headline_load']:g}"
    b, a = m["stream"][before][head]["ttft_p50_ms"], m["stream"][after][head]["ttft_p50_ms"]
    return (
        f"at {head}× the lone-prefill rate, 1 / a lone no-cache prefill ({m['headline_load'] * m['capacity_req_s']:.1f} req/s"
        + (f", {m['headline_load'] * m['capacity_req_s'] / m['measured_capacity_req_s']:.2f} of its measured capacity"
           if "measured_capacity_req_s" in m else "")
        + "): TTFT p50 "
        f"{median(b):.0f} → {median(a):.0f} ms{_noise(b, a)}; a request alone "
        f"{median(m['alone_ttft_ms'][before]):.0f} → {median(m['alone_ttft_ms'][after]):.0f} ms"
    )


def _headline_nb13_final_server(m: dict) -> str:
    c = str(m["concurrency"][-1])
    tok_s = {n: median([r["output_throughput_tok_s"] for r in m["sweep"][n][c]]) for n in m["servers"]}
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    dtypes = {n: short.get(d, d) for n, d in m.get("dtypes", dict.fromkeys(m["servers"], m.get("dtype"))).items()}
    if "transformers serve" in tok_s:
        return (
            f"{c} in flight, EOS a stop for both: transformers serve ({dtypes['transformers serve']}) "
            f"{_fmt(tok_s['transformers serve'])} → roseinfer ({dtypes['roseinfer']}) {_fmt(tok_s['roseinfer'])} "
            "output tok/s"
        )
    return f"{c} in flight, {dtypes['roseinfer']}: {_fmt(tok_s['roseinfer'])} output tok/s"


def _headline_nb11_bf16_cpu(m: dict) -> str:
    best = m.get("engine_bf16", m["variants"][-1])  # the bf16 path the engine takes on that CPU
    runs = {v: {int(b): median(r) for b, r in m["runs"][v].items()} for v in m["variants"]}
    others = [v for v in m["variants"] if v not in ("fp32", best)]
    steps = "; ".join(
        f"batch {b}: fp32 {runs['fp32'][b]:.1f} → {best} {runs[best][b]:.1f} ms"
        + "".join(f" ({v} {runs[v][b]:.1f})" for v in others)
        for b in (min(runs["fp32"]), max(runs["fp32"]))
    )
    return f"gpt2 decode step, {steps}"


def _headline_nb14_scale_out(m: dict) -> str:
    t = {setup: {k: median(v) for k, v in m[setup].items() if k != "replica_hit_rates"} for setup in m}
    rr, ca = m["round_robin"], m["cache_aware"]
    return (
        "two 1-thread replicas behind SMG, a few shared system prompts: round_robin "
        f"{_fmt(t['round_robin']['tok_s'])} → cache_aware {_fmt(t['cache_aware']['tok_s'])} output tok/s"
        f"{_noise(rr['tok_s'], ca['tok_s'])}, prompt tokens found cached {t['round_robin']['hit_rate']:.2f} → "
        f"{t['cache_aware']['hit_rate']:.2f}; one 2-thread replica {_fmt(t['one replica']['tok_s'])} tok/s"
    )


def _headline_nb12_gqa(m: dict) -> str:
    mha, gqa = list(m["tok_s"])
    return (
        f"SmolLM2-135M shape, same KV memory: {m['kv_tokens'][mha]} → {m['kv_tokens'][gqa]} tokens, "
        f"{m['most_in_a_step'][mha]} → {m['most_in_a_step'][gqa]} sequences a step, "
        f"{_fmt(median(m['tok_s'][mha]))} → {_fmt(median(m['tok_s'][gqa]))} output tok/s"
        f"{_noise(m['tok_s'][mha], m['tok_s'][gqa])}; one layer's decode attention "
        f"{median(m['attention_ms'][mha]):.2f} → {median(m['attention_ms'][gqa]):.2f} ms"
    )


HEADLINES = {  # the one before -> after figure each notebook is about
    "nb01_kv_cache": _headline_nb01_kv_cache,
    "nb02_batching": _headline_nb02_batching,
    "nb03_continuous_batching": _headline_nb03_continuous_batching,
    "nb04_scheduler_manager": _headline_nb04_scheduler_manager,
    "nb05_worker_wakeup_event": _headline_nb05_worker_wakeup_event,
    "nb06_scheduler_accessors": _headline_nb06_scheduler_accessors,
    "nb07_batched_worker_lookups": _headline_nb07_batched_worker_lookups,
    "nb08_paged_attention": _headline_nb08_paged_attention,
    "nb09_one_call": _headline_nb09_one_call,
    "nb09_cuda_graphs": _headline_nb09_cuda_graphs,
    "nb10_prefix_cache": _headline_nb10_prefix_cache,
    "nb13_final_server": _headline_nb13_final_server,
    "nb11_bf16_cpu": _headline_nb11_bf16_cpu,
    "nb14_scale_out": _headline_nb14_scale_out,
    "nb12_gqa": _headline_nb12_gqa,
}


def _headline(name: str, m: dict) -> str:
    """The one before -> after figure a notebook is about ("" for a notebook without one)."""
    return HEADLINES[name](m) if name in HEADLINES else ""


NOTEBOOKS = [
    ("00_quickstart", None, "load, generate, match HF token for token, serve, query with `openai`"),
    ("01_kv_cache", "nb01_kv_cache", "recompute the prefix → KV cache"),
    ("02_batching", "nb02_batching", "one request at a time → a static batch"),
    (
        "03_continuous_batching",
        "nb03_continuous_batching",
        "static batches → continuous batching (arrivals over time)",
    ),
    ("04_scheduler_manager", "nb04_scheduler_manager", "a lock around each request → the SchedulerManager"),
    (
        "05_worker_wakeup_event",
        "nb05_worker_wakeup_event",
        "a polling worker → a wake-up event (cleared under the lock)",
    ),
    ("06_scheduler_accessors", "nb06_scheduler_accessors", "private scheduler state → public accessors"),
    ("07_batched_worker_lookups", "nb07_batched_worker_lookups", "a lock per token → a lock per step"),
    (
        "08_paged_attention",
        "nb08_paged_attention",
        "gather + SDPA → a kernel reading the block table (C on CPU, Triton on GPU)",
    ),
    (
        "09_cuda_graphs",
        ("nb09_one_call", "nb09_cuda_graphs"),
        "a call per operation → one C call per decode step (CPU); eager → CUDA graph replay (GPU)",
    ),
    ("10_prefix_cache", "nb10_prefix_cache", "recompute shared prefixes → the prefix cache"),
    ("11_bf16_cpu", "nb11_bf16_cpu", "fp32 projections → bf16: roseinfer's kernel for AVX512-BF16, oneDNN's where the CPU has AMX"),
    ("12_gqa", "nb12_gqa", "multi-head → grouped-query attention (the Llama family): 3 KV heads for 9 query heads"),
    (
        "13_final_server",
        "nb13_final_server",
        "`python -m roseinfer.server` under load, next to `transformers serve` (and vLLM-CPU's committed run)",
    ),
    ("14_scale_out", "nb14_scale_out", "one replica → two behind the SMG gateway; round_robin → cache_aware routing"),
]


def notebooks_section(results: Path) -> str:
    rows, seen = [], []
    for notebook, result, topic in NOTEBOOKS:
        figures = []
        names = (result,) if isinstance(result, str) else result or ()  # 09 saves one name on a CPU, one on a GPU
        for path in sorted(p for name in names for p in results.glob(f"*/{name}.json")):
            r = read_json(path)
            headline = _headline(path.stem, r["metrics"])
            if headline:
                figures.append(f"{r['device']}: {headline}")
                seen.append(r)
        rows.append(f"| [{notebook}](notebooks/{notebook}.ipynb) | {topic} | {'<br>'.join(figures) or '—'} |")
    return ("| notebook | increment | before → after (from `results/`) |\n|---|---|---|\n" + "\n".join(rows)
            + _measured_on(seen))


RENDERERS: dict[str, Callable[[Path], str]] = {
    "batching": batching_section,
    "compare_engines": compare_engines_section,
    "compare_served": compare_served_section,
    "served_levers": served_levers_section,
    "compare_hf": compare_hf_section,
    "gpu_check": gpu_check_section,
    "notebooks": notebooks_section,
    "serving": serving_section,
}


def render_readme(text: str, results: Path | None = None) -> str:
    results = results or repo_root() / "results"
    for name, render in RENDERERS.items():
        pattern = re.compile(rf"(<!-- results:{name} -->\n).*?(<!-- /results:{name} -->)", re.S)
        text = pattern.sub(lambda m, r=render: m.group(1) + r(results) + "\n" + m.group(2), text)
    return text
