"""One replica against two behind SMG, round-robin against cache-aware routing (notebook 14,
benchmarks/benchmark_cluster.py).

The workload is what a deployment sees: a few long system prompts, each shared by many users, each user
asking a short question. Every round uses new system prompts (nothing cached carries over from the last
round) and runs the same requests through each setup in turn, interleaved:

- "one replica": one server on all the cores, called directly;
- "round_robin" and "cache_aware": two servers, the cores split between them, behind SMG.

Per run: output tokens/s, each request's TTFT (time to the first streamed token), and the prompt tokens
each replica looked up in its prefix cache and found (its Prometheus counters, before and after the run).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass

import httpx

from roseinfer.bench.metrics import percentile
from roseinfer.cluster import Cluster, Started, free_port, gateway_command, stop, wait_gateway, wait_healthy

SETUPS = ("one replica", "round_robin", "cache_aware")
WORDS = ("order", "bicycle", "wheel", "refund", "delivery", "helmet", "size", "colour", "brake", "warranty",
         "invoice", "address", "spare", "chain", "light", "saddle")


@dataclass
class Workload:
    system_prompts: int = 4  # the shared prefixes
    system_words: int = 120  # each about this many words
    users: int = 24  # requests, each on a system prompt drawn at random
    question_words: int = 8
    max_tokens: int = 16
    concurrency: int = 8  # requests in flight at once


def requests_for(workload: Workload, round_: int) -> list[str]:
    """The round's prompts: its own system prompts (a seed per round), each request one of them drawn at random
    (not in turn: a round-robin gateway would then send each system prompt to one replica by chance)
    and a user's question."""
    rng = random.Random(round_)
    systems = [f"System {round_}.{s}: you answer for a bicycle shop. " +
               " ".join(rng.choice(WORDS) for _ in range(workload.system_words)) for s in range(workload.system_prompts)]
    return [rng.choice(systems) + "\nUser: " +
            " ".join(rng.choice(WORDS) for _ in range(workload.question_words)) + "?\nAssistant:"
            for u in range(workload.users)]


def prefix_counters(replica: str) -> tuple[float, float]:
    """(prompt tokens looked up, found) in this replica's prefix cache so far."""
    values = {}
    for line in httpx.get(replica + "/metrics").text.splitlines():
        for key in ("queries", "hits"):
            if line.startswith(f"roseinfer:prefix_cache_{key}_total "):
                values[key] = float(line.split()[-1])
    return values["queries"], values["hits"]


async def _one(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, str]:
    """(TTFT in s, the text) of one streamed greedy completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    start, first, text = time.perf_counter(), None, []
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                piece = httpx.Response(200, content=line[6:]).json()["choices"][0]["text"]
                if piece and first is None:
                    first = time.perf_counter() - start
                text.append(piece)
    return (first if first is not None else time.perf_counter() - start), "".join(text)


async def _run(url: str, model: str, prompts: list[str], workload: Workload) -> tuple[list[float], list[str], float]:
    gate = asyncio.Semaphore(workload.concurrency)
    async with httpx.AsyncClient(timeout=600) as client:
        async def limited(prompt: str):
            async with gate:
                return await _one(client, url, model, prompt, workload.max_tokens)
        start = time.perf_counter()
        done = await asyncio.gather(*(limited(p) for p in prompts))
        return [d[0] for d in done], [d[1] for d in done], time.perf_counter() - start


def run_once(url: str, replicas: list[str], model: str, prompts: list[str], workload: Workload) -> dict:
    """One run of the prompts through `url`: throughput, TTFTs, texts, each replica's prefix-cache counts."""
    before = [prefix_counters(r) for r in replicas]
    # Its own event loop in a thread: a notebook's kernel already runs one, where asyncio.run is refused.
    with ThreadPoolExecutor(1) as pool:
        ttfts, texts, seconds = pool.submit(asyncio.run, _run(url, model, prompts, workload)).result()
    after = [prefix_counters(r) for r in replicas]
    looked_up = [a[0] - b[0] for a, b in zip(after, before)]
    found = [a[1] - b[1] for a, b in zip(after, before)]
    return {"tok_s": len(prompts) * workload.max_tokens / seconds, "ttft_s": ttfts, "texts": texts,
            "duration_s": seconds, "looked_up": looked_up, "found": found,
            "hit_rate": [f / q if q else 0.0 for f, q in zip(found, looked_up)]}


class Setups:
    """The three setups, started once and kept for every round: one replica on all the cores, and a pair
    (one share of the cores each) behind two gateways, one per policy. Idle servers use no CPU."""

    def __init__(self, server_args: list[str], log_dir: str | None = None) -> None:
        self.server_args, self.log_dir = server_args, log_dir
        self._stack = ExitStack()

    def __enter__(self) -> Setups:
        cores = sorted(os.sched_getaffinity(0))
        try:
            self.pair = self._stack.enter_context(Cluster(2, self.server_args, free_port(), "cache_aware",
                                                          log_dir=self.log_dir, cores=cores))
            port = free_port()
            self.round_robin = Started("round-robin gateway", f"http://127.0.0.1:{port}", _popen(
                gateway_command(port, [w.url for w in self.pair.workers], "round_robin")))
            self._stack.callback(stop, [self.round_robin], 10)
            wait_gateway(self.round_robin, 2, 60)
            port = free_port()
            self.single = Started("one replica", f"http://127.0.0.1:{port}", _popen(
                ["python", "-m", "roseinfer.server", "--port", str(port), *self.server_args],
                {**os.environ, "OMP_NUM_THREADS": str(len(cores))}))
            self._stack.callback(stop, [self.single], 30)
            wait_healthy(self.single, 300)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def target(self, setup: str) -> tuple[str, list[str]]:
        """(the URL a client calls, the replicas behind it) of one setup."""
        pair = [w.url for w in self.pair.workers]
        return {"one replica": (self.single.url, [self.single.url]), "round_robin": (self.round_robin.url, pair),
                "cache_aware": (self.pair.url, pair)}[setup]


def _popen(command: list[str], env: dict | None = None):
    import subprocess
    import sys

    command = [sys.executable if c == "python" else c for c in command]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def measure(setups: Setups, model: str, workload: Workload, repeats: int) -> dict[str, list[dict]]:
    """`repeats` rounds; in each, every setup runs once (the order rotating from round to round) on prompts of
    its own: the pair serves two of the setups, and a setup must not find the other's system prompts cached."""
    runs: dict[str, list[dict]] = {s: [] for s in SETUPS}
    for round_ in range(repeats):
        for setup in SETUPS[round_ % 3:] + SETUPS[:round_ % 3]:
            url, replicas = setups.target(setup)
            prompts = requests_for(workload, 1000 * (round_ + 1) + SETUPS.index(setup))
            runs[setup].append(run_once(url, replicas, model, prompts, workload))
    return runs


def same_answers(setups: Setups, model: str, prompts: list[str], max_tokens: int) -> dict[str, bool]:
    """Whether each setup's greedy texts equal one replica's, called directly (non-streamed). Give prompts that
    share no prefix and were never sent: a prompt that hits a prefix cache is computed in another order (its
    cached keys, then the rest), which can flip a near-tied greedy token; this checks the routing alone."""
    def texts(url: str, batch: list[str]) -> list[str]:
        body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        return [httpx.post(url + "/v1/completions", json={**body, "prompt": p}, timeout=120).json()["choices"][0][
            "text"] for p in batch]

    third = len(prompts) // 3
    result = {}
    for i, setup in enumerate(SETUPS):  # each setup its own prompts, so each is computed cold on both sides
        batch = prompts[i * third:(i + 1) * third]
        # one replica is checked against a replica of the pair, called directly; a gateway against one replica
        reference = setups.pair.workers[0].url if setup == "one replica" else setups.single.url
        result[setup] = texts(setups.target(setup)[0], batch) == texts(reference, batch)
    return result


def distinct_prompts(count: int, words: int = 12, seed: int = 99) -> list[str]:
    """Prompts that share no first word, so no two share a cached block (same_answers)."""
    rng = random.Random(seed)
    return [f"{i}{rng.choice(WORDS)} " + " ".join(rng.choice(WORDS) for _ in range(words)) for i in range(count)]


def summary(runs: dict[str, list[dict]]) -> dict[str, dict[str, list[float]]]:
    """Per setup, one value a run: tok/s, TTFT p50 and p99 (ms), prompt tokens found cached, the hit rate over
    all its replicas, and each replica's own hit rate (a list per replica)."""
    return {setup: {
        "tok_s": [r["tok_s"] for r in rs],
        "ttft_p50_ms": [percentile(r["ttft_s"], 50) * 1000 for r in rs],
        "ttft_p99_ms": [percentile(r["ttft_s"], 99) * 1000 for r in rs],
        "found_tokens": [sum(r["found"]) for r in rs],
        "hit_rate": [sum(r["found"]) / max(1.0, sum(r["looked_up"])) for r in rs],
        "replica_hit_rates": [list(rates) for rates in zip(*(r["hit_rate"] for r in rs))],
    } for setup, rs in runs.items()}


def prefill_ms_per_token(url: str, model: str, words: int = 300, repeats: int = 3) -> float:
    """What one replica spends per prompt token of a cold prefill: a long new prompt's 1-token request minus a
    short one's, over the long prompt's tokens (median of `repeats`)."""
    body = {"model": model, "max_tokens": 1, "temperature": 0}
    per_token = []
    for i in range(repeats):
        timed = []
        for prompt in (f"{i} short", distinct_prompts(1, words, seed=500 + i)[0]):
            start = time.perf_counter()
            r = httpx.post(url + "/v1/completions", json={**body, "prompt": prompt}, timeout=120).json()
            timed.append((time.perf_counter() - start, r["usage"]["prompt_tokens"]))
        (short_s, short_n), (long_s, long_n) = timed
        per_token.append((long_s - short_s) / (long_n - short_n) * 1000)
    return sorted(per_token)[len(per_token) // 2]


# Notebook 14's analysis of `summary`'s table: the verdicts, the prefill envelope, each replica's hit rate, a plot.

PAIR = ("one replica", "cache_aware")  # one 2-thread replica against two 1-thread replicas (cache-aware routed)


def verdicts(table: dict[str, dict[str, list[float]]]) -> dict[str, object]:
    """{name: Verdict}: round_robin -> cache_aware on hit rate ("hit"), tok/s ("tok_s"), TTFT p50 ("ttft") and
    p99 ("ttft_p99"); one 2-thread replica -> the pair (cache_aware) on tok/s ("pair_tok_s") and TTFT p50
    ("pair_ttft")."""
    from roseinfer.bench.stats import verdict

    rr, ca, one = (table[s] for s in ("round_robin", "cache_aware", "one replica"))
    policies, pair = ("round_robin", "cache_aware"), ("one 2-thread replica", "two 1-thread replicas")
    return {
        "hit": verdict("prompt tokens found cached", rr["hit_rate"], ca["hit_rate"], "", higher_is_better=True,
                       labels=policies),
        "tok_s": verdict("throughput", rr["tok_s"], ca["tok_s"], "tok/s", higher_is_better=True, labels=policies),
        "ttft": verdict("TTFT p50", rr["ttft_p50_ms"], ca["ttft_p50_ms"], "ms", higher_is_better=False,
                        labels=policies),
        "ttft_p99": verdict("TTFT p99", rr["ttft_p99_ms"], ca["ttft_p99_ms"], "ms", higher_is_better=False,
                            labels=policies),
        "pair_tok_s": verdict("throughput", one["tok_s"], ca["tok_s"], "tok/s", higher_is_better=True, labels=pair),
        "pair_ttft": verdict("TTFT p50", one["ttft_p50_ms"], ca["ttft_p50_ms"], "ms", higher_is_better=False,
                             labels=pair),
    }


def paired_ratios(table: dict[str, dict[str, list[float]]], key: str, before: str, after: str) -> list[float]:
    """Round by round (every setup runs once a round), after's figure over before's."""
    return [a / b for a, b in zip(table[after][key], table[before][key])]


def envelope(table: dict[str, dict[str, list[float]]], runs: dict[str, list[dict]], ms_per_token: float,
             replicas: int = 2) -> dict[str, float]:
    """The prefill round_robin repeats, priced: the prompt tokens it found cached fewer than cache_aware (median
    a run) times one replica's cold prefill cost a token, over the replicas working at once ("saved", s), beside
    the measured difference of the runs' median durations ("gap", s)."""
    from roseinfer.bench.stats import median

    extra = median(table["cache_aware"]["found_tokens"]) - median(table["round_robin"]["found_tokens"])
    duration = {s: median([r["duration_s"] for r in runs[s]]) for s in ("round_robin", "cache_aware")}
    return {"extra_tokens": extra, "saved": extra * ms_per_token / 1000 / replicas,
            "gap": duration["round_robin"] - duration["cache_aware"], "ms_per_token": ms_per_token,
            "round_robin_s": duration["round_robin"], "cache_aware_s": duration["cache_aware"]}


def describe_envelope(e: dict[str, float], replicas: int = 2) -> str:
    return (f"envelope: round_robin prefilled {e['extra_tokens']:.0f} more prompt tokens a run x "
            f"{e['ms_per_token']:.2f} ms / {replicas} replicas = {e['saved']:.2f} s; measured: its runs took "
            f"{e['gap']:.2f} s longer ({e['round_robin_s']:.2f} vs {e['cache_aware_s']:.2f} s)")


def replica_hit_table(table: dict[str, dict[str, list[float]]]) -> str:
    """Each setup's median hit rate, replica by replica."""
    from roseinfer.bench.stats import median

    lines = [f"{'prompt tokens found cached':<28}{'replica 1':>10}{'replica 2':>10}"]
    for setup in SETUPS:
        rates = [f"{median(r):.2f}" for r in table[setup]["replica_hit_rates"]]
        lines.append(f"{setup:<28}" + "".join(f"{r:>10}" for r in rates + ["-"] * (2 - len(rates))))
    return "\n".join(lines)


def plot(table: dict[str, dict[str, list[float]]], title: str):
    """tok/s, TTFT p50 and the hit rate of the three setups: every run a dot, the median a bar."""
    import matplotlib.pyplot as plt

    from roseinfer.bench.stats import median

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    colors = {"one replica": "#7f7f7f", "round_robin": "#5b9bd5", "cache_aware": "#d9534f"}
    for ax, key, label in zip(axes, ("tok_s", "ttft_p50_ms", "hit_rate"),
                              ("output tok/s", "TTFT p50 (ms)", "prompt tokens found cached")):
        for i, setup in enumerate(SETUPS):
            values = table[setup][key]
            ax.bar(i, median(values), color=colors[setup], alpha=0.4)
            ax.plot([i] * len(values), values, "o", color=colors[setup], ms=4)
        ax.set_xticks(range(3), SETUPS)
        ax.set_title(label)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
