"""The cron scheduler: fires each (trigger, tick) exactly once, however many schedulers run.

Catch-up policy: after downtime, a trigger fires once, for the most recent missed tick; the
earlier missed ticks are skipped and counted in the run's input event (`skipped_ticks`), so a
long outage never floods the system with a backlog of runs.

Isolation: every trigger is handled in its own transaction; one that fails is rolled back,
logged and skipped, and the pass goes on with the others (deploy refuses schedules that cannot
fire, but a stored one that fails anyway must never stop anyone else's).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from croniter import croniter
from psycopg import Connection

from trace_platform import audit
from trace_platform.contract import TaskRef
from trace_platform.control.service import check_trigger_config
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.dag_tasks import fire
from trace_platform.errors import Conflict, Invalid, NotFound
from trace_platform.store.dag_tasks import DagTaskStore
from trace_platform.store.registry import RegistryStore

log = logging.getLogger(__name__)


# Ticks counted one by one after a silence; past it the latest is found from `now` backwards.
MAX_COUNTED_TICKS = 10_000


def due(schedule: str, after: datetime, now: datetime) -> tuple[datetime | None, int]:
    """The latest tick of `schedule` after `after` and at or before `now` (None: none), and how
    many ticks that is, counted up to MAX_COUNTED_TICKS (a count of that many: at least)."""
    it = croniter(schedule, after)
    latest, n = None, 0
    while n < MAX_COUNTED_TICKS:
        nxt = it.get_next(datetime)
        if nxt > now:
            return latest, n
        latest, n = nxt, n + 1
    # More ticks than counted: the latest is still `now`'s, never the last one counted (a run
    # for that would be fired again by the next delivery).
    back = croniter(schedule, now).get_prev(datetime)  # strictly before `now`
    at_now = croniter(schedule, back).get_next(datetime)
    return (at_now if at_now <= now else back), n


def tick(dispatcher: Dispatcher, now: datetime | None = None) -> int:
    """One pass over every cron trigger of every active DAG; returns how many runs it fired.

    Triggers are isolated: each is handled in its own transaction, and one that fails (a
    schedule that cannot fire, a spec that no longer loads, any error) is rolled back, logged
    and skipped; every other trigger of the pass still fires."""
    now = now or datetime.now(UTC)
    fired = 0
    with dispatcher.pool.connection() as conn:
        candidates = DagTaskStore(conn).cron_candidates().fetchall()
    keys = [(c["dag_id"], c["trigger"]) for c in candidates]
    for key, c in zip(keys, candidates, strict=True):
        try:
            if _tick_one(dispatcher, c, now):
                fired += 1
        except Exception as e:
            _report_failure(key, e)
        else:
            _failing.pop(key, None)
    for gone in _failing.keys() - set(keys):  # a trigger removed or deactivated while failing
        del _failing[gone]
    return fired


# (dag_id, trigger) -> (the error last logged, when): a trigger failing on every pass is
# logged as a warning when it starts failing, when its error changes, and every few minutes.
_failing: dict[tuple[Any, str], tuple[str, float]] = {}
REPEAT_WARNING_SECONDS = 300.0


def _report_failure(key: tuple[Any, str], e: Exception) -> None:
    text = f"{type(e).__name__}: {e}"
    last = _failing.get(key)
    now = time.monotonic()
    if last is None or last[0] != text or now - last[1] >= REPEAT_WARNING_SECONDS:
        _failing[key] = (text, now)
        log.warning("cron trigger %s of DAG %s skipped: %s", key[1], key[0], text)
    else:
        log.debug("cron trigger %s of DAG %s skipped again: %s", key[1], key[0], text)


def _tick_one(dispatcher: Dispatcher, c: dict[str, Any], now: datetime) -> bool:
    """Fires one trigger's latest due tick, in one transaction; True if it made a run."""
    with dispatcher.pool.connection() as conn, conn.transaction():
        row = DagTaskStore(conn).cron_lock(dag_id=c["dag_id"], trigger=c["trigger"]).fetchone()
        if row is None:
            return False  # another scheduler holds it right now
        cron = cron_trigger(conn, row, c["trigger"])
        if cron is None:
            return False  # the trigger was removed by a later deploy
        latest, count = due(cron["schedule"], _utc(row["last_fire_at"]), now)
        if latest is None:
            return False
        _, refs = _fire_latest(dispatcher, conn, row, cron, latest, count, by="scheduler")
        return bool(refs)


def cron_trigger(conn: Connection[Any], dag: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The cron trigger `name` of the DAG's active version, or None if it declares none."""
    spec = RegistryStore(conn).dag_version(dag_id=dag["dag_id"], version=dag["active_version"])
    row = spec.fetchone()
    triggers: list[dict[str, Any]] = row["spec"]["triggers"]["cron"] if row else []
    return next((t for t in triggers if t["name"] == name), None)


def _utc(at: datetime) -> datetime:
    # Schedules are UTC (dag/schema.py), whatever time zone the database session answers in.
    return at.astimezone(UTC)


def _fire_latest(
    dispatcher: Dispatcher,
    conn: Connection[Any],
    dag: dict[str, Any],
    cron: dict[str, Any],
    latest: datetime,
    count: int,
    config: dict[str, Any] | None = None,
    *,
    by: audit.PlatformActor,
) -> tuple[UUID, list[TaskRef]]:
    """Fires `latest`, the last of `count` due ticks (the earlier ones counted as skipped), and
    moves the trigger's cursor to it, in the caller's transaction, which holds the trigger's
    cron_state row. The fire key is the tick: a tick fires once, whoever delivers it and
    however often."""
    merged = {**cron.get("config", {}), **(config or {}), "scheduled_for": latest.isoformat()}
    if count > 1:
        merged["skipped_ticks"] = count - 1
    run_id, specs = fire(
        conn,
        dag=dag,
        trigger=cron["name"],
        kind="cron",
        fire_key=latest.isoformat(),
        config=merged,
        fired_by=None,
    )
    refs = dispatcher.create_tasks(list(specs), conn)
    DagTaskStore(conn).cron_advance(dag_id=dag["dag_id"], trigger=cron["name"], fire_at=latest)
    if specs:
        log.info("cron %s/%s fired run %s for %s", dag["name"], cron["name"], run_id, latest)
        audit.record(
            conn,
            by,
            "dag.trigger",
            dag["name"],
            {
                "trigger": cron["name"],
                "kind": "cron",
                "run_id": run_id,
                "tasks": len(refs),
                "scheduled_for": latest.isoformat(),
                "skipped_ticks": count - 1,
            },
            org_id=dag["org_id"],
        )
    return run_id, refs


def on_schedule(schedule: str, at: datetime) -> datetime | None:
    """`at` as a tick of `schedule` (in UTC; to the minute for a 5-field schedule, whose ticks
    have no seconds, to the second for a 6-field one), or None when the schedule has no tick
    then. The ticks are the scheduler's own (`due`)."""
    at = _utc(at).replace(microsecond=0)
    if len(schedule.split()) != 6:
        at = at.replace(second=0)
    return at if due(schedule, at - timedelta(seconds=1), at) == (at, 1) else None


# How far ahead of this clock an outside scheduler's tick may be (its clock and ours differ).
EARLY_TICK = timedelta(minutes=5)


def fire_scheduled(
    dispatcher: Dispatcher,
    *,
    org: str,
    dag: str,
    trigger: str,
    at: datetime,
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One tick of a DAG's cron trigger delivered by an outside scheduler (EventBridge: see
    aws/eventbridge.py), fired as `tick()` fires it: once per (trigger, tick), however often
    it is delivered, and never for a tick at or before the trigger's last fire (the
    scheduler's catch-up skips those too). A paused DAG's tick is skipped. Refused, with
    nothing stored: an unknown org, DAG or cron trigger, an undeployed DAG, a time that is no
    tick of the trigger's schedule, a tick in the future, a config over the trigger limit.

    Returns the run (`run_id`, `created`: a new run was made, `tasks`) or why none was
    (`skipped`)."""
    if _utc(at) > datetime.now(UTC) + EARLY_TICK:
        raise Invalid(
            f"{at.isoformat()} is in the future: a schedule delivers a tick when it comes "
            f"(at most {EARLY_TICK.seconds} s early, for clock skew)"
        )
    if config:
        check_trigger_config(config)
    with dispatcher.pool.connection() as conn, conn.transaction():
        found = DagTaskStore(conn).dag_in_org(org=org, dag=dag).fetchone()
        if found is None:
            raise NotFound(f"no DAG named '{dag}' in org '{org}'")
        row = DagTaskStore(conn).cron_lock_wait(dag_id=found["dag_id"], trigger=trigger)
        locked = row.fetchone()
        cron = cron_trigger(conn, locked, trigger) if locked else None
        if locked is None or locked["active_version"] is None or cron is None:
            if found["active_version"] is None:
                raise Conflict("not_deployed", f"DAG '{dag}' has no active version")
            raise NotFound(f"DAG '{dag}' has no cron trigger '{trigger}'")
        tick = on_schedule(cron["schedule"], at)
        if tick is None:
            raise Invalid(
                f"{at.isoformat()} is not a tick of trigger '{trigger}' of DAG '{dag}' (schedule "
                f"'{cron['schedule']}', UTC): the schedule that delivers it must fire when the "
                "trigger does"
            )
        key = {"dag_id": locked["dag_id"], "trigger": trigger}
        done = DagTaskStore(conn).fire_by_key(**key, fire_key=tick.isoformat()).fetchone()
        if done is not None:
            return {"run_id": done["run_id"], "created": False, "tasks": []}
        last = _utc(locked["last_fire_at"])
        if locked["paused"]:
            return {"run_id": None, "created": False, "tasks": [], "skipped": "the DAG is paused"}
        if tick <= last:
            return {
                "run_id": None,
                "created": False,
                "tasks": [],
                "skipped": f"the trigger last fired for {last.isoformat()}, at or after this tick",
            }
        _, count = due(cron["schedule"], last, tick)
        run_id, refs = _fire_latest(
            dispatcher, conn, locked, cron, tick, count, config, by="eventbridge"
        )
    return {"run_id": run_id, "created": bool(refs), "tasks": [r.task_id for r in refs]}


def run_scheduler(dispatcher: Dispatcher, stop: threading.Event, interval: float = 1.0) -> None:
    while not stop.is_set():
        try:
            tick(dispatcher)
        except Exception as e:  # keep scheduling after any transient failure
            log.warning("scheduler: %s", e)
        stop.wait(interval)
