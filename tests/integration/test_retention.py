"""Retention by partition (trace admin retention, src/trace_platform/retention) on a real
Postgres and a real local object store: an old month of task history (made by inserting rows
with old start days) is exported to Parquet, read back, then detached and dropped; nothing
is lost, a crash anywhere re-runs cleanly, live work is refused, a dropped run answers
'exported', and the history datasets are each org's admins' own."""

from __future__ import annotations

import getpass
import json
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any
from uuid import UUID

import httpx
import pyarrow.parquet as pq
import pytest

from tests.support.dags import admin, three_jobs, user
from trace_platform import audit
from trace_platform.contract import LITE_ORG_ID, CompleteRequest
from trace_platform.db.queries import Queries
from trace_platform.errors import Conflict, Gone, Invalid, NotFound
from trace_platform.identity import Actor, ensure_user
from trace_platform.objectstore import ObjectStore, list_all, make_store
from trace_platform.query.engine import local_path
from trace_platform.retention.export import ROOT
from trace_platform.retention.history import RUN_TABLES
from trace_platform.retention.run import MonthResult, Retention
from trace_platform.retention.units import Unit, day_of
from trace_platform.services import Services

TABLES = ("task_registry", "task_attempts", "task_retries", "events", "audit_log")


def month_start(months_back: int) -> date:
    d = datetime.now(UTC).date().replace(day=1)
    for _ in range(months_back):
        d = (d - timedelta(days=1)).replace(day=1)
    return d


OLD = month_start(3)  # the month retention takes
KEPT = month_start(2)  # older than the cutoff's month too, but --older-than keeps it (see below)


def label(d: date) -> str:
    return d.strftime("%Y_%m")


def history(
    svc: Services,
    day: date,
    org: UUID,
    n: int,
    *,
    run: UUID | None = None,
    dag: UUID | None = None,
    status: str = "succeeded",
) -> list[UUID]:
    """`n` finished tasks of `org` started on `day`, each with an attempt, a retry by hand
    (after it), an event and a status row, and one audit row; returns their ids."""
    at = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    sd = day_of(day)
    ids = [uuid.uuid4() for _ in range(n)]
    with svc.pool.connection() as conn, conn.transaction():
        conn.execute("SELECT trace_ensure_partitions(2, 4)")
        for i, t in enumerate(ids):
            conn.execute(
                "INSERT INTO task_registry (task_id, start_day, org_id, dag_id, job, operator,"
                " runtime, config, timeout_seconds, max_attempts, retry_backoff_seconds,"
                " retry_backoff_max_seconds, run_id, created_at, parent_task_id)"
                " VALUES (%s, %s, %s, %s, 'source', 'noop', 'ecs_platform', %s, 60, 3, 1, 10,"
                " %s, %s, %s)",
                (t, sd, org, dag, json.dumps({"i": i, "q": "it's"}), run, at, None),
            )
            conn.execute(
                "INSERT INTO task_status (task_id, start_day, status, attempt, finished_at,"
                " updated_at, progress) VALUES (%s, %s, %s, 1, %s, %s, %s)",
                (t, sd, status, at, at, json.dumps({"done": i})),
            )
            conn.execute(
                "INSERT INTO task_attempts (task_id, start_day, attempt, lease_token, started_at,"
                " finished_at, outcome) VALUES (%s, %s, 1, %s, %s, %s, 'succeeded')",
                (t, sd, uuid.uuid4(), at, at),
            )
            conn.execute(
                "INSERT INTO task_retries (task_id, start_day, after_attempt, run_id, created_at)"
                " VALUES (%s, %s, 1, %s, %s)",
                (t, sd, run, at),
            )
            conn.execute(
                "INSERT INTO events (event_id, start_day, org_id, producer_task_id,"
                " producer_attempt, dataset_uuid, dedupe_key, range_start, range_end, created_at)"
                " VALUES (%s, %s, %s, %s, 1, %s, %s, %s, %s, %s)",
                (uuid.uuid4(), sd, org, t, uuid.uuid4(), f"range:{i}-{i + 1}", i, i + 1, at),
            )
        conn.execute(
            "INSERT INTO audit_log (start_day, at, org_id, actor_kind, actor_name, action,"
            " target_kind, target, source) VALUES (%s, %s, %s, 'system', 'test', 'dag.trigger',"
            " 'dag', 'x', 'system')",
            (sd, at, org),
        )
    return ids


def other_org(svc: Services) -> tuple[UUID, Actor]:
    org = uuid.uuid4()
    with svc.pool.connection() as conn, conn.transaction():
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'other')", (org,))
        return org, ensure_user(conn, org, "eve", is_admin=True)


def one(svc: Services, query: str, *args: Any) -> Any:
    with svc.pool.connection() as conn:
        row = conn.execute(query, args).fetchone()
    return None if row is None else next(iter(row.values()))


def exists(svc: Services, table: str) -> bool:
    return one(svc, "SELECT to_regclass(%s) IS NOT NULL", table) is True


def status_rows(svc: Services, day: date) -> int:
    lo = day_of(day)
    return int(
        one(svc, "SELECT count(*) FROM task_status WHERE start_day BETWEEN %s AND %s", lo, lo + 27)
    )


def exported(store: ObjectStore, table: str, d: date) -> dict[str, list[dict[str, Any]]]:
    """Every row the store holds for `table`'s month `d`, by file."""
    out = {}
    for o in list_all(store, f"{ROOT}/{table}/{label(d)}/"):
        out[o.key] = pq.read_table(local_path(store.uri(o.key))).to_pylist()
    return out


def of(months: list[MonthResult], d: date) -> MonthResult:
    return next(m for m in months if m.label.startswith(f"{d:%Y-%m-%d}"))


def job(svc: Services, **kw: Any) -> Retention:
    return Retention(svc.dsn, make_store(svc.settings), batch_rows=7, **kw)


class Bars:
    """retention.run.Progress, recorded: each step's total and the rows advanced under it."""

    def __init__(self) -> None:
        self.steps: dict[str, list[int | None]] = {}  # description: [total, rows advanced]
        self.current = ""

    def start(self, description: str, total: int | None) -> None:
        self.steps[description] = [total, 0]
        self.current = description

    def advance(self, rows: int) -> None:
        self.steps[self.current][1] += rows  # type: ignore[operator]


def test_a_month_is_exported_read_back_and_dropped_and_no_other_is_touched(
    services: Services,
) -> None:
    svc = services
    org, _ = other_org(svc)
    mine = history(svc, OLD + timedelta(days=3), LITE_ORG_ID, 20)
    theirs = history(svc, OLD + timedelta(days=9), org, 3)
    kept = history(svc, KEPT + timedelta(days=2), LITE_ORG_ID, 4)
    today = history(svc, datetime.now(UTC).date(), LITE_ORG_ID, 2)
    store = make_store(svc.settings)

    # Days since OLD's last day: OLD goes, KEPT (a month younger) stays.
    older = (datetime.now(UTC).date() - KEPT).days
    bars = Bars()
    months = job(svc, progress=bars).run(older, export=True)
    assert all(not m.refused for m in months)  # OLD, and the empty month before it
    rows = {u.relname: u.rows for m in months for u in m.units}
    # Each export's bar: its total the unit's rows (the export's own count), all advanced.
    assert {d.removeprefix("exporting "): v for d, v in bars.steps.items() if "exporting" in d} == {
        k: [n, n] for k, n in rows.items()
    }
    assert {k: v for k, v in rows.items() if k.endswith(label(OLD))} == {
        f"{t}_{label(OLD)}": 2 if t == "audit_log" else 23 for t in TABLES
    } | {f"task_status_{label(OLD)}": 23}
    assert not any(k.endswith(label(KEPT)) for k in rows)

    for t in TABLES:  # gone from Postgres, never deleted row by row: the table itself is gone
        assert not exists(svc, f"{t}_{label(OLD)}")
        assert exists(svc, f"{t}_{label(KEPT)}")
    assert status_rows(svc, OLD) == 0
    assert status_rows(svc, KEPT) == 4
    assert one(svc, "SELECT count(*) FROM task_registry") == len(kept) + len(today)
    assert one(svc, "SELECT count(*) FROM task_attempts") == len(kept) + len(today)
    # A retry by hand goes with its task's month (it would otherwise count for a task_id no
    # longer in Postgres, for ever).
    assert one(svc, "SELECT count(*) FROM task_retries") == len(kept) + len(today)

    # Every row is in the store once, in its org's file, and reads back.
    for t in ("task_registry", "task_attempts", "task_retries", "task_status"):
        files = exported(store, t, OLD)
        rows = [r for f in files.values() for r in f]
        assert sorted(r["task_id"] for r in rows) == sorted(str(i) for i in mine + theirs)
        by_org = {k.rsplit("/", 1)[1]: {r["org_id"] for r in f} for k, f in files.items()}
        assert by_org == {
            f"org-{LITE_ORG_ID}.parquet": {str(LITE_ORG_ID)},
            f"org-{org}.parquet": {str(org)},
        }
    registry = [r for f in exported(store, "task_registry", OLD).values() for r in f]
    assert {json.loads(r["config"])["q"] for r in registry} == {"it's"}
    status = [r for f in exported(store, "task_status", OLD).values() for r in f]
    assert {r["status"] for r in status} == {"succeeded"}
    assert sorted(json.loads(r["progress"])["done"] for r in status) == sorted(
        list(range(20)) + list(range(3))
    )
    assert len([r for f in exported(store, "audit_log", OLD).values() for r in f]) == 2

    # Run again: nothing left to take, nothing made again (the reaper's upkeep included).
    assert job(svc).run(older, export=True) == []
    with svc.pool.connection() as conn:
        conn.execute("SELECT trace_ensure_partitions(2, 4)")
    assert not exists(svc, f"task_registry_{label(OLD)}")


def drops(svc: Services) -> list[dict[str, Any]]:
    """The audit log's retention rows, oldest first."""
    with svc.pool.connection() as conn:
        return conn.execute(
            "SELECT * FROM audit_log WHERE action = 'retention.drop' ORDER BY id"
        ).fetchall()


def of_month(rows: list[dict[str, Any]], d: date) -> list[dict[str, Any]]:
    return [r for r in rows if r["target"].startswith(f"{d:%Y-%m-%d}")]


def test_each_month_dropped_is_in_every_orgs_audit_log_and_a_dry_run_in_none(
    services: Services,
) -> None:
    svc = services
    org, eve = other_org(svc)
    history(svc, OLD + timedelta(days=3), LITE_ORG_ID, 3)
    history(svc, KEPT + timedelta(days=3), org, 2)
    store = make_store(svc.settings)
    older = (datetime.now(UTC).date() - KEPT).days
    assert job(svc).run(older, export=True, dry_run=True)
    assert drops(svc) == []  # a plan is no action

    months = job(svc).run(older, export=True)
    rows = drops(svc)
    assert sorted((r["org_id"], r["target"]) for r in rows) == sorted(
        (o, m.label) for o in (LITE_ORG_ID, org) for m in months
    )
    for r in rows:
        assert (r["actor_kind"], r["actor_name"], r["source"]) == ("system", "system", "cli")
        assert r["target_kind"] == "month" and r["outcome"] == "ok"
    mine, theirs = sorted(of_month(rows, OLD), key=lambda r: r["org_id"] == org)
    assert mine["details"] == theirs["details"]
    d = mine["details"]
    assert d["exported"] is True and d["older_than_days"] == older
    # Who dropped it: the OS user that ran the job (this process) and the role it connected as.
    assert d["os_user"] == getpass.getuser()
    assert d["db_role"] == one(svc, "SELECT current_user")
    parts = {p["table"]: p for p in d["partitions"]}
    assert set(parts) == {f"{t}_{label(OLD)}" for t in (*TABLES, "task_status")}
    assert parts[f"task_registry_{label(OLD)}"]["rows"] == 3
    registry = parts[f"task_registry_{label(OLD)}"]["export"]
    assert registry.startswith(store.uri(f"{ROOT}/task_registry/{label(OLD)}") + "/")
    # Each org's admins read it in their own log.
    with svc.pool.connection() as conn:
        page = audit.list_entries(conn, eve, action="retention.drop")
    assert [e["target"] for e in page["entries"]] == [m.label for m in reversed(months)]

    # Dropped unexported: the log says there is no export.
    newer = (datetime.now(UTC).date() - month_start(1)).days
    gone = job(svc).run(newer, no_export=True, export=False)
    assert [m.label for m in gone] and all(not m.refused for m in gone)
    (kept,) = [r for r in of_month(drops(svc), KEPT) if r["org_id"] == org]
    assert kept["details"]["exported"] is False
    assert {p["export"] for p in kept["details"]["partitions"]} == {None}
    assert {p["rows"] for p in kept["details"]["partitions"] if "registry" in p["table"]} == {2}


class Crash(Exception):
    pass


@pytest.mark.parametrize(
    ("step", "table"),
    [
        ("uploaded", "task_registry"),
        ("exported", "events"),
        ("detached", "task_attempts"),
        ("dropped", "task_registry"),
    ],
)
def test_a_run_stopped_between_export_and_drop_finishes_on_the_next_losing_and_doubling_nothing(
    services: Services, step: str, table: str
) -> None:
    svc = services
    ids = history(svc, OLD + timedelta(days=1), LITE_ORG_ID, 12)
    store = make_store(svc.settings)

    def crash(at: str, unit: Unit) -> None:
        if (at, unit.relname) == (step, f"{table}_{label(OLD)}"):
            raise Crash(f"stopped after {at} {unit.relname}")

    with pytest.raises(Crash):
        job(svc, hook=crash).run(40, export=True)
    # The registry goes last, and the status rows after it.
    assert exists(svc, f"task_registry_{label(OLD)}") == (step != "dropped")
    assert status_rows(svc, OLD) == 12
    assert of_month(drops(svc), OLD) == []  # not dropped whole: not said to be
    months = job(svc).run(40, export=True)
    assert months and all(not m.refused for m in months)
    said = [r["target"] for r in drops(svc)]  # once each, the older ones by the first run
    assert len(set(said)) == len(said) and len(of_month(drops(svc), OLD)) == 1
    for t in ("task_registry", "task_attempts", "events", "task_status"):
        assert not exists(svc, f"{t}_{label(OLD)}")
        files = exported(store, t, OLD)
        assert len(files) == 1, files  # one try's file: a stopped try's are removed
        rows = next(iter(files.values()))
        key = "producer_task_id" if t == "events" else "task_id"
        assert sorted(r[key] for r in rows) == sorted(str(i) for i in ids)
    assert status_rows(svc, OLD) == 0


def test_a_row_landing_after_the_export_is_exported_before_its_partition_drops(
    services: Services,
) -> None:
    svc = services
    history(svc, OLD + timedelta(days=1), LITE_ORG_ID, 5)
    late = uuid.uuid4()
    landed: list[UUID] = []
    store = make_store(svc.settings)

    def land(at: str, unit: Unit) -> None:
        if (at, unit.relname) == ("exported", f"events_{label(OLD)}") and not landed:
            landed.append(late)
            with svc.pool.connection() as conn:
                conn.execute(
                    "INSERT INTO events (event_id, start_day, org_id, producer_task_id,"
                    " producer_attempt, dataset_uuid, dedupe_key) VALUES (%s, %s, %s, %s, 1, %s,"
                    " 'cursor:late')",
                    (late, unit.lo + 1, LITE_ORG_ID, uuid.uuid4(), uuid.uuid4()),
                )

    job(svc, hook=land).run(40, export=True)
    assert not exists(svc, f"events_{label(OLD)}")
    rows = [r for f in exported(store, "events", OLD).values() for r in f]
    assert len(rows) == 6 and str(late) in {r["event_id"] for r in rows}
    assert (
        one(
            svc,
            "SELECT row_count FROM retention_exports WHERE relname = %s",
            f"events_{label(OLD)}",
        )
        == 6
    )


def test_live_work_refuses_its_month_and_no_export_must_be_asked_for(services: Services) -> None:
    svc = services
    history(svc, OLD + timedelta(days=1), LITE_ORG_ID, 3)
    [live] = history(svc, OLD + timedelta(days=2), LITE_ORG_ID, 1, status="running")
    months = job(svc).run(40, export=True)
    assert of(months, OLD).refused == ["1 task(s) of these days are not finished"]
    assert exists(svc, f"task_registry_{label(OLD)}") and status_rows(svc, OLD) == 4
    assert one(svc, "SELECT count(*) FROM retention_exports WHERE lo_day = %s", day_of(OLD)) == 0
    assert list(list_all(make_store(svc.settings), ROOT + "/")) == []

    with svc.pool.connection() as conn:
        conn.execute("UPDATE task_status SET status = 'failed' WHERE task_id = %s", (live,))
    # 4 tasks' rows in each of five tables (registry, attempts, retries, events, status), and
    # the 2 audit rows.
    with pytest.raises(Invalid, match=r"nothing dropped: 22 row\(s\) of \d month\(s\).*--export"):
        job(svc).run(40, export=False)
    assert exists(svc, f"task_registry_{label(OLD)}")
    dry = job(svc).run(40, export=False, dry_run=True)
    assert {u.relname: u.rows for u in of(dry, OLD).units}[f"task_registry_{label(OLD)}"] == 4
    assert exists(svc, f"task_registry_{label(OLD)}")

    months = job(svc).run(40, export=False, no_export=True)
    assert {u.action for u in of(months, OLD).units} == {"dropped without export"}
    assert not exists(svc, f"task_registry_{label(OLD)}") and status_rows(svc, OLD) == 0
    assert list(list_all(make_store(svc.settings), ROOT + "/")) == []


def _old_run(svc: Services, day: date, n: int) -> tuple[UUID, list[UUID]]:
    a = admin(svc)
    svc.control.deploy(a, three_jobs("old"))
    run = uuid.uuid4()
    with svc.pool.connection() as conn:
        dag = one(svc, "SELECT dag_id FROM dags WHERE name = 'old'")
        conn.execute(
            "INSERT INTO trigger_fires (run_id, dag_id, dag_version, trigger, kind, fire_key,"
            " created_at) VALUES (%s, %s, 1, 'manual', 'manual', 'k', %s)",
            (run, dag, datetime(day.year, day.month, day.day, 11, tzinfo=UTC)),
        )
    return run, history(svc, day, LITE_ORG_ID, n, run=run, dag=dag)


def test_a_run_of_a_dropped_month_answers_exported_not_a_500(
    services: Services, api: httpx.Client
) -> None:
    svc = services
    run, ids = _old_run(svc, OLD + timedelta(days=4), 3)
    a = admin(svc)
    assert len(svc.control.show_run(a, run)["tasks"]) == 3
    job(svc).run(40, export=True)

    with pytest.raises(Gone, match=rf"run {run} is history: .*exported to {ROOT}/task_registry/"):
        svc.control.show_run(a, run)
    got = api.get(f"/v1/runs/{run}")
    assert got.status_code == 410, got.text
    assert got.json()["error"] == "exported"
    said = got.json()["message"]
    for table in RUN_TABLES:  # every history dataset of a run's rows is named
        assert f"_history_{table}" in said, (table, said)
    assert api.post(f"/v1/runs/{run}/cancel").status_code == 410
    # A task of it: not found, saying where tasks of that time went (the same words for any
    # task id, so it tells nothing of whether this one existed).
    with pytest.raises(NotFound, match=r"left Postgres by retention") as e:
        svc.control.get_task(a, ids[0])
    stranger = uuid.uuid4()
    with pytest.raises(NotFound) as e2:
        svc.control.get_task(a, stranger)
    assert str(e.value).replace(str(ids[0]), "?") == str(e2.value).replace(str(stranger), "?")
    r = api.get(f"/v1/tasks/{ids[0]}")
    assert r.status_code == 404 and "retention" in r.json()["message"]
    # Another org's admin and a user who may not deploy it still get "no run".
    _, eve = other_org(svc)
    with pytest.raises(NotFound, match=f"no run {run}"):
        svc.control.show_run(eve, run)


def test_history_is_queryable_by_each_org_admin_for_their_own_org_only(
    services: Services,
) -> None:
    svc = services
    org, eve = other_org(svc)
    mine = history(svc, OLD + timedelta(days=3), LITE_ORG_ID, 6)
    theirs = history(svc, OLD + timedelta(days=5), org, 2)
    job(svc).run(40, export=True)
    a = admin(svc)

    def q(actor: Actor, sql: str) -> list[list[Any]]:
        return svc.query.query(actor, sql).as_json()["rows"]  # type: ignore[no-any-return]

    got = q(a, "SELECT task_id FROM _history_task_registry ORDER BY task_id")
    assert [r[0] for r in got] == sorted(str(i) for i in mine)
    got = q(eve, "SELECT task_id FROM _history_task_registry ORDER BY task_id")
    assert [r[0] for r in got] == sorted(str(i) for i in theirs)
    got = q(
        eve,
        "SELECT count(*) FROM _history_task_status s JOIN _history_events e"
        " ON e.producer_task_id = s.task_id",
    )
    assert got == [[2]]
    # A user of the org who is no admin: as for a dataset that does not exist.
    carol, _ = user(svc, "carol", roles=["analyst"])
    with pytest.raises(NotFound, match="no dataset named '_history_task_registry'"):
        q(carol, "SELECT count(*) FROM _history_task_registry")
    with pytest.raises(NotFound, match="no dataset named '_history_nothing'"):
        q(a, "SELECT count(*) FROM _history_nothing")


def test_todays_run_tree_and_task_status_touch_only_todays_partitions(
    services: Services,
) -> None:
    """EXPLAIN: the run tree's every registry scan is planned on today's month's partition
    alone; a task's visibility and status read the registry partition of its own day only
    (pruned as they run: EXPLAIN ANALYZE shows every other partition never executed)."""
    svc = services
    history(svc, OLD, LITE_ORG_ID, 2)  # older partitions exist and hold rows
    a = admin(svc)
    svc.control.deploy(a, three_jobs("today"))
    fired = svc.control.trigger(a, "today")
    run, task = fired["run_id"], fired["tasks"][0]
    assert len(svc.control.show_run(a, run)["tasks"]) == 1
    today = f"_{datetime.now(UTC):%Y_%m}"
    with svc.pool.connection() as conn:
        f = conn.execute(Queries("dag_tasks").run_fire, {"run_id": run}).fetchone()
        assert f is not None
        params = {"run_id": run, "first_day": f["first_day"], "last_day": f["last_day"]}
        planned = _relations(conn, Queries("dag_tasks").run_tree, params, analyze=False)
        assert planned and all(r.endswith(today) for r in planned), planned
        for q, p in (
            (Queries("tasks").task_scope, {"task_id": task}),
            (Queries("dispatcher").task_view, {"task_id": task}),
        ):
            ran = _relations(conn, q, p, analyze=True)
            assert ran and all(r.endswith(today) for r in ran), ran


def _relations(conn: Any, query: str, params: dict[str, Any], *, analyze: bool) -> set[str]:
    """The time partitions a statement's plan scans (with `analyze`, those it ran at least once)."""
    opts = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    plan = conn.execute(f"EXPLAIN ({opts}) {query}", params).fetchone()["QUERY PLAN"]
    out: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        rel = node.get("Relation Name")
        if rel and rel.startswith(TABLES) and (not analyze or node.get("Actual Loops", 0) > 0):
            out.add(rel)
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return out


def _reaped(svc: Services) -> tuple[UUID, UUID]:
    """A task of OLD the reaper failed, its attempt lease_expired, its lease token kept (so its
    worker's late success would be accepted): (task id, lease token)."""
    [late, *_] = history(svc, OLD + timedelta(days=1), LITE_ORG_ID, 3, status="failed")
    token = uuid.uuid4()
    with svc.pool.connection() as conn:
        conn.execute(
            "UPDATE task_status SET lease_token = %s, last_error = 'lost its lease'"
            " WHERE task_id = %s",
            (token, late),
        )
        conn.execute(
            "UPDATE task_attempts SET lease_token = %s, outcome = 'lease_expired'"
            " WHERE task_id = %s",
            (token, late),
        )
    return late, token


def test_a_row_changed_in_place_after_the_export_is_exported_again_before_the_drop(
    services: Services,
) -> None:
    """A row rewritten in place after its export changes no key (as a reaped attempt's late
    success rewrites its outcome): a check of row count and key checksum alone dropped the
    partition with the export still holding the old row. It is checked row for row."""
    svc = services
    late, _ = _reaped(svc)
    changed: list[str] = []

    def change(at: str, unit: Unit) -> None:
        # After the month's last unit is exported, before any detach: complete_fast's update.
        if (at, unit.relname) == ("exported", f"task_status_{label(OLD)}") and not changed:
            with svc.pool.connection() as conn:
                conn.execute(
                    "UPDATE task_attempts SET outcome = 'succeeded' WHERE task_id = %s", (late,)
                )
            changed.append("succeeded")

    job(svc, hook=change).run(40, export=True)
    assert changed and not exists(svc, f"task_attempts_{label(OLD)}")
    store = make_store(svc.settings)
    attempts = [r for f in exported(store, "task_attempts", OLD).values() for r in f]
    assert {r["outcome"] for r in attempts if r["task_id"] == str(late)} == {"succeeded"}


def test_a_late_success_of_a_reaped_task_is_refused_once_its_month_is_being_exported(
    services: Services,
) -> None:
    """The reaper failed a task; its worker's success comes after the month's export began.
    Accepted (complete_fast takes a failed task's current lease), it rewrote the status row
    after its export: the row was never removed (changed since) nor exported again, left in
    Postgres without its registry, the history saying 'failed'. Retention fences the month's
    failed tasks first: the late report is refused, and the history is what Postgres held."""
    svc = services
    late, token = _reaped(svc)
    answers: list[str] = []

    def report(at: str, unit: Unit) -> None:
        if (at, unit.relname) == ("exported", f"task_status_{label(OLD)}") and not answers:
            try:
                svc.dispatcher.complete(
                    CompleteRequest(task_id=late, attempt=1, lease_token=token, outcome="succeeded")
                )
                answers.append("accepted")
            except Conflict as e:
                answers.append(e.code)

    job(svc, hook=report).run(40, export=True)
    assert status_rows(svc, OLD) == 0
    assert answers == ["wrong_lease"]
    store = make_store(svc.settings)
    status = [r for f in exported(store, "task_status", OLD).values() for r in f]
    assert {r["status"] for r in status if r["task_id"] == str(late)} == {"failed"}


def test_a_retry_by_hand_of_a_month_being_exported_is_refused(services: Services) -> None:
    """A run of OLD whose tasks failed, retried by hand while retention exports the month.
    Accepted, it queued them again after their status rows were exported: the rows were
    never removed (changed since), the registry month dropped under them, left queued in
    Postgres for ever, the history saying 'failed'. A retry of a run older than this month
    is refused while retention runs (and holds retention off while it commits)."""
    svc = services
    run, ids = _old_run(svc, OLD + timedelta(days=2), 2)
    with svc.pool.connection() as conn:  # tasks of the run's live version 1, failed
        conn.execute("UPDATE task_registry SET dag_version = 1 WHERE task_id = ANY(%s)", (ids,))
        conn.execute("UPDATE task_status SET status = 'failed' WHERE task_id = ANY(%s)", (ids,))
    answers: list[Any] = []

    def retry(at: str, unit: Unit) -> None:
        if (at, unit.relname) == ("exported", f"task_status_{label(OLD)}") and not answers:
            try:
                answers.append(svc.control.retry_run(admin(svc), run)["retried"])
            except Conflict as e:
                answers.append(e.code)

    job(svc, hook=retry).run(40, export=True)
    assert status_rows(svc, OLD) == 0
    assert answers == ["retention_running"]
    status = [r for f in exported(make_store(svc.settings), "task_status", OLD).values() for r in f]
    assert {r["status"] for r in status if r["task_id"] in {str(i) for i in ids}} == {"failed"}
    # Once retention is done, the run is history: its retry answers so.
    with pytest.raises(Gone):
        svc.control.retry_run(admin(svc), run)
