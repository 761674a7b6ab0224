"""`/v1/query` (SQL or a saved query, answered as JSON, CSV or Parquet, or exported) and
`/v1/queries` (the saved queries)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse

from trace_platform.api.auth import ActorDependency
from trace_platform.api.bodies import QueryBody
from trace_platform.api.errors import error_response
from trace_platform.api.routes import trace_router
from trace_platform.identity import Actor
from trace_platform.query import formats, pinned, saved
from trace_platform.query.errors import NotAdmitted
from trace_platform.services import Services


def _what(body: QueryBody) -> str:
    return f"saved query '{body.saved}'"


def router(services: Services, actor: ActorDependency) -> APIRouter:
    r = trace_router()

    @r.post("/v1/query", response_model=None)
    def run_query(body: QueryBody, user: Actor = Depends(actor)) -> Any:
        sql, params = body.statement()
        qs = services.query
        producer = body.producer()
        try:
            if body.export:
                fmt = body.format if body.format != "json" else "parquet"
                if producer is not None:  # a saved query reads only its producer's datasets
                    return pinned.export(
                        qs, user, sql, params, fmt, producer=producer, what=_what(body)
                    )
                return qs.export(user, sql, params, fmt)
            limits = {"max_rows": body.max_rows, "timeout_seconds": body.timeout_seconds}
            if producer is not None:
                result = pinned.query(
                    qs, user, sql, params, producer=producer, what=_what(body), **limits
                )
            else:
                result = qs.query(user, sql, params, **limits)
        except NotAdmitted as e:  # 429 as every error, plus when to come back
            return error_response(
                e.status_code, e.code, e.message, e.detail, {"Retry-After": str(e.retry_after)}
            )
        if body.format == "json":  # already JSON-safe: skip FastAPI's per-value encoder
            return JSONResponse(result.as_json())
        return Response(
            formats.encode(result.table, body.format),
            media_type=formats.MEDIA_TYPES[body.format],
            headers={"X-Trace-Pinned": json.dumps(result.plan.versions)},
        )

    @r.get("/v1/queries")
    def saved_queries(user: Actor = Depends(actor)) -> list[dict[str, Any]]:
        out = []
        for name in saved.names():
            q = saved.load(name)
            out.append({"name": q.name, "description": q.description, "params": q.defaults})
        return out

    return r
