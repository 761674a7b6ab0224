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
from datetime import UTC, datetime
from typing import Any

from croniter import croniter

from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.dag_tasks import fire
from trace_platform.store.dag_tasks import DagTaskStore
from trace_platform.store.registry import RegistryStore

log = logging.getLogger(__name__)


def due_ticks(schedule: str, after: datetime, now: datetime, cap: int = 10_000) -> list[datetime]:
    it = croniter(schedule, after)
    out: list[datetime] = []
    while len(out) < cap:
        nxt = it.get_next(datetime)
        if nxt > now:
            break
        out.append(nxt)
    return out


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
        spec = (
            RegistryStore(conn)
            .dag_version(dag_id=row["dag_id"], version=row["active_version"])
            .fetchone()
        )
        cron: dict[str, Any] | None = (
            next((t for t in spec["spec"]["triggers"]["cron"] if t["name"] == c["trigger"]), None)
            if spec
            else None
        )
        if cron is None:
            return False  # the trigger was removed by a later deploy
        ticks = due_ticks(cron["schedule"], row["last_fire_at"], now)
        if not ticks:
            return False
        latest = ticks[-1]
        config = {**cron.get("config", {}), "scheduled_for": latest.isoformat()}
        if len(ticks) > 1:
            config["skipped_ticks"] = len(ticks) - 1
        run_id, specs = fire(
            conn,
            dag=row,
            trigger=c["trigger"],
            kind="cron",
            fire_key=latest.isoformat(),
            config=config,
            fired_by=None,
        )
        dispatcher.create_tasks(list(specs), conn)
        DagTaskStore(conn).cron_advance(dag_id=c["dag_id"], trigger=c["trigger"], fire_at=latest)
        if specs:
            log.info("cron %s/%s fired run %s for %s", row["name"], c["trigger"], run_id, latest)
        return bool(specs)


def run_scheduler(dispatcher: Dispatcher, stop: threading.Event, interval: float = 1.0) -> None:
    while not stop.is_set():
        try:
            tick(dispatcher)
        except Exception as e:  # keep scheduling after any transient failure
            log.warning("scheduler: %s", e)
        stop.wait(interval)
