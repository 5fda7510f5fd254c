"""The CUDA engine, checked and timed in one run (needs a GPU).

    python benchmarks/gpu_check.py                      # everything, writes results/<gpu>/gpu_check.json + .png
    python benchmarks/gpu_check.py --tiny               # the same code paths at CI sizes, to results/tiny/

1. Tokens: greedy tokens on CUDA (fp32; Triton kernels, with and without CUDA
   graphs, and the torch reference) equal the CPU reference in fp32, for
   gpt2-tiny, gpt2, llama-tiny and smollm2-135m (grouped-query attention);
   bf16 graph replay equals bf16 eager.
2. Decode step time vs batch size and context length: Triton + CUDA graphs,
   Triton eager, torch reference eager (a real step: model, sampling, the
   host sync), with the roofline floor of each step.
3. Offline throughput: 128 prompts x 256 tokens -> 64 new tokens, gpt2, bf16.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from roseinfer import InferenceEngine, SamplingParams
from roseinfer.bench import plots
from roseinfer.bench.decode_step import time_decode_step
from roseinfer.bench.results import make_result, results_dir, results_root, write_json
from roseinfer.bench.roofline import decode_step_cost, measure_peaks
from roseinfer.engine.block_manager import blocks_for


def token_checks(models: list[str], new_tokens: int, num_prompts: int = 8, max_prompt_len: int = 60) -> dict:
    params = SamplingParams(max_new_tokens=new_tokens, stop_on_eos=False)
    out = {}
    for model in models:
        # the oracle: this host's CPU engine in fp32 (a CPU's default dtype can be bf16)
        reference = InferenceEngine.from_pretrained(model, dtype="float32")
        rng = random.Random(0)  # the same prompts for every model, drawn inside its vocabulary
        vocab = reference.model_config.vocab_size
        prompts = [
            [rng.randrange(vocab) for _ in range(rng.randint(4, max_prompt_len))] for _ in range(num_prompts)
        ]
        cpu = [o.token_ids for o in reference.generate(prompts, params)]
        del reference
        checks = {}
        for name, options in {
            "cuda_fp32_triton_graphs": dict(dtype="float32", attention_backend="triton", cuda_graph=True),
            "cuda_fp32_triton_eager": dict(dtype="float32", attention_backend="triton", cuda_graph=False),
            "cuda_fp32_torch": dict(dtype="float32", attention_backend="torch", cuda_graph=False),
        }.items():
            engine = InferenceEngine.from_pretrained(model, device="cuda", max_batch_size=16, **options)
            got = [o.token_ids for o in engine.generate(prompts, params)]
            checks[name] = {"equal_to_cpu": got == cpu, "rows_equal": sum(a == b for a, b in zip(got, cpu))}
            del engine
            torch.cuda.empty_cache()
        graphs = InferenceEngine.from_pretrained(
            model, device="cuda", dtype="bfloat16", cuda_graph=True, max_batch_size=16
        )
        eager = InferenceEngine.from_pretrained(
            model, device="cuda", dtype="bfloat16", cuda_graph=False, max_batch_size=16
        )
        g = [o.token_ids for o in graphs.generate(prompts, params)]
        e = [o.token_ids for o in eager.generate(prompts, params)]
        checks["bf16_graph_equals_eager"] = {"equal": g == e, "rows_equal": sum(a == b for a, b in zip(g, e))}
        out[model] = checks
        print(model, checks)
        del graphs, eager
        torch.cuda.empty_cache()
    return out


def step_timings(model: str, batches: list[int], contexts: list[int], repeats: int, small: bool) -> dict:
    peaks = measure_peaks("cuda", torch.bfloat16, small=small)
    variants = {
        "triton_graphs": dict(attention_backend="triton", cuda_graph=True),
        "triton_eager": dict(attention_backend="triton", cuda_graph=False),
        "torch_eager": dict(attention_backend="torch", cuda_graph=False),
    }
    rows = []
    for name, options in variants.items():
        engine = InferenceEngine.from_pretrained(
            model,
            device="cuda",
            dtype="bfloat16",
            max_batch_size=max(batches),
            num_kv_blocks=max(batches) * blocks_for(max(contexts) + 1, 16) + 16,
            **options,
        )
        for context in contexts:
            for batch in batches:
                ms = time_decode_step(engine, batch, context, repeats)
                floor_ms = (
                    decode_step_cost(engine.model_config, [context + 1] * batch, 2).floor_s(peaks) * 1000
                )
                rows.append(
                    {"variant": name, "batch": batch, "context": context, "step_ms": ms, "floor_ms": floor_ms}
                )
                print(
                    f"{name:<14} batch {batch:>4} context {context:>5}: {ms:7.3f} ms (floor {floor_ms:.3f} ms)"
                )
        del engine
        torch.cuda.empty_cache()
    return {"rows": rows, "peaks": peaks}


def offline_throughput(model: str, shape: tuple[int, int, int], repeats: int) -> dict:
    """Output tokens/s of `shape` = (prompts, prompt tokens, new tokens) in one generate call."""
    num_prompts, prompt_len, new_tokens = shape
    engine = InferenceEngine.from_pretrained(
        model, device="cuda", dtype="bfloat16", max_batch_size=num_prompts, max_num_batched_tokens=8192
    )
    rng = random.Random(0)
    prompts = [[rng.randrange(50000) for _ in range(prompt_len)] for _ in range(num_prompts)]
    params = SamplingParams(max_new_tokens=new_tokens, stop_on_eos=False)
    engine.generate(prompts[:8], params)  # warm-up
    runs = []
    for _ in range(repeats):
        engine.block_manager.reset_prefix_cache()
        torch.cuda.synchronize()
        start = time.perf_counter()
        outs = engine.generate(prompts, params, enable_prefix_cache=False)
        runs.append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start))
    print(
        f"offline {num_prompts} x {prompt_len} -> {new_tokens}: {statistics.median(runs):,.0f} output tok/s"
    )
    return {"output_tok_s": statistics.median(runs), "runs": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["gpt2-tiny", "gpt2", "llama-tiny", "smollm2-135m"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128])
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 512, 1000])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--skip", nargs="*", default=[], choices=["tokens", "steps", "offline"])
    p.add_argument(
        "--tiny",
        action="store_true",
        help="CI sizes: gpt2-tiny, 2 batch sizes, one short context, 1 repeat; the numbers mean nothing",
    )
    args = p.parse_args(argv)
    if args.tiny:
        args.models, args.batches, args.contexts, args.repeats = ["gpt2-tiny"], [1, 2], [8], 1
    if not torch.cuda.is_available():
        raise SystemExit("gpu_check.py needs a CUDA device")
    metrics = {}
    step_model = "gpt2-tiny" if args.tiny else "gpt2"
    # --tiny numbers go under results/tiny/: they must never replace a real GPU run's
    out = results_dir("cuda", results_root() / "tiny" if args.tiny else None) / "gpu_check.json"

    def save() -> None:  # after every stage: a run cut short keeps what it measured
        write_json(out, make_result("gpu_check", "cuda-engine", vars(args), metrics, "cuda"))

    if "tokens" not in args.skip:
        metrics["tokens"] = token_checks(args.models, *((2, 3, 8) if args.tiny else (24, 8, 60)))
        save()
    if "steps" not in args.skip:
        metrics["steps"] = step_timings(
            step_model, args.batches, args.contexts, args.repeats, small=args.tiny
        )
        save()
    if "offline" not in args.skip:
        shape = (4, 8, 3) if args.tiny else (128, 256, 64)
        metrics["offline"] = offline_throughput(step_model, shape, 1 if args.tiny else 3)
        save()
    if "steps" in metrics:
        rows = metrics["steps"]["rows"]
        fig, axes = plots.figure(2)
        context = 256 if 256 in args.contexts else args.contexts[0]
        series = {
            v: (
                [r["batch"] for r in rows if r["variant"] == v and r["context"] == context],
                [r["step_ms"] for r in rows if r["variant"] == v and r["context"] == context],
            )
            for v in ("torch_eager", "triton_eager", "triton_graphs")
        }
        series["roofline floor"] = (
            series["triton_graphs"][0],
            [r["floor_ms"] for r in rows if r["variant"] == "triton_graphs" and r["context"] == context],
        )
        plots.curve(
            axes[0],
            series,
            "batch size",
            "decode step (ms)",
            f"{step_model} bf16, context {context}",
            logx=True,
        )
        batch = 64 if 64 in args.batches else args.batches[-1]
        series = {
            v: (
                [r["context"] for r in rows if r["variant"] == v and r["batch"] == batch],
                [r["step_ms"] for r in rows if r["variant"] == v and r["batch"] == batch],
            )
            for v in ("torch_eager", "triton_eager", "triton_graphs")
        }
        plots.curve(
            axes[1], series, "context length", "decode step (ms)", f"{step_model} bf16, batch {batch}"
        )
        plots.save(fig, out.with_suffix(".png"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
