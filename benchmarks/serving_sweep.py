"""Launch `python -m roseinfer.server`, load it at several request rates, plot latency vs throughput.

    python benchmarks/serving_sweep.py --model gpt2 --rates 1 2 4 inf --num-prompts 32 \
        --input-len 128 --output-len 32

Each rate is one run of benchmarks/benchmark_serving.py against the live
server; the server is stopped with SIGTERM at the end (it must exit 0).
Writes results/<device>/serving-sweep.json and .png.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from roseinfer.bench import plots
from roseinfer.bench.results import make_result, results_dir, write_json

HERE = Path(__file__).resolve().parent


def start_server(server_args: list[str], port: int, timeout_s: float = 300) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "roseinfer.server",
            "--port",
            str(port),
            "--log-level",
            "warning",
            *server_args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stdout.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the server did not come up")


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--device", default="cpu")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--rates", nargs="+", default=["1", "2", "4", "inf"])
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--label", default="roseinfer")
    p.add_argument("--server-args", default="", help="extra flags for the server, as one string")
    args = p.parse_args(argv)
    server = start_server(
        ["--model", args.model, "--device", args.device, *args.server_args.split()], args.port
    )
    points = []
    try:
        for rate in args.rates:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "run.json"
                subprocess.run(
                    [
                        sys.executable,
                        str(HERE / "benchmark_serving.py"),
                        "--base-url",
                        f"http://127.0.0.1:{args.port}",
                        "--num-prompts",
                        str(args.num_prompts),
                        "--input-len",
                        str(args.input_len),
                        "--output-len",
                        str(args.output_len),
                        "--request-rate",
                        rate,
                        "--ignore-eos",
                        "--no-progress",
                        "--label",
                        args.label,
                        "--device",
                        args.device,
                        "--output-json",
                        str(out),
                    ],
                    check=True,
                )
                m = json.loads(out.read_text())["metrics"]
            points.append(
                {
                    "request_rate": float(rate),
                    **{
                        k: m[k]
                        for k in (
                            "request_throughput_req_s",
                            "output_throughput_tok_s",
                            "ttft_ms",
                            "tpot_ms",
                            "itl_ms",
                            "e2e_latency_ms",
                            "failed",
                        )
                    },
                }
            )
    finally:
        exit_code = stop_server(server)
    print(f"server exited with {exit_code} after SIGTERM")
    fig, (ax1, ax2) = plots.figure(2)
    tput = [pt["output_throughput_tok_s"] for pt in points]
    plots.curve(
        ax1,
        {args.label: (tput, [pt["ttft_ms"]["p50"] for pt in points])},
        "output tokens/s",
        "TTFT p50 (ms)",
        "TTFT vs throughput",
    )
    plots.curve(
        ax2,
        {args.label: (tput, [pt["tpot_ms"]["p50"] for pt in points])},
        "output tokens/s",
        "TPOT p50 (ms)",
        "TPOT vs throughput",
    )
    for ax in (ax1, ax2):
        for pt, x in zip(points, tput):
            ax.annotate(
                f"{pt['request_rate']:g}/s",
                (x, ax.lines[0].get_ydata()[points.index(pt)]),
                fontsize=8,
                xytext=(4, 4),
                textcoords="offset points",
            )
    out = results_dir(args.device) / f"serving-sweep-{args.label}.json"
    config = vars(args) | {"server_exit_code": exit_code}
    write_json(out, make_result("serving_sweep", args.label, config, {"points": points}, args.device))
    plots.save(fig, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0 if exit_code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
