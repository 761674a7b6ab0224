"""What retention may take: the months of history older than a cutoff, each one unit per
table (a partition of a start_day-partitioned table, and the month's task_status rows), and
what refuses a month (live work, a rebuild in flight, the current or previous month)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from psycopg import Connection

from trace_platform.errors import Invalid
from trace_platform.store.retention import RetentionStore

EPOCH = date(2025, 1, 1)  # start_day 0 (migration 0002, trace_start_day)
REGISTRY = "task_registry"
STATUS = "task_status"
# Dropped in this order, the registry last: the other units' exports take their org from it.
DROP_ORDER = {REGISTRY: 2}
_BOUND = re.compile(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")


def day_of(d: date) -> int:
    return (d - EPOCH).days


def date_of(day: int) -> date:
    return EPOCH + timedelta(days=day)


def today_day(now: datetime | None = None) -> int:
    return day_of((now or datetime.now(UTC)).astimezone(UTC).date())


def month_start_day(day: int) -> int:
    """The first day of `day`'s month."""
    return day_of(date_of(day).replace(day=1))


def month_label(lo: int) -> str:
    return date_of(lo).strftime("%Y_%m")


@dataclass(frozen=True)
class Unit:
    """One table's rows of one month: `relname` a partition (or, for task_status, the name its
    export is recorded under), `parent` the table queries name, [lo, hi) its start days."""

    relname: str
    parent: str
    lo: int
    hi: int
    detach_pending: bool = False

    @property
    def is_partition(self) -> bool:
        return self.parent != STATUS

    @property
    def status_range(self) -> tuple[int, int] | None:
        return None if self.is_partition else (self.lo, self.hi)


@dataclass
class Month:
    """Every unit of one range of start days, and why it may not go (empty: it may)."""

    lo: int
    hi: int
    units: list[Unit] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{date_of(self.lo):%Y-%m-%d}..{date_of(self.hi - 1):%Y-%m-%d}"

    @property
    def registry(self) -> str | None:
        return next((u.relname for u in self.units if u.parent == REGISTRY), None)

    def drop_order(self) -> list[Unit]:
        return sorted(
            (u for u in self.units if u.is_partition), key=lambda u: DROP_ORDER.get(u.parent, 1)
        )


def parse_bound(bound: str) -> tuple[int, int]:
    m = _BOUND.search(bound)
    if m is None:
        raise Invalid(f"unexpected partition bound {bound!r} (retention takes FROM (a) TO (b))")
    return int(m[1]), int(m[2])


def plan(conn: Connection[Any], older_than_days: int, now: datetime | None = None) -> list[Month]:
    """The months wholly older than `older_than_days` days, oldest first, each with its units
    and its refusals. Never the current month (it still takes new tasks), whatever the
    cutoff; an exported month is never made again (trace_ensure_partitions, migration 0037)."""
    if older_than_days < 1:
        raise Invalid("--older-than must be at least 1 day")
    store = RetentionStore(conn)
    today = today_day(now)
    cutoff = min(today - older_than_days, month_start_day(today))
    months: dict[tuple[int, int], Month] = {}
    for row in store.partitions().fetchall():
        lo, hi = parse_bound(row["bound"])
        if hi > cutoff:
            continue
        month = months.setdefault((lo, hi), Month(lo, hi))
        month.units.append(Unit(row["relname"], row["parent"], lo, hi, row["detach_pending"]))
    # Exports recorded but not finished (a crash after a detach): their tables are no longer
    # partitions, so the catalog does not list them.
    for x in store.exports().fetchall():
        if x["dropped_at"] is not None or x["hi_day"] > cutoff:
            continue
        month = months.setdefault((x["lo_day"], x["hi_day"]), Month(x["lo_day"], x["hi_day"]))
        if all(u.relname != x["relname"] for u in month.units):
            month.units.append(Unit(x["relname"], x["parent"], x["lo_day"], x["hi_day"]))
    building = [r["name"] for r in store.building_dags().fetchall()]
    for (lo, hi), month in months.items():
        if month.registry is not None and all(u.parent != STATUS for u in month.units):
            month.units.append(Unit(f"{STATUS}_{month_label(lo)}", STATUS, lo, hi))
        live = store.live_tasks(lo=lo, hi=hi).fetchone()
        if live and live["n"]:
            month.refused.append(f"{live['n']} task(s) of these days are not finished")
        if building:
            month.refused.append(
                f"DAG(s) {', '.join(building)} are rebuilding (a rebuild replays the events "
                "Postgres holds): cut over or roll back first"
            )
        month.units.sort(key=lambda u: u.relname)
    return [months[k] for k in sorted(months)]
