"""Tasks written straight into the state tables, for tests of the Dispatcher's statements."""

from __future__ import annotations

from typing import Any

from trace_platform.contract import LITE_ORG_ID


def queue_tasks(
    conn: Any, n: int, *, worker_pool: str | None = None, dag_id: Any = None
) -> list[Any]:
    """`n` new queued tasks (no statistics are taken), their ids in creation order. A pooled
    task's status row carries its pool, as insert_tasks writes it."""
    rows = conn.execute(
        """
        INSERT INTO task_registry (task_id, start_day, org_id, job, operator, runtime,
          timeout_seconds, max_attempts, retry_backoff_seconds, retry_backoff_max_seconds,
          worker_pool, dag_id)
        SELECT gen_random_uuid(), trace_start_day(now()), %s, 'j', 'noop', 'ecs_platform',
               3600, 3, 2, 300, %s, %s::uuid
        FROM generate_series(1, %s)
        RETURNING task_id, start_day, worker_pool,
                  CASE WHEN worker_pool IS NOT NULL THEN dag_id END AS pool_dag_id
        """,
        [LITE_ORG_ID, worker_pool, dag_id, n],
    ).fetchall()
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO task_status (task_id, start_day, pool_dag_id, worker_pool) "
            "VALUES (%(task_id)s, %(start_day)s, %(pool_dag_id)s, %(worker_pool)s)",
            rows,
        )
    return [r["task_id"] for r in rows]


def bare_dataset(
    conn: Any, org_id: Any, dag_id: Any, name: str, strategy: str, index: int = 0, versions: int = 1
) -> tuple[Any, list[Any]]:
    """A dataset row and `versions` complete versions of it, nothing else (plan and migration
    tests fill their commits by SQL): (dataset_uuid, [dataset_version, ...])."""
    ds = conn.execute(
        "INSERT INTO datasets (dataset_uuid, org_id, dataset_name, backend, location, "
        "update_strategy, producer_dag_id, producer_job, producer_output_index) "
        "VALUES (gen_random_uuid(), %s, %s, 'parquet', 'mem://d', %s, %s, 'j', %s) "
        "RETURNING dataset_uuid",
        [org_id, name, strategy, dag_id, index],
    ).fetchone()["dataset_uuid"]
    made = [
        conn.execute(
            "INSERT INTO dataset_versions (dataset_version, dataset_uuid, dag_id, dag_version, "
            "location, state, backend) VALUES (gen_random_uuid(), %s, %s, 1, 'mem://v', "
            "'complete', 'parquet') RETURNING dataset_version",
            [ds, dag_id],
        ).fetchone()["dataset_version"]
        for _ in range(versions)
    ]
    return ds, made
