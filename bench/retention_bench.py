"""Retention of a month of task history (issue 42): `trace admin retention --export`'s work
(retention/run.py) over one old month of N tasks (default 1,000,000: N rows each of
task_registry, task_status, task_attempts and events, made with generate_series), while a
thread keeps creating tasks through the Dispatcher (10 a transaction: registry, status and
outbox rows in today's partitions of the very tables being detached), and what that costs them.
The retention runs in a process of its own, as `trace admin retention` does (the creations
stand for the API's and workers' processes): in the creating thread's process, the export's
long GIL holds (psycopg decoding a batch of 50,000 rows, pyarrow converting it) stalled
creations for up to ~470 ms, a pause no API process ever sees.

Prints: the retention's wall time and rows per second, the task creations per second before and
during it, and the longest single creation before and during it (a pause in throughput shows
there: a DETACH or DROP that locked the parent tables would hold every creation behind it).
Refuses to print unless the work it timed is checked: the month's partitions are gone, each
table's export holds exactly N rows read back from the store, N task ids exported once each,
the month's status rows gone, and every task created during the run is in Postgres.

Run: `.venv/bin/python bench/retention_bench.py [--tasks 1000000]`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq

import smoke  # this folder's: run as a script
from embedded_pg import migrated_postgres  # this folder's
from trace_platform.config import Settings
from trace_platform.contract import LITE_ORG_ID, TaskSpec
from trace_platform.objectstore import list_all, make_store
from trace_platform.query.engine import local_path
from trace_platform.retention.export import ROOT
from trace_platform.retention.run import MonthResult, Retention
from trace_platform.retention.units import day_of
from trace_platform.services import Services

FILL = [
    """INSERT INTO task_registry (task_id, start_day, org_id, job, operator, runtime, config,
         timeout_seconds, max_attempts, retry_backoff_seconds, retry_backoff_max_seconds,
         created_at)
       SELECT gen_random_uuid(), %(lo)s + (g %% 28), %(org)s, 'bench', 'noop', 'ecs_platform',
              jsonb_build_object('i', g), 60, 3, 1, 10, %(at)s
       FROM generate_series(1, %(n)s) g""",
    """INSERT INTO task_status (task_id, start_day, status, attempt, finished_at, updated_at)
       SELECT task_id, start_day, 'succeeded', 1, %(at)s, %(at)s FROM task_registry
       WHERE start_day >= %(lo)s AND start_day < %(lo)s + 28""",
    """INSERT INTO task_attempts (task_id, start_day, attempt, lease_token, started_at,
         finished_at, outcome)
       SELECT task_id, start_day, 1, gen_random_uuid(), %(at)s, %(at)s, 'succeeded'
       FROM task_registry WHERE start_day >= %(lo)s AND start_day < %(lo)s + 28""",
    """INSERT INTO events (event_id, start_day, org_id, producer_task_id, producer_attempt,
         dataset_uuid, dedupe_key, range_start, range_end)
       SELECT gen_random_uuid(), start_day, org_id, task_id, 1, gen_random_uuid(),
              'range:' || task_id, 0, 1
       FROM task_registry WHERE start_day >= %(lo)s AND start_day < %(lo)s + 28""",
]
TABLES = ("task_registry", "task_status", "task_attempts", "events")


def old_month() -> datetime:
    d = datetime.now(UTC).replace(day=1, hour=12, minute=0, second=0, microsecond=0)
    for _ in range(3):
        d = (d - timedelta(days=1)).replace(day=1)
    return d


class Creator(threading.Thread):
    """Creates tasks, 10 a transaction, timing each, until stopped."""

    def __init__(self, svc: Services) -> None:
        super().__init__(daemon=True)
        self.svc = svc
        self.stop = threading.Event()
        self.times: list[tuple[float, float]] = []  # (when it ended, how long it took)
        # As text: a str is no object the cyclic GC tracks; 100,000s of UUIDs made this process's
        # own full collections (~0.2 s each) the longest "pauses" of creation.
        self.ids: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        noop = TaskSpec(job="bench", operator="noop")
        try:
            while not self.stop.is_set():
                t0 = time.monotonic()
                refs = self.svc.dispatcher.create_tasks([(noop, "queued")] * 10)
                t1 = time.monotonic()
                self.times.append((t1, t1 - t0))
                self.ids += [str(r.task_id) for r in refs]
        except BaseException as e:
            self.error = e

    def window(self, a: float, b: float) -> tuple[float, float]:
        """(tasks created per second, the longest creation in ms) between a and b."""
        took = [d for t, d in self.times if a <= t <= b]
        if not took:
            return 0.0, float("inf")
        return 10 * len(took) / (b - a), 1000 * max(took)

    def per_second(self, a: float, b: float) -> list[int]:
        """Tasks created in each whole second from a to b (a pause shows as a low one)."""
        counts = [0] * int(b - a)
        for t, _ in self.times:
            if a <= t < a + len(counts):
                counts[int(t - a)] += 10
        return counts


def _ready() -> None:
    """Nothing: the retention process started, its imports done, before any window is timed."""


def _retain(dsn: str, home: Path, older_than_days: int) -> tuple[float, float, list[MonthResult]]:
    """The retention, in its own process: (when it began, when it ended, its months). The
    times are time.monotonic(), one clock for every process of the machine."""
    store = make_store(Settings(state_dsn=dsn, home=home, auth="permissive"))
    t0 = time.monotonic()
    months = Retention(dsn, store).run(older_than_days, export=True)
    return t0, time.monotonic(), months


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tasks", type=int, default=1_000_000, help="tasks in the old month")
    ap.add_argument("--baseline", type=float, default=5.0, help="seconds of creations before")
    args = smoke.parse_args(ap, argv, tasks=2_000, baseline=0.5)
    with migrated_postgres("trace-retention-bench-") as (root, dsn):
        settings = Settings(state_dsn=dsn, home=root / "home", auth="permissive")
        svc = Services.build(settings, dsn)
        try:
            return _run(svc, dsn, args.tasks, args.baseline, root)
        finally:
            svc.close()


def _run(svc: Services, dsn: str, n: int, baseline: float, root: Path) -> int:
    month = old_month()
    lo = day_of(month.date())
    label = month.strftime("%Y_%m")
    with svc.pool.connection() as conn:
        conn.execute("SELECT trace_ensure_partitions(2, 4)")
        for q in FILL:
            conn.execute(q, {"lo": lo, "org": LITE_ORG_ID, "at": month, "n": n})  # type: ignore[arg-type]
        conn.commit()
        conn.execute("ANALYZE")
    store = make_store(svc.settings)
    older_than = (datetime.now(UTC).date() - month.date()).days - 31
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(_ready).result()
        creator = Creator(svc)
        creator.start()
        time.sleep(baseline)
        t0, t1, months = pool.submit(_retain, dsn, svc.settings.home, older_than).result()
    time.sleep(baseline / 5)
    creator.stop.set()
    creator.join()
    if creator.error is not None:
        raise creator.error

    # The work timed, checked.
    with svc.pool.connection() as conn:
        for t in ("task_registry", "task_attempts", "events"):
            gone = conn.execute("SELECT to_regclass(%s) IS NULL AS g", (f"{t}_{label}",))
            assert gone.fetchone()["g"], f"{t}_{label} is still there"  # type: ignore[index]
        left = conn.execute(
            "SELECT count(*) AS n FROM task_status WHERE start_day >= %s AND start_day < %s",
            (lo, lo + 28),
        ).fetchone()
        assert left is not None and left["n"] == 0, left
        made = conn.execute(
            "SELECT count(*) AS n FROM task_registry WHERE task_id = ANY(%s::uuid[])",
            (creator.ids,),
        ).fetchone()
        assert made is not None and made["n"] == len(creator.ids), "a created task is missing"
    exported_ids: set[str] = set()
    for t in TABLES:
        files = list(list_all(store, f"{ROOT}/{t}/{label}/"))
        rows = sum(pq.ParquetFile(local_path(store.uri(f.key))).metadata.num_rows for f in files)
        assert rows == n, f"{t}: {rows} rows exported, {n} made"
        if t == "task_registry":
            for f in files:
                col = pq.read_table(local_path(store.uri(f.key)), columns=["task_id"])
                exported_ids.update(col.column(0).to_pylist())
    assert len(exported_ids) == n, "task ids exported more or less than once"
    units = [u for m in months for u in m.units if u.relname.endswith(label)]
    assert {u.relname for u in units} >= {f"{t}_{label}" for t in TABLES}

    before = creator.window(t0 - baseline, t0)
    during = creator.window(t0, t1)
    per = [d for t, d in creator.times if t0 <= t <= t1]
    print(
        f"retention of a month of {n:,} tasks ({4 * n:,} rows in 4 tables): {t1 - t0:.1f} s, "
        f"{4 * n / (t1 - t0):,.0f} rows/s"
    )
    print(
        f"task creations (10 a transaction) before: {before[0]:,.0f}/s, longest {before[1]:.1f} ms"
    )
    print(
        f"task creations during retention:        {during[0]:,.0f}/s, longest {during[1]:.1f} ms"
        f" (median {1000 * statistics.median(per) if per else float('nan'):.1f} ms)"
    )
    if seconds := creator.per_second(t0, t1):
        print(
            f"  per second during: min {min(seconds):,}, median "
            f"{statistics.median(seconds):,.0f} (over {len(seconds)} s)"
        )
    print(
        f"ratio during/before: {during[0] / before[0]:.2f}x throughput; "
        f"longest pause {during[1]:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    smoke.main(main)
