"""pgqueue: the Postgres-backed QueueDriver (Lite, CI, demos).

Receive leases rows with SKIP LOCKED; the receipt is `"{id}:{lease_token}"` and only the
matching token can ack. Idle consumers sleep on LISTEN/NOTIFY and poll as a fallback.

The batch path is kept lean, since it is most of a busy queue's cost. A receive of
BATCH_LEASE_MIN or more messages leases them as one batch (migration 0024): it locks and
deletes the picked rows, as the bare SKIP LOCKED loop does, and inserts one queue_leases row
holding them, named by the batch's token; an ack takes its message out of that row and the
last one deletes it, and an expired lease is put back (or dead-lettered on its final delivery)
by the next receive or the sweep. A smaller receive leases in place: one UPDATE that finds the
picked rows by primary key and changes no indexed column (a HOT update, migration 0018), which
is cheaper for the few messages at a time a worker takes. Either way the batch comes back as
one row (one JSON decode); ack_many is one statement with the receipts grouped by token in one
parameter, and receive(ack=...) folds it into the lease's statement (one commit per batch).

Every operation is one statement, run in autocommit. Publishing waits for the disk flush;
receive/ack/extend/nack need not (a lease or ack lost in a crash only means a redelivery,
which at-least-once allows), so they may use a `relaxed` pool with synchronous_commit=off.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from typing import Any
from uuid import uuid4

import psycopg
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool

from trace_platform.db.pool import GENERIC_PLANS, make_pool
from trace_platform.db.queries import Queries
from trace_platform.queue import payloads
from trace_platform.queue.driver import Message

_Q = Queries("queue")
log = logging.getLogger(__name__)
# Generic plans (see db.pool.GENERIC_PLANS), and only index scans. A generic plan is made once,
# from the statistics of that moment: a queue that was empty then (a new install, a burst
# published faster than autovacuum analyses) got its receive planned as a bitmap scan of every
# ready row and a sort, so each receive read the whole backlog (measured: 1.9 ms for 2 of
# 1,400 ready wake-ups, 0.5 ms with this). Every queue statement finds its rows by key or off
# one index (the idle-time `next_visible` and the dead-letter listing read the same rows
# either way), so forbidding the other scans costs none of them anything.
QUEUE_PLANS = f"{GENERIC_PLANS} -c enable_seqscan=off -c enable_bitmapscan=off"
_SWEEP_EVERY = 1.0  # seconds between dead-letter sweeps per queue and driver
# From this many messages a receive leases them as one batch (a queue_leases row, migration
# 0024); fewer are leased in place. Measured against the bare SKIP LOCKED loop (durable, paired,
# 3 runs of 3 pairs): at 100 messages, in place 0.75-1.07x / 0.55-0.81x (1 / 4 consumers),
# as a batch lease 0.91-0.99x / 0.89-1.30x. Below, batch leases against in place, durable drains, paired
# (medians of 3): acked as whole batches, at 4 / 8 / 16 / 32 messages 1.07 / 0.95 / 0.97 / 1.12
# with 1 consumer and 1.32 / 1.42 / 1.12 / 1.07 with 4; acked one message at a time, as a worker
# acks (each ack then rewrites the batch's row), 0.89 / 0.93 / 0.98 / 1.00 and 1.00 / 0.96 /
# 0.92 / 1.04. And a worker's receives as batch leases cost Postgres more CPU per task end to
# end (0.77-0.83 ms against 0.57-0.75 at 2 x 8 wrappers).
BATCH_LEASE_MIN = 16
# A receive of more is leased as several batches of at most this many. Each ack of a batch
# rewrites its row's `held` under the row's lock, so acks one at a time cost in the batch's
# size and queue on one another (found by review: 3,000 single acks of one 3,000-message batch
# took 7.65 s, 0.88 s leased in place). Measured, single acks from 4 threads, batch lease
# against in place: 1.3-1.5x the time at 16-100 messages, 2.6x at 500, 5-6x at 2,000.
BATCH_LEASE_MAX = 250


def _bigint_digits() -> str:
    """A pattern of the decimal digits of a non-negative bigint (at most 2**63 - 1): any 18
    digits, or 19 no greater than the bound, so an id Postgres cannot cast is refused here."""
    top = str(2**63 - 1)
    longest = [
        f"{top[:i]}[0-{int(d) - 1}][0-9]{{{len(top) - i - 1}}}"
        for i, d in enumerate(top)
        if d != "0"
    ]
    return "(?:[0-9]{1,18}|" + "|".join([*longest, top]) + ")"


_HEX = "[0-9a-fA-F]"
_RECEIPT = re.compile(
    rf"({_bigint_digits()}):({_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}})"
)


def _split(receipt: str) -> tuple[int, str]:
    """(message id, lease token) of a receipt; the token stays text (Postgres parses it)."""
    m = _RECEIPT.fullmatch(receipt) if isinstance(receipt, str) else None
    if m is None:
        raise ValueError(f"not a pgqueue receipt: {receipt!r}")
    return int(m[1]), m[2]


_RECEIPTS = re.compile(rf"{_RECEIPT.pattern}(?:,{_RECEIPT.pattern})*")


def _grouped(receipts: list[str]) -> str:
    """The receipts, each one validated, as one string grouped by lease token for the
    `_settle` SQL fragment: "token=id|id;token=id" (each id once). One match over the joined
    string (a regex call per receipt was a tenth of a batch's client time); the comma count
    keeps a receipt from smuggling in two."""
    if not receipts:
        return ""
    try:
        joined = ",".join(receipts)
    except TypeError:
        joined = ""
    if _RECEIPTS.fullmatch(joined) is None or joined.count(",") != len(receipts) - 1:
        match = _RECEIPT.fullmatch
        bad = next(r for r in receipts if not isinstance(r, str) or match(r) is None)
        raise ValueError(f"not a pgqueue receipt: {bad!r}")
    groups: dict[str, dict[str, None]] = {}
    for receipt in receipts:
        msg_id, _, token = receipt.partition(":")
        # One group per uuid, however it is spelled (two spellings of one batch's token were
        # two groups, and the settle thinned the batch by one of them only).
        groups.setdefault(token.lower(), {})[msg_id] = None
    return ";".join(f"{token}={'|'.join(ids)}" for token, ids in groups.items())


class PgQueue:
    def __init__(
        self,
        pool: ConnectionPool,
        dsn: str,
        *,
        relaxed_pool: ConnectionPool | None = None,
        max_attempts: int = 20,
        poll_seconds: float = 1.0,
        owns_pools: bool = False,
    ) -> None:
        self.pool = pool
        self.relaxed = relaxed_pool or pool
        self.owns_pools = owns_pools
        self.dsn = dsn
        self.max_attempts = max_attempts
        self.poll_seconds = poll_seconds
        # One LISTEN connection per consumer thread, so every idle consumer is woken.
        self._local = threading.local()
        self._listeners: list[psycopg.Connection[Any]] = []
        self._listeners_lock = threading.Lock()
        self._last_sweep: dict[str, float] = {}

    @classmethod
    def from_dsn(
        cls,
        dsn: str,
        *,
        max_attempts: int = 20,
        poll_seconds: float = 1.0,
        max_size: int = 8,
        relaxed_acks: bool = True,
    ) -> PgQueue:
        """The production set-up: its own autocommit pools, durable and relaxed (or, with
        `relaxed_acks` off, every call durable: the benchmark's like-for-like column)."""
        durable = make_pool(
            dsn, max_size=max_size, name="pgqueue", autocommit=True, options=QUEUE_PLANS
        )
        relaxed = (
            make_pool(
                dsn,
                max_size=max_size,
                name="pgqueue-relaxed",
                autocommit=True,
                options=f"-c synchronous_commit=off {QUEUE_PLANS}",
            )
            if relaxed_acks
            else None
        )
        return cls(
            durable,
            dsn,
            relaxed_pool=relaxed,
            max_attempts=max_attempts,
            poll_seconds=poll_seconds,
            owns_pools=True,
        )

    # -- publish -------------------------------------------------------------------------
    def publish(self, queue_name: str, payload_json: Any, delay_seconds: int = 0) -> None:
        self.publish_many(queue_name, [payload_json], delay_seconds)

    def publish_many(self, queue_name: str, payloads_: list[Any], delay_seconds: int = 0) -> None:
        encoded = [payloads.encode(p) for p in payloads_]
        if not encoded:
            return
        with self.pool.connection() as conn:
            conn.execute(
                _Q.publish,
                {
                    "queue": queue_name,
                    "payloads": encoded,
                    "delay": max(0, delay_seconds),
                    "max_attempts": self.max_attempts,
                },
            )

    # -- receive -------------------------------------------------------------------------
    def _lease(
        self, queue_name: str, max_messages: int, visibility: float, acks: str = ""
    ) -> list[Message]:
        """Up to `max_messages`, as one statement per batch (a batch lease holds at most
        BATCH_LEASE_MAX), the first also settling `acks`. Only the first may raise: each
        batch commits, so a failure after one must not lose it (its delivery is counted); it
        is logged and the receive returns what it has (the next receive or sweep goes on)."""
        msgs: list[Message] = []
        mine: list[str] = []  # this call's batches: never put back and leased again by it
        expired = False  # a batch saw an expired lease: put back, and leased if there is room
        first = True
        while True:
            want = max_messages - len(msgs)
            try:
                got, full, saw_expired = self._lease_once(queue_name, want, visibility, acks, mine)
                first, acks = False, ""  # the acks are settled: the first statement committed
                msgs += got
                expired = expired or saw_expired
                if full and len(got) < want:  # more wanted, maybe ready: the next batch
                    continue
                # What ran out goes back now, not at the next sweep.
                ready = expired and self._restore(queue_name, mine)
            except Exception as e:
                if first:
                    raise  # nothing committed: the caller keeps its acks
                log.warning("receive of %s stopped at %d messages: %s", queue_name, len(msgs), e)
                break
            if not ready or len(msgs) >= max_messages:
                break
            expired = False  # leased at once, as there is room
        return msgs

    def _lease_once(
        self, queue_name: str, max_messages: int, visibility: float, acks: str, mine: list[str]
    ) -> tuple[list[Message], bool, bool]:
        """One statement's batch: (its messages, whether it was full, whether it saw an
        expired lease); its token is added to `mine`."""
        # One fresh token per batch: a receipt is (id, token), so a redelivery (a later batch)
        # never matches an older receipt of the same message.
        token = str(uuid4())
        now = time.monotonic()
        if now - self._last_sweep.get(queue_name, 0.0) > _SWEEP_EVERY:
            self._last_sweep[queue_name] = now
            self._sweep(queue_name, mine)
        mine.append(token)
        # A batch lease holds at most BATCH_LEASE_MAX; a lease in place has no cap.
        limit = (
            max_messages if max_messages < BATCH_LEASE_MIN else min(max_messages, BATCH_LEASE_MAX)
        )
        with self.relaxed.connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            ids, attempts, payloads, _acked, expired = cur.execute(
                _Q.receive_in_place if max_messages < BATCH_LEASE_MIN else _Q.receive,
                {
                    "queue": queue_name,
                    "limit": limit,
                    "visibility": visibility,
                    "token": token,
                    "receipts": acks,
                },
            ).fetchone() or (None, None, None, 0, False)
        suffix = ":" + token
        msgs = [
            Message(payload, f"{msg_id}{suffix}", n)  # positional: 40% less per message
            for msg_id, n, payload in zip(
                ids or (), attempts or (), json.loads(payloads or "[]"), strict=True
            )
        ]
        return msgs, len(msgs) == limit, bool(expired)

    def _sweep(self, queue_name: str, mine: list[str] | None = None) -> None:
        """Expired leases back in the queue (or dead), and rows an older version leased in
        place whose final lease expired, dead."""
        self._restore(queue_name, mine)
        with self.pool.connection() as conn:  # durable: a dead letter is a record
            conn.execute(_Q.dead_letter, {"queue": queue_name})

    def _restore(self, queue_name: str, mine: list[str] | None = None) -> int:
        """Puts back the messages of this queue's expired leases (but `mine`, the batches of
        the receive asking); how many are ready again."""
        with self.pool.connection() as conn:  # durable: it may write dead letters
            row = conn.execute(_Q.restore, {"queue": queue_name, "mine": mine or []}).fetchone()
        return int(row["ready"]) if row else 0

    def receive(
        self,
        queue_name: str,
        max_messages: int,
        visibility_timeout_seconds: float,
        wait_seconds: float = 0,
        ack: list[str] | tuple[str, ...] = (),
    ) -> list[Message]:
        deadline = time.monotonic() + wait_seconds
        acks = _grouped(list(ack))  # checked before anything is leased
        while True:
            msgs = self._lease(queue_name, max_messages, visibility_timeout_seconds, acks)
            acks = ""  # settled by the first lease, which committed them
            remaining = deadline - time.monotonic()
            if msgs or remaining <= 0:
                return msgs
            self._wait(queue_name, min(remaining, self._poll_interval(queue_name)))

    def _poll_interval(self, queue_name: str) -> float:
        """Sleep no longer than until the next delayed message becomes visible."""
        with self.pool.connection() as conn:
            row = conn.execute(_Q.next_visible, {"queue": queue_name}).fetchone()
        nxt = row["seconds"] if row else None
        if nxt is None or nxt <= 0:
            return self.poll_seconds
        return max(0.005, min(self.poll_seconds, float(nxt)))

    def _listener(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = psycopg.connect(self.dsn, autocommit=True)
            conn.execute("LISTEN trace_queue")
            self._local.conn = conn
            with self._listeners_lock:
                self._listeners.append(conn)
        return conn

    def _wait(self, queue_name: str, timeout: float) -> None:
        for n in self._listener().notifies(timeout=timeout):
            if n.payload == queue_name:
                return

    # -- settle --------------------------------------------------------------------------
    def ack(self, queue_name: str, receipt: str) -> bool:
        return self.ack_many(queue_name, [receipt]) == 1

    def ack_many(self, queue_name: str, receipts: list[str]) -> int:
        if not receipts:
            return 0
        joined = _grouped(receipts)
        with self.relaxed.connection() as conn:
            row = conn.execute(_Q.ack_many, {"queue": queue_name, "receipts": joined}).fetchone()
        return int(row["acked"]) if row else 0

    def extend_visibility(
        self, queue_name: str, receipt: str, visibility_timeout_seconds: float
    ) -> bool:
        msg_id, token = _split(receipt)
        with self.relaxed.connection() as conn:
            row = conn.execute(
                _Q.extend_visibility,
                {
                    "queue": queue_name,
                    "id": msg_id,
                    "token": token,
                    "visibility": visibility_timeout_seconds,
                },
            ).fetchone()
            return bool(row and row["extended"])

    def nack(self, queue_name: str, receipt: str, error: str, delay_seconds: float = 0) -> bool:
        msg_id, token = _split(receipt)
        with self.relaxed.connection() as conn:
            row = conn.execute(
                _Q.nack,
                {
                    "queue": queue_name,
                    "id": msg_id,
                    "token": token,
                    "error": error[:4000],
                    "delay": delay_seconds,
                },
            ).fetchone()
            if row is None:
                return False
        if row["exhausted"]:
            with self.pool.connection() as conn:  # durable: a dead letter is a record
                conn.execute(_Q.dead_letter_one, {"id": row["id"]})
        return True

    def dead_letters(self, queue_name: str) -> list[dict[str, Any]]:
        with self.pool.connection() as conn:
            return conn.execute(_Q.dead_letters, {"queue": queue_name}).fetchall()

    def close(self) -> None:
        with self._listeners_lock:
            for conn in self._listeners:
                conn.close()
            self._listeners.clear()
        if self.owns_pools:
            self.pool.close()
            self.relaxed.close()
