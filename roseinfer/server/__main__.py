"""`python -m roseinfer.server`: the OpenAI-compatible server.

    python -m roseinfer.server                      # embedded gpt2 on 127.0.0.1:8000
    python -m roseinfer.server --model /path/to/hf-gpt2 --device cuda --port 8080
    ROSEINFER_API_KEY=secret python -m roseinfer.server --host 0.0.0.0

SIGTERM (or Ctrl-C) stops accepting requests, ends every open stream with an
error event, and exits 0 within a few seconds.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any

from roseinfer.cli import add_engine_args, command_parser, engine_from_args, scheduler_options
from roseinfer.server.app import (
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_MAX_REQUEST_BYTES,
    ServerSettings,
    create_app,
)
from roseinfer.server.manager import SchedulerManager
from roseinfer.server.metrics import ServerMetrics
from roseinfer.tokenizer import ChatFormatter

logger = logging.getLogger("roseinfer.server")

GRACEFUL_SHUTDOWN_S = 5
# The name the seed blog posts' clients send; served by default beside the model's own name.
SEED_MODEL_NAME = "roseinfer-gpt2"


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("python -m roseinfer.server", __doc__)
    p.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help=f"the names clients may pass as 'model', the first one listed first "
        f"(default: --hf-model-id or --model, and {SEED_MODEL_NAME!r})",
    )
    add_engine_args(p)
    e = p.add_argument_group("serving")
    e.add_argument("--stream-interval", type=int, default=1, help="flush streamed text every N tokens")
    e.add_argument("--max-inflight-requests", type=int, default=1024, help="beyond this, HTTP 429")
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--api-key", default=None, help="require 'Authorization: Bearer KEY' (or set ROSEINFER_API_KEY)"
    )
    s.add_argument(
        "--chat-template", default=None, help="a Jinja chat template file (default: roseinfer's GPT-2 format)"
    )
    s.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES)
    s.add_argument("--log-level", default="info")
    s.add_argument(
        "--drain-timeout", type=float, default=DEFAULT_DRAIN_TIMEOUT_S,
        help="on SIGTERM or POST /admin/drain: seconds to let the admitted requests finish (new ones get 503 "
        "and /health 503 meanwhile) before the rest end with an error and the process exits",
    )
    return p


def chat_formatter(template_file: str | None, checkpoint_folder: str) -> ChatFormatter:
    """--chat-template's file; else the checkpoint's own template (an instruct model's); else the plain
    User:/Assistant: format GPT-2 gets."""
    if template_file:
        return ChatFormatter.from_file(template_file)
    return (ChatFormatter.for_checkpoint(checkpoint_folder) if checkpoint_folder else None) or ChatFormatter()


def build_app(args: argparse.Namespace) -> Any:
    engine = engine_from_args(args)
    metrics = ServerMetrics()
    manager = SchedulerManager(
        engine,
        **scheduler_options(args),
        stream_interval=args.stream_interval,
        max_inflight_requests=args.max_inflight_requests,
        on_finished=metrics.on_finished,
    )
    names = args.served_model_name or list(dict.fromkeys([args.hf_model_id or args.model, SEED_MODEL_NAME]))
    settings = ServerSettings(
        served_model_name=names[0],
        model_aliases=tuple(names[1:]),
        api_key=args.api_key or os.environ.get("ROSEINFER_API_KEY") or None,
        chat=chat_formatter(args.chat_template, engine.weights.folder),
        max_request_bytes=args.max_request_bytes,
    )
    logger.info(
        "roseinfer: serving %s with %s on http://%s:%d%s",
        " / ".join(map(repr, settings.model_names)),
        engine.weights.description,
        args.host,
        args.port,
        " with an API key" if settings.api_key else "",
    )
    return create_app(manager, settings, metrics)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    app = build_app(args)
    manager = app.state.manager

    class Server(uvicorn.Server):
        """uvicorn's server with a drain before its shutdown: the first SIGTERM or SIGINT (or POST /admin/drain)
        keeps the socket open while the admitted requests finish (up to --drain-timeout), then stops; a second
        signal stops at once, ending what is left."""

        draining = False

        def begin_drain(self, sig: int = signal.SIGTERM, frame: Any = None) -> None:
            if self.draining:
                return
            self.draining = True
            logger.info("roseinfer: draining (up to %.0f s): no new requests, finishing the admitted ones",
                        args.drain_timeout)

            def drain_then_stop() -> None:
                finished = manager.drain(args.drain_timeout)
                logger.info("roseinfer: %s; shutting down", "every admitted request finished" if finished
                            else f"drain timeout ({args.drain_timeout:.0f} s): ending the requests left")
                manager.close(timeout=2.0)
                uvicorn.Server.handle_exit(self, sig, frame)

            threading.Thread(target=drain_then_stop, name="roseinfer-drain", daemon=True).start()

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.draining:
                self.begin_drain(sig, frame)
                return
            logger.info("roseinfer: signal %d during the drain, shutting down now", sig)
            manager.close(timeout=2.0)
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        access_log=False,  # roseinfer.access logs each request instead, with its X-Request-Id
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    # uvicorn re-raises the signal it stopped for once it has shut down; with
    # this handler in place, a SIGTERM that was handled cleanly exits 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    server = Server(config)
    app.state.begin_drain = server.begin_drain
    server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
