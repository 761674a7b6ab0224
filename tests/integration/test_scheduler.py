"""The cron scheduler isolates triggers: one that fails (a schedule that can never fire, one
croniter cannot read, a spec that no longer loads, an error while firing) is rolled back,
logged and skipped, and every other trigger keeps firing."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.dags import admin
from trace_platform.dispatcher import dag_tasks
from trace_platform.services import Services
from trace_platform.triggers import cron

GOOD = """
name: good
jobs:
  a: {operator: noop}
triggers:
  cron: [{name: every_second, schedule: "* * * * * *"}]
"""

BROKEN = """
name: {name}
jobs:
  a: {{operator: noop}}
triggers:
  cron: [{{name: {trigger}, schedule: "* * * * *"}}]
"""


def _q(services: Services, sql: str, *args: Any) -> list[dict[str, Any]]:
    with services.pool.connection() as conn:
        return conn.execute(sql, list(args)).fetchall()


def fires(services: Services, trigger: str) -> int:
    rows = _q(services, "SELECT count(*) AS n FROM trigger_fires WHERE trigger = %s", trigger)
    return int(rows[0]["n"])


def corrupt(services: Services, dag: str, sql_set: str, *args: Any) -> None:
    """Rewrites a deployed DAG's stored spec behind deploy's back (what an older release, a
    bug or a hand edit could leave behind)."""
    with services.pool.connection() as conn:
        n = conn.execute(
            f"UPDATE dag_versions SET spec = {sql_set} "
            "WHERE dag_id = (SELECT dag_id FROM dags WHERE name = %s)",
            [*args, dag],
        ).rowcount
    assert n == 1


@pytest.fixture
def deployed(services: Services, monkeypatch: pytest.MonkeyPatch) -> Services:
    """The valid per-second trigger, and four failing ones that every pass meets before it."""
    me = admin(services)
    for name, trigger in [
        ("impossible", "a_impossible"),
        ("garbage", "a_garbage"),
        ("unloadable", "a_unloadable"),
        ("exploding", "a_exploding"),
    ]:
        services.control.deploy(me, BROKEN.format(name=name, trigger=trigger))
    services.control.deploy(me, GOOD)
    # 30 February: valid syntax, never fires (croniter raises CroniterBadDateError).
    corrupt(
        services,
        "impossible",
        "jsonb_set(spec, '{triggers,cron,0,schedule}', to_jsonb(%s::text))",
        "0 0 30 2 *",
    )
    corrupt(  # croniter cannot parse it at all
        services,
        "garbage",
        "jsonb_set(spec, '{triggers,cron,0,schedule}', to_jsonb(%s::text))",
        "every full moon",
    )
    corrupt(services, "unloadable", "jsonb_set(spec, '{triggers}', 'null'::jsonb)")
    real_fire = dag_tasks.fire

    def fire(conn: Any, **kw: Any) -> Any:
        if kw["trigger"] == "a_exploding":
            raise RuntimeError("boom while firing")
        return real_fire(conn, **kw)

    monkeypatch.setattr(cron, "fire", fire)
    # Every pass handles the failing triggers first (their names sort before the good one's).
    from trace_platform.store import dag_tasks as dag_task_store

    queries = dag_task_store._Q
    ordered = queries.cron_candidates.strip().rstrip(";") + " ORDER BY cs.trigger"

    class Ordered:
        cron_candidates = ordered

        def __getattr__(self, name: str) -> Any:
            return getattr(queries, name)

    monkeypatch.setattr(dag_task_store, "_Q", Ordered())
    monkeypatch.setattr(cron, "_failing", {})
    return services


FAILING = ("a_exploding", "a_garbage", "a_impossible", "a_unloadable")


def test_failing_triggers_do_not_stop_the_others(
    deployed: Services, caplog: pytest.LogCaptureFixture
) -> None:
    d = deployed.dispatcher
    caplog.set_level(logging.WARNING, logger=cron.log.name)
    now = datetime.now(UTC)
    assert cron.tick(d, now + timedelta(seconds=3)) == 1
    assert cron.tick(d, now + timedelta(seconds=6)) == 1
    assert cron.tick(d, now + timedelta(minutes=2)) == 1  # caught up: one run, the rest counted
    assert fires(deployed, "every_second") == 3
    assert all(fires(deployed, t) == 0 for t in FAILING)
    # Each failure is logged (once while it keeps failing the same way), naming its trigger.
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert sorted(m.split()[2] for m in skipped) == sorted(FAILING), skipped
    assert any("CroniterBadDateError" in m for m in skipped), skipped
    assert any("boom while firing" in m for m in skipped), skipped
    # A failing trigger's transaction rolled back: nothing half-fired, its cursor unmoved.
    rows = _q(deployed, "SELECT count(*) AS n FROM trigger_fires WHERE trigger = 'a_exploding'")
    assert rows[0]["n"] == 0
    (tasks,) = _q(deployed, "SELECT count(*) AS n FROM task_registry")
    assert tasks["n"] == 3  # one source task per good run, none from a failing trigger


def test_a_per_second_cron_keeps_firing_in_the_running_scheduler(deployed: Services) -> None:
    stop = threading.Event()
    thread = threading.Thread(
        target=cron.run_scheduler, args=(deployed.dispatcher, stop, 0.2), daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while fires(deployed, "every_second") < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        thread.join(10)
    assert fires(deployed, "every_second") >= 3
    assert all(fires(deployed, t) == 0 for t in FAILING)


def test_a_trigger_that_recovers_fires_again(deployed: Services) -> None:
    d = deployed.dispatcher
    now = datetime.now(UTC)
    cron._failing[(0, "a_removed")] = ("RuntimeError: x", 0.0)  # no longer a candidate
    cron.tick(d, now + timedelta(seconds=2))
    assert fires(deployed, "a_impossible") == 0
    assert "a_removed" not in {k[1] for k in cron._failing}  # forgotten once it is gone
    corrupt(
        deployed,
        "impossible",
        "jsonb_set(spec, '{triggers,cron,0,schedule}', to_jsonb(%s::text))",
        "* * * * *",
    )
    cron.tick(d, now + timedelta(minutes=2))
    assert fires(deployed, "a_impossible") == 1
    assert not any(k[1] == "a_impossible" for k in cron._failing)
