"""Where the read-only paths read (docs/operations.md, "A read replica"): a streaming replica
of the state database (TRACE_READ_REPLICA_DSN) while it is at most
TRACE_READ_REPLICA_MAX_LAG_SECONDS behind the primary, else the primary itself.

The lag is checked at most once a second (`check_every`), by one thread while the others go on
with the last answer: the primary's WAL position and clock, then how far the replica replayed.
Caught up to that position, it is not behind at all; otherwise it is at most as old as the last
transaction it replayed, and at most as old as an earlier check of the primary whose position
it has reached (whichever is less). A replica that cannot be reached, is not a standby (a
promoted one, a primary) or is another cluster or database than the state DSN's is not read,
and each change of answer is logged once.

A read on the replica that finds nothing (NotFound) is read again on the primary: what a caller
just made (a run it triggered, a task it created) is shown to it whatever the replica's lag. A
read the replica fails (its connection lost, a query cancelled by a recovery conflict) is also
read again on the primary. A write on the replica fails loudly: it is a read-only server, and
its sessions are read-only besides (so a DSN of a writable server refuses writes too)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from prometheus_client import Counter, Gauge
from prometheus_client.metrics_core import Metric
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from trace_platform.config import mask_dsn
from trace_platform.db.queries import Queries
from trace_platform.errors import NotFound

log = logging.getLogger(__name__)
_Q = Queries("replica")
T = TypeVar("T")

# A replica that cannot hand out a connection in this long is taken as unreachable: the one
# request that checks waits at most this, the others read the primary meanwhile.
CONNECT_WAIT_SECONDS = 2.0
READ_ONLY = "-c default_transaction_read_only=on"
FALLBACK_REASONS = ("lagging", "unreachable", "not_standby", "other_server", "not_found", "failed")


@dataclass(frozen=True)
class Verdict:
    """The last check's answer: read the replica or not, why, and its lag (seconds; None when
    unknown: not checked yet, unreachable)."""

    replica: bool
    reason: str  # "fresh", or one of FALLBACK_REASONS but not_found and failed
    lag: float | None = None


UNCHECKED = Verdict(False, "unchecked")


def lsn(text: str) -> int:
    """A WAL position ('16/B374D848') as a number, to compare positions of two servers."""
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


class ReadPools:
    """`read(fn)` runs `fn(pool)` on the replica's pool while the replica is fresh enough, else
    on the primary's (the state pool). Without a replica DSN every read is the primary's."""

    def __init__(
        self,
        primary: ConnectionPool,
        replica_dsn: str | None = None,
        *,
        max_lag_seconds: float = 5.0,
        max_size: int = 10,
        check_every: float = 1.0,
    ) -> None:
        self.primary = primary
        self.replica_dsn = replica_dsn
        self.max_lag = max_lag_seconds
        self.max_size = max_size
        self.check_every = check_every
        self._replica: ConnectionPool | None = None  # opened at the first check
        self._verdict = UNCHECKED
        self._checked_at = -math.inf
        self._checking = threading.Lock()
        self._closed = False
        self._unreachable = ""  # why the last check could not reach it
        # Earlier checks' primary positions and times: the replica reached one of them, so it
        # is at most that old.
        self._marks: deque[tuple[int, datetime]] = deque(maxlen=120)
        self.reads = Counter(
            "trace_state_reads",
            "Reads of the read-only paths, by the server that answered: replica or primary",
            ["served_by"],
            registry=None,
        )
        self.fallbacks = Counter(
            "trace_read_replica_fallbacks",
            "Reads sent to the primary though a replica is configured, by why: lagging (more "
            "than TRACE_READ_REPLICA_MAX_LAG_SECONDS behind), unreachable, not_standby, "
            "other_server (not the state DSN's cluster and database), not_found (read again "
            "on the primary), failed (the replica failed the read)",
            ["reason"],
            registry=None,
        )
        self.lag = Gauge(
            "trace_read_replica_lag_seconds",
            "The read replica's lag behind the primary at its last check (NaN: unknown)",
            registry=None,
        )
        self.lag.set(math.nan)
        for where in ("replica", "primary"):
            self.reads.labels(where)
        for reason in FALLBACK_REASONS:
            self.fallbacks.labels(reason)

    # -- reading -------------------------------------------------------------------------------
    def read(self, fn: Callable[[ConnectionPool], T]) -> T:
        """`fn`'s answer from the replica when it is fresh enough, else from the primary."""
        replica = self._fresh_replica()
        if replica is None:
            return self._on_primary(fn)
        try:
            out = fn(replica)
        except NotFound:  # perhaps made a moment ago, not replayed yet: the primary knows
            return self._on_primary(fn, "not_found")
        except psycopg.OperationalError as e:  # lost connection, recovery conflict, timeout
            log.warning("the read replica failed a read (%s): read on the primary", e)
            self._checked_at = -math.inf  # check it again before the next read trusts it
            return self._on_primary(fn, "failed")
        self.reads.labels("replica").inc()
        return out

    def _on_primary(self, fn: Callable[[ConnectionPool], T], reason: str | None = None) -> T:
        if reason is not None:
            self.fallbacks.labels(reason).inc()
        self.reads.labels("primary").inc()
        return fn(self.primary)

    def _fresh_replica(self) -> ConnectionPool | None:
        if self.replica_dsn is None:
            return None
        verdict = self.verdict()
        if verdict.replica:
            return self._replica
        if verdict.reason != "unchecked":
            self.fallbacks.labels(verdict.reason).inc()
        return None

    # -- the lag check -----------------------------------------------------------------------
    def verdict(self) -> Verdict:
        """The last check's answer, checked again first when it is older than `check_every`
        and no other thread is checking (those go on with the last answer)."""
        if self.replica_dsn is None or self._closed:
            return UNCHECKED
        if time.monotonic() - self._checked_at < self.check_every:
            return self._verdict
        if not self._checking.acquire(blocking=False):
            return self._verdict
        try:
            verdict = self._check()
            self._checked_at = time.monotonic()
            self._announce(verdict)
            self._verdict = verdict
            self.lag.set(math.nan if verdict.lag is None else verdict.lag)
            return verdict
        finally:
            self._checking.release()

    def _check(self) -> Verdict:
        with self.primary.connection() as conn:
            primary = conn.execute(_Q.primary_position).fetchone()
        assert primary is not None
        replica = None
        for _ in range(2):  # a session the server ended (a restart) is dropped: one more try
            try:
                with self._pool().connection(timeout=CONNECT_WAIT_SECONDS) as conn:
                    replica = conn.execute(_Q.replica_position).fetchone()
                break
            except PoolTimeout as e:  # no session to be had: not worth waiting for again
                self._unreachable = str(e)
                break
            except psycopg.OperationalError as e:
                self._unreachable = str(e)
        if replica is None:
            return Verdict(False, "unreachable")
        if (replica["system"], replica["db"]) != (primary["system"], primary["db"]):
            return Verdict(False, "other_server")
        if not replica["standby"]:
            return Verdict(False, "not_standby")
        at: datetime = primary["at"]
        replayed = lsn(replica["lsn"])
        if replayed >= lsn(primary["lsn"]):
            lag = 0.0
        else:
            bounds = [(at - t).total_seconds() for pos, t in self._marks if pos <= replayed]
            if replica["replayed_at"] is not None:
                bounds.append((at - replica["replayed_at"]).total_seconds())
            lag = max(0.0, min(bounds)) if bounds else math.inf
        self._marks.append((lsn(primary["lsn"]), at))
        if lag > self.max_lag:
            return Verdict(False, "lagging", lag)
        return Verdict(True, "fresh", lag)

    def _announce(self, verdict: Verdict) -> None:
        """A log line when the answer changes (not at each check)."""
        was = self._verdict.reason
        if verdict.reason == was:
            return
        where = mask_dsn(self.replica_dsn or "")
        if verdict.reason == "fresh":
            log.info("reads go to the read replica %s (lag %.3fs)", where, verdict.lag or 0.0)
            return
        if verdict.reason == "lagging":
            why = (
                f"it is {verdict.lag:.1f}s behind the primary, more than "
                f"TRACE_READ_REPLICA_MAX_LAG_SECONDS={self.max_lag:g}"
            )
        elif verdict.reason == "unreachable":
            why = f"it cannot be reached ({self._unreachable})"
        elif verdict.reason == "not_standby":
            why = "it is not a standby (a primary, or a promoted replica)"
        else:
            why = (
                "it is not a replica of the state DSN's cluster and database (another system "
                "identifier or database name): check TRACE_READ_REPLICA_DSN"
            )
        log.warning("reads go to the primary, not the read replica %s: %s", where, why)

    def _pool(self) -> ConnectionPool:
        """The replica's pool, opened without waiting: a replica that is down makes the check
        answer `unreachable`, never stops this process from starting."""
        if self._replica is None:
            assert self.replica_dsn is not None
            given = conninfo_to_dict(self.replica_dsn)
            options = f"{given['options']} {READ_ONLY}" if given.get("options") else READ_ONLY
            extra: dict[str, Any] = {"options": options}
            if "connect_timeout" not in given:  # libpq's default waits forever
                extra["connect_timeout"] = 5
            self._replica = ConnectionPool(
                make_conninfo(self.replica_dsn, **extra),
                min_size=1,
                max_size=self.max_size,
                kwargs={"row_factory": dict_row, "autocommit": False},
                name="trace-read-replica",
                open=False,
            )
            self._replica.open(wait=False)
        return self._replica

    # -- metrics -------------------------------------------------------------------------------
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        """A Collector: the API's registry reads these (metrics/api.py)."""
        yield from self.reads.collect()
        if self.replica_dsn is not None:
            yield from self.fallbacks.collect()
            yield from self.lag.collect()

    def close(self) -> None:
        self._closed = True
        if self._replica is not None:
            self._replica.close()
