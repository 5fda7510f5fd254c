"""Several roseinfer replicas behind one gateway, on this machine: `python -m roseinfer.cluster`.

    python -m roseinfer.cluster --replicas 2 --model gpt2 --port 8000 [any server flag...]

starts N servers (`python -m roseinfer.server`, every flag not named below passed to each) on the ports
after --port, the machine's cores split between them (each pinned to its share, its OpenMP threads as
many), waits until each answers /health, then starts SMG, the Shepherd Model Gateway
(`pip install roseinfer[cluster]`), on --port in front of them. Clients talk to the gateway as to one
server. Ctrl-C or SIGTERM drains the replicas (each finishes what it admitted, see `--drain-timeout`),
then stops the gateway; everything started is stopped by PID.

SMG's defaults are made for large fleets (a health check a minute, rebalancing only past 64 requests of
imbalance); a small cluster wants the flags below: a replica that drains or dies is noticed within
seconds, and the load report (/v1/loads) is read every second.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

POLICIES = ("cache_aware", "round_robin", "power_of_two", "least_load", "random")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def gateway_command(port: int, workers: Sequence[str], policy: str, host: str = "127.0.0.1",
                    prometheus_port: int | None = None) -> list[str]:
    """`smg launch` for a small cluster of roseinfer workers. Its own Prometheus endpoint listens on
    `prometheus_port` (default: a free one; SMG's fixed default would keep a second gateway from starting)."""
    command = [
        sys.executable, "-m", "smg", "launch", "--host", host, "--port", str(port),
        "--worker-urls", *workers, "--policy", policy,
        "--balance-abs-threshold", "8",  # rebalance a cache-aware cluster past 8 requests of imbalance, not 64
        "--health-check-interval-secs", "2", "--health-failure-threshold", "1",  # a draining replica: out at once
        "--load-monitor-interval", "1",  # GET /v1/loads every second
        "--disable-tokenizer-autoload",  # roseinfer tokenizes; the gateway routes on text
        "--log-level", "warn",
    ]
    return command + ["--prometheus-host", host, "--prometheus-port", str(prometheus_port or free_port(host))]


def core_shares(cores: Sequence[int], replicas: int) -> list[list[int]]:
    """The cores split into `replicas` contiguous shares, as even as they go (one core each at least, shared
    round the ring when there are fewer cores than replicas)."""
    cores = list(cores)
    if replicas <= len(cores):
        return [cores[len(cores) * i // replicas: len(cores) * (i + 1) // replicas] for i in range(replicas)]
    return [[cores[i % len(cores)]] for i in range(replicas)]


@dataclass
class Started:
    name: str
    url: str
    proc: subprocess.Popen


def wait_healthy(started: Started, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if started.proc.poll() is not None:
            raise RuntimeError(f"{started.name} exited with {started.proc.returncode} before it was healthy")
        try:
            if httpx.get(started.url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{started.name} did not answer /health within {timeout:.0f} s")


def wait_gateway(started: Started, model_workers: int, timeout: float) -> None:
    """Until the gateway serves /v1/models (it has registered a worker) and lists all of them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if started.proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {started.proc.returncode}")
        try:
            workers = httpx.get(started.url + "/workers", timeout=1)
            if workers.status_code == 200 and len(workers.json().get("workers", [])) >= model_workers \
                    and httpx.get(started.url + "/v1/models", timeout=1).status_code == 200:
                return
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the gateway did not register its {model_workers} workers within {timeout:.0f} s")


def stop(processes: Sequence[Started], timeout: float) -> None:
    """SIGTERM each (a replica drains), wait up to `timeout` for all, then SIGKILL what is left."""
    for p in processes:
        if p.proc.poll() is None:
            p.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in processes:
        try:
            p.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.proc.kill()
            p.proc.wait()


class Cluster:
    """N replicas and a gateway, started and stopped together (a context manager; tests and notebook 14)."""

    def __init__(self, replicas: int, server_args: Sequence[str], port: int, policy: str = "cache_aware",
                 host: str = "127.0.0.1", cores: Sequence[int] | None = None, drain_timeout: float = 30.0,
                 log_dir: str | None = None, startup_timeout: float = 300.0) -> None:
        self.replicas, self.server_args, self.port, self.policy, self.host = replicas, list(server_args), port, \
            policy, host
        self.cores = list(cores) if cores is not None else sorted(os.sched_getaffinity(0))
        self.drain_timeout, self.log_dir, self.startup_timeout = drain_timeout, log_dir, startup_timeout
        self.workers: list[Started] = []
        self.gateway: Started | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _output(self, name: str):
        if self.log_dir is None:
            return subprocess.DEVNULL
        os.makedirs(self.log_dir, exist_ok=True)
        return open(os.path.join(self.log_dir, f"{name}.log"), "w")

    def start(self) -> Cluster:
        try:
            for i, share in enumerate(core_shares(self.cores, self.replicas)):
                port = self.port + 1 + i
                env = {**os.environ, "OMP_NUM_THREADS": str(len(share))}
                command = [sys.executable, "-m", "roseinfer.server", "--host", self.host, "--port", str(port),
                           "--drain-timeout", str(self.drain_timeout), *self.server_args]
                proc = subprocess.Popen(command, env=env, stdout=self._output(f"replica{i + 1}"),
                                        stderr=subprocess.STDOUT)
                os.sched_setaffinity(proc.pid, share)
                self.workers.append(Started(f"replica {i + 1} (cores {share})", f"http://{self.host}:{port}", proc))
            for w in self.workers:
                wait_healthy(w, self.startup_timeout)
            command = gateway_command(self.port, [w.url for w in self.workers], self.policy, self.host)
            self.gateway = Started("gateway", self.url, subprocess.Popen(command, stdout=self._output("gateway"),
                                                                          stderr=subprocess.STDOUT))
            wait_gateway(self.gateway, self.replicas, 60)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Drain the replicas (each finishes what it admitted), then stop the gateway."""
        stop(self.workers, self.drain_timeout + 15)
        if self.gateway is not None:
            stop([self.gateway], 10)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m roseinfer.cluster", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every other flag goes to each replica (python -m roseinfer.server --help lists them).")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--port", type=int, default=8000, help="the gateway's; replica i listens on port + i")
    p.add_argument("--host", default="127.0.0.1", help="where the gateway and the replicas listen")
    p.add_argument("--policy", choices=POLICIES, default="cache_aware", help="the gateway's routing policy")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="each replica's, on Ctrl-C or SIGTERM")
    p.add_argument("--log-dir", default=None, help="each process's output in <dir>/<name>.log (default: dropped)")
    return p


def main(argv: list[str] | None = None) -> int:
    args, server_args = build_parser().parse_known_args(argv)
    if args.replicas < 1:
        raise SystemExit("--replicas must be at least 1")
    cluster = Cluster(args.replicas, server_args, args.port, args.policy, args.host,
                      drain_timeout=args.drain_timeout, log_dir=args.log_dir)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    try:
        cluster.start()
        for w in cluster.workers:
            print(f"{w.name}: {w.url} (pid {w.proc.pid})", flush=True)
        print(f"gateway: {cluster.url} (policy {args.policy}, pid {cluster.gateway.proc.pid}); Ctrl-C to stop",
              flush=True)
        while not stopping and all(p.proc.poll() is None for p in [*cluster.workers, cluster.gateway]):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        print("draining the replicas, then stopping the gateway", flush=True)
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
