"""The routes around generation: /health, /metrics and /v1/loads (no key); /v1/models, /admin/drain and
roseinfer's /generate."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from roseinfer.server.dependencies import ManagerDep, MetricsDep, SettingsDep, abort_all, submit_all
from roseinfer.server.errors import APIError
from roseinfer.server.loads import load_report
from roseinfer.server.protocol import GenerateRequest, usage
from roseinfer.server.sse import (
    CutOnFailureResponse,
    collect,
    text_pieces,
    until_client_leaves,
    until_disconnect,
)

open_router = APIRouter()  # load balancers and Prometheus hold no API key
router = APIRouter()


@open_router.get("/health")
async def health(manager: ManagerDep) -> Response:
    if manager.draining and manager.healthy:  # a gateway stops sending here; what runs still finishes
        return APIError(503, "draining: finishing the requests it has, taking no new ones",
                        headers={"Retry-After": "1"}).response()
    if not manager.healthy:
        reason = manager.error or "the server is shutting down"
        return APIError(503, f"unhealthy: {reason!r}").response()
    return JSONResponse({"status": "ok"})


@router.post("/admin/drain", status_code=202)
async def drain(request: Request) -> dict[str, Any]:
    """Stop as SIGTERM does: take no new request, finish the admitted ones, then exit (python -m roseinfer.server)."""
    request.app.state.begin_drain()
    return {"status": "draining"}


@open_router.get("/metrics")
async def prometheus_metrics(metrics: MetricsDep) -> Response:
    return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@open_router.get("/v1/loads")
async def loads(manager: ManagerDep) -> dict[str, Any]:
    """The load a gateway routes on (SMG's schema: loads.py), from the last step's snapshot."""
    return load_report(manager.stats())


@router.get("/v1/models")
async def models(manager: ManagerDep, settings: SettingsDep) -> dict[str, Any]:
    engine = manager.engine
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "roseinfer",
                "root": engine.weights.location,  # a path or Hub id (a gateway shows it as the model's path)
                "weights": engine.weights.description,
                "max_model_len": engine.max_model_len,
                "roseinfer": engine.describe(),
            }
            for name in settings.model_names
        ],
    }


@router.post("/generate")
async def generate(
    req: GenerateRequest, request: Request, manager: ManagerDep, settings: SettingsDep
) -> Response:
    streams = submit_all(manager, [req.prompt], req.sampling_params())
    abort = abort_all(manager, streams)
    if req.stream:
        return CutOnFailureResponse(
            until_client_leaves(text_pieces(streams[0]), abort), media_type="text/plain; charset=utf-8"
        )
    [(text, end)] = await until_disconnect(request, collect(streams), abort)
    return JSONResponse(
        {
            "text": text,
            "finish_reason": end.finish_reason,
            "usage": usage(end.prompt_tokens, end.completion_tokens),
            "model": settings.served_model_name,
        }
    )
