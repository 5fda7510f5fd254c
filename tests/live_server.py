"""Run a roseinfer app under a real uvicorn on 127.0.0.1, in a background thread."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from roseinfer.server.app import ServerSettings, create_app
from roseinfer.server.manager import SchedulerManager
from roseinfer.server.metrics import ServerMetrics

MODEL = "tiny"  # the name the test servers serve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, app) -> None:
        self.app = app
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    @property
    def manager(self):
        return self.app.state.manager


def make_server(engine, api_key=None, max_request_bytes=1 << 20, **manager_options) -> LiveServer:
    metrics = ServerMetrics()
    manager = SchedulerManager(engine, on_finished=metrics.on_finished, **manager_options)
    settings = ServerSettings(served_model_name=MODEL, api_key=api_key, max_request_bytes=max_request_bytes)
    return LiveServer(create_app(manager, settings, metrics))


def slowed_down(engine, seconds_per_step: float):
    """Make every step take a while, so that requests overlap however fast the CPU is."""
    execute = engine.runner.execute

    def slow_execute(batch):
        time.sleep(seconds_per_step)
        return execute(batch)

    engine.runner.execute = slow_execute
    return engine
