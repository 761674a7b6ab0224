"""Console pages of data: datasets (versions, producer, lineage, row counts, cutover and
rollback history), the query console (results, CSV export, a chart), alerts and deliveries.
Reads go through the same control plane, Query Service and DeliveryControl calls as
`/v1/datasets`, `/v1/query`, `/v1/alerts` and `/v1/deliveries`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal
from uuid import UUID

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from trace_platform.console.lineage import SpecCache, lineage
from trace_platform.console.svg import chart_svg
from trace_platform.console.web import ConsoleRoute, attempt, form, redirect, render
from trace_platform.delivery.control import DeliveryControl, alerts_sql
from trace_platform.errors import NotFound
from trace_platform.identity import Actor
from trace_platform.identity.vault import vault_for
from trace_platform.query import formats
from trace_platform.services import Services

MAX_ROWS = 1000  # what the results table shows; an export holds up to the Query Service's


def router(services: Services, user: Callable[..., Actor]) -> APIRouter:
    cp = services.control
    deliveries = DeliveryControl(services.pool, vault_for(services.settings))
    r = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

    @r.get("/console/datasets")
    def dataset_list(request: Request, me: Actor = Depends(user)) -> HTMLResponse:
        return render(request, "datasets.html", me=me, datasets=cp.list_datasets(me))

    specs = SpecCache()

    @r.get("/console/datasets/{name}")
    def dataset_page(request: Request, name: str, me: Actor = Depends(user)) -> HTMLResponse:
        """As many reads whatever the number of DAGs, datasets or versions: the readable
        datasets once (the page's own among them), its versions, two audit pages, the DAG
        list, and only the specs of DAG versions this process has not read before."""
        listed = {d["dataset_name"]: d for d in cp.list_datasets(me)}
        ds = listed.get(name)
        if ds is None:  # show_dataset's answer: unknown and unreadable look the same
            raise NotFound(f"no dataset named '{name}' that you can read")
        history: list[dict[str, Any]] = []
        if me.is_admin:  # the audit log is an org admin's (as `trace audit list`)
            for action in ("dag.cutover", "dag.rollback"):
                page = cp.audit_log(me, dag=ds["producer_dag"], action=action, limit=20)
                history += page["entries"]
            history.sort(key=lambda e: e["at"], reverse=True)
        return render(
            request,
            "dataset.html",
            me=me,
            ds=ds,
            versions=cp.dataset_versions(me, name),
            lineage=lineage(specs.visible(cp, me), name, set(listed)),
            history=history,
        )

    def _query(me: Actor, sql: str) -> dict[str, Any]:
        return services.query.query(me, sql, max_rows=MAX_ROWS).as_json()

    @r.get("/console/query")
    def query_page(
        request: Request, me: Actor = Depends(user), dataset: str | None = None
    ) -> HTMLResponse:
        sql = f"SELECT * FROM {dataset} LIMIT 100" if dataset else ""  # only a starting text
        return render(request, "query.html", me=me, sql=sql, result=None, chart=None, form={})

    @r.post("/console/query")
    def run_query(
        request: Request, me: Actor = Depends(user), fields: dict[str, str] = Depends(form)
    ) -> HTMLResponse:
        sql = fields.get("sql", "")
        chart = None
        # An error is shown beside the editor, the statement kept.
        result, error = attempt(lambda: _query(me, sql))
        if result and fields.get("x") and fields.get("y"):
            kind = "line" if fields.get("kind") == "line" else "bar"
            names = [c["name"] for c in result["columns"]]
            rows = [dict(zip(names, row, strict=True)) for row in result["rows"]]
            chart = chart_svg(rows, fields["x"], fields["y"], kind)
        status = 200 if error is None else 422
        return render(
            request,
            "query.html",
            status,
            me=me,
            sql=sql,
            result=result,
            error=error,
            chart=chart,
            form=fields,
        )

    @r.post("/console/query.{fmt}")
    def export(
        request: Request,
        fmt: Literal["csv", "parquet"],
        me: Actor = Depends(user),
        fields: dict[str, str] = Depends(form),
    ) -> Response:
        """The query's result as CSV or Parquet, as `POST /v1/query` with that `format`
        answers it (the Query Service's row cap, not the results table's)."""
        result = services.query.query(me, fields.get("sql", ""))
        return Response(
            formats.encode(result.table, fmt),
            media_type=formats.MEDIA_TYPES[fmt],
            headers={"Content-Disposition": f'attachment; filename="query.{fmt}"'},
        )

    @r.get("/console/alerts")
    def alerts_page(request: Request, me: Actor = Depends(user)) -> HTMLResponse:
        alerts, alerts_error = attempt(lambda: _query(me, alerts_sql(None, 100)))
        # Deliveries are an org admin's: anyone else sees why not, and the alerts.
        rows, rows_error = attempt(lambda: deliveries.list_deliveries(me, limit=100))
        return render(
            request,
            "alerts.html",
            me=me,
            alerts=alerts,
            alerts_error=alerts_error,
            deliveries=rows,
            deliveries_error=rows_error,
        )

    @r.get("/console/deliveries/{delivery_id}")
    def delivery_page(
        request: Request, delivery_id: UUID, me: Actor = Depends(user)
    ) -> HTMLResponse:
        return render(request, "delivery.html", me=me, d=deliveries.show(me, delivery_id))

    @r.post("/console/deliveries/{delivery_id}/retry")
    def delivery_retry(
        request: Request,
        delivery_id: UUID,
        me: Actor = Depends(user),
        _: dict[str, str] = Depends(form),
    ) -> RedirectResponse:
        # The page's own read first: another org's delivery is not found there, where retry's
        # one UPDATE would say only that it found no failed delivery (409).
        deliveries.show(me, delivery_id)
        deliveries.retry(me, delivery_id)
        return redirect(request, f"/deliveries/{delivery_id}", "sent again: pending")

    return r
