"""X-Request-Id on every response, and one access-log line per request that carries it.

A gateway in front of several replicas (SMG, nginx, a cloud load balancer) stamps each request with
an id and reads it back to tie its own logs to a replica's: the id a request came with is echoed, and
a request without one (or with one that is not a short printable token) gets a fresh one. The log
line is written when the response's last byte is sent, so a stream's line gives its whole duration.

A plain ASGI middleware, not Starlette's BaseHTTPMiddleware: it must not buffer streamed responses.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

HEADER = b"x-request-id"
# What a client may send as its id: short, printable, no spaces (it goes into a header and a log line).
_VALID = re.compile(rb"[\x21-\x7e]{1,128}")
access_logger = logging.getLogger("roseinfer.access")


def request_id_of(scope: dict[str, Any]) -> str:
    """The id of the request in `scope` (set by RequestId; routes read it from request.state)."""
    return scope.get("state", {}).get("request_id", "")


class RequestId:
    """ASGI middleware: echo or mint X-Request-Id, and log each request with it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or []).get(HEADER, b"")
        rid = given.decode("ascii") if _VALID.fullmatch(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        start, status = time.perf_counter(), 0

        async def send_with_id(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, rid.encode("ascii"))]}
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                client = scope.get("client") or ("-", 0)
                access_logger.info('%s "%s %s" %d %.1f ms request_id=%s', client[0], scope["method"],
                                   scope["path"], status, (time.perf_counter() - start) * 1000, rid)

        await self.app(scope, receive, send_with_id)
