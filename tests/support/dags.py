"""DAG texts and helpers shared by control-plane tests."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from tests.support.wait import wait_for
from trace_platform.identity import Actor, create_key, ensure_user, lite_admin
from trace_platform.lite.stack import LiteStack
from trace_platform.operators.testing import probe_report
from trace_platform.services import Services

THREE_JOBS = """
name: {name}
jobs:
  source:
    operator: emit_events
    config: {{count: 3, final: 1}}
    outputs: [{{backend: parquet}}]
  transform:
    operator: emit_events
    config: {{count: 1, final: 1}}
    inputs: [{{job: source, output: 0}}]
    outputs: [{{backend: parquet}}]
  sink:
    operator: noop
    config: {{record_to: "{record}"}}
    inputs: [{{job: transform, output: 0}}]
publish:
  - {{job: source, output_index: 0, dataset: {name}_raw}}
  - {{job: transform, output_index: 0, dataset: {name}_clean}}
triggers:
  cron:
    - {{name: minutely, schedule: "* * * * *"}}
  webhooks:
    - {{name: poke, config: {{from_hook: true}}}}
"""


def three_jobs(name: str = "hello", record: str = "/dev/null") -> str:
    return THREE_JOBS.format(name=name, record=record)


WHOLE_DAG = """
name: whole
{pools}
jobs:
  src:
    operator: noop
    outputs: [{{}}]
  supply:
    operator: sql_transform
    config: {{sql: "SELECT * FROM src"}}
    inputs: [{{job: src}}]
    outputs: [{{}}]
    {job}
"""


def whole_dag(pools: str = "", job: str = "") -> str:
    """A source of ranges and a whole-scope writer (sql_transform) reading it: `pools` is the
    DAG's worker_pools block, `job` more lines of the writer's job (indented 4)."""
    return WHOLE_DAG.format(pools=pools, job=job)


def admin(services: Services) -> Actor:
    with services.pool.connection() as conn:
        return lite_admin(conn)


def user(services: Services, name: str, roles: list[str] | None = None) -> tuple[Actor, str]:
    """A non-admin user of the Lite org and an API key for them."""
    with services.pool.connection() as conn, conn.transaction():
        a = ensure_user(conn, admin(services).org_id, name, roles=roles or [])
        return a, create_key(conn, a.user_id)


def finished_run(services: Services, run_id: object, timeout: float = 300) -> list[dict[str, Any]]:
    """Waits for a run to end and returns its tasks. Downstream tasks are created in the same
    transaction as their upstream completion, so "every task is terminal" means done."""
    me = admin(services)

    def done() -> list[dict[str, Any]] | None:
        tasks = services.control.show_run(me, run_id)["tasks"]  # type: ignore[arg-type]
        terminal = tasks and all(t["status"] in ("succeeded", "failed", "canceled") for t in tasks)
        return tasks if terminal else None

    result: list[dict[str, Any]] = wait_for(done, timeout, f"run {run_id}")
    return result


def dag_probe(stack: LiteStack, actor: Any, name: str, body: str) -> dict[str, Any]:
    """Deploys and triggers DAG `name` (one job): its probe report, else its status and error."""
    svc = stack.services
    svc.control.deploy(actor, f"name: {name}\n{body}")
    (task_id,) = svc.control.trigger(actor, name)["tasks"]
    view = wait_for(
        lambda: (
            (v := svc.dispatcher.get_task(UUID(str(task_id)))).status in ("failed", "succeeded")
            and v
        ),
        180,
        f"{name}'s task",
    )
    error = view.last_error or ""
    return probe_report(error) or {"status": view.status, "error": error}
