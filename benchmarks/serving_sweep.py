"""Launch the server, load it at several request rates, plot latency vs throughput.

    python benchmarks/serving_sweep.py --model gpt2 --rates 1 2 4 inf --num-prompts 24 \
        --input-len 128 --output-len 32 [--hf-peer]

Each rate is one run of the load generator (roseinfer.bench.serving) against
the live server; the server is stopped with SIGTERM at the end and must exit
0. With --hf-peer the same sweep also runs against transformers' own
OpenAI-compatible server (`transformers serve`, needs `accelerate`) on the
same weights, with text prompts for both. Writes
results/<device>/serving-sweep.json and .png.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

from roseinfer.bench import plots
from roseinfer.bench.results import make_result, results_dir, write_json
from roseinfer.bench.serving import (
    LoadSetup,
    free_port,
    hf_server_command,
    roseinfer_server_command,
    start_server,
    stop_server,
    sweep,
)


def export_for_hf(model: str, directory: str) -> str:
    """The roseinfer weights (and the GPT-2 tokenizer files) as an HF model directory."""
    from roseinfer import InferenceEngine
    from roseinfer.models.loader import save_hf_directory
    from roseinfer.tokenizer import embedded_bpe_files

    engine = InferenceEngine.from_pretrained(model, num_kv_blocks=16)
    save_hf_directory(directory, engine.model_config, engine.runner.model.state_dict())
    vocab, merges = embedded_bpe_files()
    shutil.copy(vocab, os.path.join(directory, "vocab.json"))
    shutil.copy(merges, os.path.join(directory, "merges.txt"))
    return directory


def run_sweep(label: str, command: list[str], port: int, setup: LoadSetup, rates: list[float]) -> dict:
    server = start_server(command, port, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        setup.base_url = f"http://127.0.0.1:{port}"
        points = sweep(setup, rates)
    finally:
        exit_code = stop_server(server)
    for pt in points:
        print(
            f"[{label}] rate {pt['request_rate']:g}: {pt['output_throughput_tok_s']:.1f} tok/s, "
            f"TTFT p50 {pt['ttft_ms']['p50']:.1f} ms, TPOT p50 {pt['tpot_ms']['p50']:.1f} ms, failed {pt['failed']}"
        )
    print(f"[{label}] server exited with {exit_code} after SIGTERM")
    return {"points": points, "server_exit_code": exit_code}


def plot(results: dict, out) -> None:
    fig, (ax1, ax2) = plots.figure(2)
    for ax, key, label in ((ax1, "ttft_ms", "TTFT p50 (ms)"), (ax2, "tpot_ms", "TPOT p50 (ms)")):
        series = {
            name: ([p["output_throughput_tok_s"] for p in r["points"]], [p[key]["p50"] for p in r["points"]])
            for name, r in results.items()
        }
        plots.curve(ax, series, "output tokens/s", label, f"{label.split()[0]} vs throughput")
    plots.save(fig, out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0, 4.0, float("inf")])
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--server-args", default="", help="extra roseinfer server flags, as one string")
    p.add_argument(
        "--hf-peer", action="store_true", help="also sweep `transformers serve` on the same weights"
    )
    args = p.parse_args(argv)
    prompt_format = "text" if args.hf_peer else "ids"  # transformers serve wants text prompts
    results = {}
    port = free_port()
    command = roseinfer_server_command(
        port, "--model", args.model, "--device", args.device, *args.server_args.split()
    )
    setup = LoadSetup(
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        prompt_format=prompt_format,
    )
    results["roseinfer"] = run_sweep("roseinfer", command, port, setup, list(args.rates))
    if args.hf_peer:
        with tempfile.TemporaryDirectory() as tmp:
            port = free_port()
            model_dir = export_for_hf(args.model, tmp)
            setup = LoadSetup(
                model=model_dir,
                num_prompts=args.num_prompts,
                input_len=args.input_len,
                output_len=args.output_len,
                prompt_format=prompt_format,
                ignore_eos=False,  # transformers serve refuses it; its usage counts the tokens either way
            )
            results["hf_serve"] = run_sweep(
                "hf_serve", hf_server_command(model_dir, port), port, setup, list(args.rates)
            )
    out = results_dir(args.device) / "serving-sweep.json"
    write_json(out, make_result("serving_sweep", "+".join(results), vars(args), results, args.device))
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0 if all(r["server_exit_code"] == 0 for name, r in results.items() if name == "roseinfer") else 1


if __name__ == "__main__":
    raise SystemExit(main())
