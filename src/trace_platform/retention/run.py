"""`trace admin retention`: each month older than the cutoff exported (every unit, checked as
read back), recorded, then detached and dropped, partition by partition, the registry last;
then its task_status rows removed by key in small batches. Never a DELETE over the
partitioned history.

Crash-safe by its records (retention_exports): a unit is recorded only once its files read back,
a recorded one is not exported again, and before a drop the detached table is checked against
its record (same rows, same key checksum), re-exported if it changed. So a run stopped anywhere
is run again: it finishes what was begun, duplicating and losing nothing."""

from __future__ import annotations

import getpass
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from uuid import UUID

import psycopg
import pyarrow.parquet as pq
from psycopg.rows import dict_row

from trace_platform import audit
from trace_platform.errors import Conflict, Invalid
from trace_platform.objectstore import ObjectStore, list_all
from trace_platform.retention.export import Export, RetentionError, export_unit, unit_prefix
from trace_platform.retention.units import STATUS, Month, Unit, plan
from trace_platform.store.retention import RetentionStore

STATUS_BATCH = 5_000  # task_status rows removed per transaction: short, so no task waits on it


class Progress(Protocol):
    def start(self, description: str, total: int | None) -> None: ...

    def advance(self, rows: int) -> None: ...


class _Quiet:
    def start(self, description: str, total: int | None) -> None:
        pass

    def advance(self, rows: int) -> None:
        pass


@dataclass
class UnitResult:
    relname: str
    rows: int
    files: int
    action: str  # 'would export' | 'exported' | 'dropped' | 'dropped without export' ...


@dataclass
class MonthResult:
    label: str
    refused: list[str]
    units: list[UnitResult] = field(default_factory=list)


# Test hook: called with (step, unit) between the steps of a unit ("uploaded": its files are
# in the store, unrecorded; "exported", "detached", "dropped"), so a test can stop a run
# exactly there, as a crash would.
Hook = Callable[[str, Unit], None]


@dataclass
class Retention:
    dsn: str  # the state DSN: detaching and dropping are the tables' owner's to do
    store: ObjectStore
    progress: Progress = field(default_factory=_Quiet)
    batch_rows: int = 50_000
    hook: Hook | None = None

    def run(
        self,
        older_than_days: int,
        *,
        export: bool,
        no_export: bool = False,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> list[MonthResult]:
        if export and no_export:
            raise Invalid("--export and --no-export contradict each other")
        with psycopg.connect(self.dsn, row_factory=dict_row, autocommit=True) as conn:
            # Row checksums are over the rows' text: timestamps printed as the export's are.
            conn.execute("SET TIME ZONE 'UTC'")
            rs = RetentionStore(conn)
            if dry_run:
                return [self._dry(conn, m) for m in plan(conn, older_than_days, now)]
            if not export and not no_export:
                months = plan(conn, older_than_days, now)
                rows = sum(self._count(conn, u) for m in months if not m.refused for u in m.units)
                raise Invalid(
                    f"nothing dropped: {rows} row(s) of {len(months)} month(s) would be deleted "
                    "for good. Pass --export to export them to the object store first (they stay "
                    "queryable as history), or --no-export to drop them unexported"
                )
            if not rs.try_lock():
                raise Conflict(
                    "retention_running",
                    "another retention run (or a retry of an old run) is under way",
                )
            try:
                # Planned under the lock: a retry by hand of an old run (which requeues finished
                # tasks) committed before it is seen live here, and none lands after it.
                months = plan(conn, older_than_days, now)
                return [self._month(conn, m, export=export, days=older_than_days) for m in months]
            finally:
                rs.unlock()

    def _count(self, conn: psycopg.Connection[Any], unit: Unit) -> int:
        rs = RetentionStore(conn)
        key = _key(rs, unit)
        table = unit.relname if unit.is_partition else unit.parent
        if not rs.columns(table=table).fetchall():
            return 0
        return int(rs.count_and_checksum(table=table, key=key, status_range=unit.status_range)["n"])

    def _dry(self, conn: psycopg.Connection[Any], month: Month) -> MonthResult:
        result = MonthResult(month.label, month.refused)
        for u in month.units:
            action = "refused" if month.refused else "would export and drop"
            result.units.append(UnitResult(u.relname, self._count(conn, u), 0, action))
        return result

    def _month(
        self, conn: psycopg.Connection[Any], month: Month, *, export: bool, days: int
    ) -> MonthResult:
        result = MonthResult(month.label, month.refused)
        if month.refused:
            for u in month.units:
                result.units.append(UnitResult(u.relname, 0, 0, "refused"))
            return result
        rs = RetentionStore(conn)
        # Before anything is read: no late report of a reaped task changes the month after.
        rs.fence_failed(lo=month.lo, hi=month.hi)
        for u in month.units:
            if rs.export_of(relname=u.relname).fetchone() is None:
                self._export(conn, u, month, export=export)
        attached = {r["relname"] for r in rs.partitions().fetchall()}
        # The month's audit rows commit with the last unit's drop: a month dropped has them, and
        # a run stopped before it records them when it is run again.
        steps = month.drop_order() + [u for u in month.units if not u.is_partition]
        last = steps[-1] if steps else None

        def done(unit: Unit) -> None:
            if unit == last:
                self._audit(conn, month, export=export, days=days)

        for u in month.drop_order():
            self._drop(conn, u, month, attached=u.relname in attached, export=export, done=done)
        for u in month.units:
            if not u.is_partition:
                self._remove_status(conn, u, done=done)
        for u in month.units:
            rec = rs.export_of(relname=u.relname).fetchone()
            assert rec is not None
            files = len(rs.files_of(relname=u.relname).fetchall())
            action = "exported and dropped" if export else "dropped without export"
            result.units.append(UnitResult(u.relname, int(rec["row_count"]), files, action))
        return result

    def _export(
        self, conn: psycopg.Connection[Any], unit: Unit, month: Month, *, export: bool
    ) -> Export | None:
        """Exports and records `unit` (or, unexported, records its count alone)."""
        rs = RetentionStore(conn)
        if not export:
            self.progress.start(f"counting {unit.relname}", None)
            key = _key(rs, unit)
            table = unit.relname if unit.is_partition else unit.parent
            c = rs.count_and_checksum(table=table, key=key, status_range=unit.status_range)
            with conn.transaction():
                _record(
                    rs,
                    unit,
                    UUID(int=0),
                    "",
                    int(c["n"]),
                    c["checksum"],
                    c["row_checksum"],
                    c["at"],
                )
            return None
        ex = export_unit(
            self.dsn,
            self.store,
            unit,
            registry=month.registry,
            batch_rows=self.batch_rows,
            # The export's own count is the bar's total: a count of its own would be one more
            # scan of the whole unit (md5 of every key), ~15% of a month's retention.
            on_count=lambda n: self.progress.start(f"exporting {unit.relname}", n),
            on_rows=self.progress.advance,
        )
        if self.hook is not None:
            self.hook("uploaded", unit)
        with conn.transaction():
            _record(
                rs, unit, ex.export_id, ex.prefix, ex.row_count, ex.checksum, ex.row_checksum, ex.at
            )
            for f in ex.files:
                rs.record_file(
                    relname=unit.relname,
                    key=f.key,
                    org_id=f.org_id,
                    row_count=f.row_count,
                    size=f.size,
                    sha256=f.sha256,
                )
        # Earlier tries of this unit (a crash before their record) are nobody's: remove them.
        for o in list_all(self.store, unit_prefix(unit) + "/"):
            if not o.key.startswith(ex.prefix + "/"):
                self.store.delete(o.key)
        if self.hook is not None:
            self.hook("exported", unit)
        return ex

    def _drop(
        self,
        conn: psycopg.Connection[Any],
        unit: Unit,
        month: Month,
        *,
        attached: bool,
        export: bool,
        done: Callable[[Unit], None],
    ) -> None:
        rs = RetentionStore(conn)
        rec = rs.export_of(relname=unit.relname).fetchone()
        assert rec is not None, f"{unit.relname} dropped unrecorded"
        if rec["dropped_at"] is not None:
            return
        exists = bool(rs.columns(table=unit.relname).fetchall())
        if not exists:  # dropped by a run stopped before recording it
            with conn.transaction():
                rs.mark_dropped(relname=unit.relname)
                done(unit)
            return
        self.progress.start(f"detaching {unit.relname}", None)
        if unit.detach_pending:
            rs.detach(parent=unit.parent, part=unit.relname, finalize=True)
        elif attached:
            rs.detach(parent=unit.parent, part=unit.relname)
        if self.hook is not None:
            self.hook("detached", unit)
        now = _figures(rs.count_and_checksum(table=unit.relname, key=_key(rs, unit)))
        if now != _recorded(rec):
            # Rows landed or changed in place (a reaped attempt's late success: no key moves)
            # between the export and the detach: export the detached (now fixed) table again;
            # its record replaces the first one.
            self._export(conn, unit, month, export=export)
            rec = rs.export_of(relname=unit.relname).fetchone()
            assert rec is not None
            if now != _recorded(rec):
                raise RetentionError(f"{unit.relname} changed while detached: not dropped")
        self.progress.start(f"dropping {unit.relname}", None)
        with conn.transaction():
            rs.drop_table(part=unit.relname)
            rs.mark_dropped(relname=unit.relname)
            done(unit)
        if self.hook is not None:
            self.hook("dropped", unit)

    def _remove_status(
        self, conn: psycopg.Connection[Any], unit: Unit, *, done: Callable[[Unit], None]
    ) -> None:
        """task_status is hash-partitioned by task id: no month of it to drop. Its exported
        rows go by key, a batch per transaction, only finished ones unchanged since their
        export; with no export (--no-export), every finished row of the month."""
        rs = RetentionStore(conn)
        rec = rs.export_of(relname=unit.relname).fetchone()
        assert rec is not None and unit.parent == STATUS
        if rec["dropped_at"] is not None:
            return
        files = rs.files_of(relname=unit.relname).fetchall()
        self.progress.start(f"removing {unit.relname}", int(rec["row_count"]))
        for ids in self._status_ids(conn, unit, files):
            with conn.transaction():
                n = rs.delete_status(
                    ids=ids, lo=unit.lo, hi=unit.hi, exported_at=rec["exported_at"]
                ).rowcount
            self.progress.advance(n)
        with conn.transaction():
            rs.mark_dropped(relname=unit.relname)
            done(unit)

    def _audit(
        self, conn: psycopg.Connection[Any], month: Month, *, export: bool, days: int
    ) -> None:
        """Tells every org's admins (their audit log) that this month of history went: by the
        platform (`system`) from an operator's CLI, the database role and OS user named; each
        table's partition, its rows and where its export lies (none: dropped unexported)."""
        rs = RetentionStore(conn)
        parts = []
        for u in month.units:
            rec = rs.export_of(relname=u.relname).fetchone()
            assert rec is not None
            where = self.store.uri(rec["prefix"]) if rec["prefix"] else None
            parts.append({"table": u.relname, "rows": int(rec["row_count"]), "export": where})
        orgs = rs.orgs_and_role().fetchall()
        details = {
            "older_than_days": days,
            "exported": export,
            "partitions": parts,
            "db_role": orgs[0]["db_role"] if orgs else None,
            "os_user": _os_user(),
        }
        for o in orgs:
            audit.record(
                conn, "system", "retention.drop", month.label, details, org_id=o["org_id"],
                source="cli",
            )  # fmt: skip

    def _status_ids(
        self, conn: psycopg.Connection[Any], unit: Unit, files: list[dict[str, Any]]
    ) -> Iterator[list[UUID]]:
        if not files:  # unexported (or no rows): the month's finished rows, as Postgres has them
            rs = RetentionStore(conn)
            at = rs.export_of(relname=unit.relname).fetchone()["exported_at"]  # type: ignore[index]
            while ids := rs.finished_status_ids(
                lo=unit.lo, hi=unit.hi, before=at, limit=STATUS_BATCH
            ):
                yield ids
            return
        with tempfile.TemporaryDirectory() as tmp:
            for f in files:
                path = Path(tmp) / "status.parquet"
                self.store.get_file(f["key"], path)
                for batch in pq.ParquetFile(path).iter_batches(
                    batch_size=STATUS_BATCH, columns=["task_id"]
                ):
                    yield batch.column(0).to_pylist()


def _record(
    rs: RetentionStore,
    unit: Unit,
    export_id: UUID,
    prefix: str,
    rows: int,
    key_checksum: int,
    row_checksum: int,
    at: datetime,
) -> None:
    """Records `unit`'s export (unexported: its count alone, prefix ''), in place of any
    earlier record and its files."""
    rs.record_export(
        relname=unit.relname,
        parent=unit.parent,
        lo=unit.lo,
        hi=unit.hi,
        export_id=export_id,
        prefix=prefix,
        row_count=rows,
        key_checksum=key_checksum,
        row_checksum=row_checksum,
        exported_at=at,
    )
    rs.forget_files(relname=unit.relname)


def _os_user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry and no $USER
        return None


def _figures(c: dict[str, Any]) -> tuple[int, int, int | None]:
    """Rows, key checksum and whole-row checksum, as count_and_checksum gives them."""
    return int(c["n"]), int(c["checksum"]), int(c["row_checksum"])


def _recorded(rec: dict[str, Any]) -> tuple[int, int, int | None]:
    """The same figures of an export's record (no row checksum: recorded before migration
    0039, so it never equals a count and the table is exported again)."""
    rows = rec["row_checksum"]
    return int(rec["row_count"]), int(rec["key_checksum"]), None if rows is None else int(rows)


def _key(rs: RetentionStore, unit: Unit) -> list[str]:
    """The columns of the unit's table's primary key (what the checksum is over)."""
    return [k["name"] for k in rs.primary_key(table=unit.parent).fetchall()]
