"""Admission to the query workers: who runs now, who waits, and who is turned away.

A query runs only while fewer than `workers` queries run, its user runs fewer than `per_user`
and its org fewer than `per_org`. Otherwise it waits, for at most `wait_seconds`, in a queue of
at most `queue_size` queries, at most `queued_per_user` of them one user's. When a place frees,
the waiter let in is the one whose user runs the fewest queries, then whose org does, then the
oldest: a user with nothing running goes ahead of one already at their share. With
2 * per_user < workers no two users hold every worker, and with per_org < workers no one org
does, so a newcomer finds a free worker at once.

The wait is not part of a query's time limit (that starts on its worker); it has its own bound.
A query turned away raises NotAdmitted (429) with a Retry-After: the time by which one of the
queries in its way will have ended at the latest (a running query is killed at its time limit
plus the kill grace). The counts are this process's: each API process admits its own queries.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from uuid import UUID

from trace_platform.identity import Actor
from trace_platform.query.errors import QueueFull, QueueTimeout, TooManyQueries

log = logging.getLogger(__name__)


@dataclass(eq=False)  # compared by identity: two tickets of one user are two queries
class Ticket:
    user: UUID
    org: UUID
    seq: int  # arrival order
    hold: float  # the longest its query may run once admitted (time limit + kill grace)
    since: float  # monotonic time it arrived
    admitted: float = 0.0  # monotonic time it was let onto the workers

    @property
    def ends_by(self) -> float:
        """Once admitted: the time it will have ended by at the latest."""
        return self.admitted + self.hold

    @property
    def waited(self) -> float:
        return self.admitted - self.since


def _queries(n: int) -> str:
    return f"{n} query" if n == 1 else f"{n} queries"


class Admission:
    def __init__(
        self,
        *,
        workers: int,
        per_user: int,
        per_org: int,
        queue_size: int,
        queued_per_user: int,
        wait_seconds: float,
    ) -> None:
        self.workers = workers
        self.per_user = per_user
        self.per_org = per_org
        self.queue_size = queue_size
        self.queued_per_user = queued_per_user
        self.wait_seconds = wait_seconds
        if 2 * per_user >= workers or per_org >= workers:
            log.warning(
                "query admission: %d workers, at most %d per user and %d per org: two users "
                "or one org can hold every worker (keep 2 x per user and per org below workers)",
                workers,
                per_user,
                per_org,
            )
        self._cond = threading.Condition()  # an RLock: wait_until's predicate may count
        self._seq = itertools.count()
        self._running: list[Ticket] = []
        self._waiting: list[Ticket] = []
        self._users: Counter[UUID] = Counter()  # running queries per user
        self._orgs: Counter[UUID] = Counter()  # running queries per org

    @contextmanager
    def slot(self, actor: Actor, hold_seconds: float) -> Iterator[float]:
        """Holds a place on the workers for the `with` body, after waiting in the queue if need
        be; yields the seconds it waited. `hold_seconds`: the longest the query may run."""
        t = self._enter(actor, hold_seconds)
        try:
            yield t.waited
        finally:
            with self._cond:
                self._running.remove(t)
                for count, key in ((self._users, t.user), (self._orgs, t.org)):
                    count[key] -= 1
                    if not count[key]:  # a long-lived process sees many users
                        del count[key]
                self._cond.notify_all()

    def _next(self) -> Ticket | None:
        """The waiter to let in now, if a place is free for one (the caller holds the lock)."""
        if len(self._running) >= self.workers:
            return None
        u, o = self._users, self._orgs
        ready = [t for t in self._waiting if u[t.user] < self.per_user and o[t.org] < self.per_org]
        return min(ready, key=lambda t: (u[t.user], o[t.org], t.seq), default=None)

    def _enter(self, actor: Actor, hold: float) -> Ticket:
        with self._cond:
            now = time.monotonic()
            t = Ticket(actor.user_id, actor.org_id, next(self._seq), hold, now)
            self._waiting.append(t)
            try:  # however it ends (admitted, refused, interrupted), it leaves the queue
                if self._next() is not t:
                    self._refuse_if_full(t, actor.name)
                deadline = now + self.wait_seconds
                while self._next() is not t:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        after = self._retry_after(t)
                        raise QueueTimeout(
                            f"the query waited {self.wait_seconds:g} s for a query worker and "
                            f"its turn did not come ({self._load()}; nothing of it ran): the "
                            f"Query Service is busy, try again in {after} s",
                            retry_after=after,
                            waited_seconds=self.wait_seconds,
                        )
                    self._cond.wait(left)
            finally:
                self._waiting.remove(t)
                # Woken once the lock is let go: another waiter may fit beside this one (more
                # than one place may have freed), and wait_until's callers count the queue.
                self._cond.notify_all()
            self._running.append(t)
            self._users[t.user] += 1
            self._orgs[t.org] += 1
            t.admitted = time.monotonic()
            return t

    def _refuse_if_full(self, t: Ticket, name: str) -> None:
        """A query that would wait: refused if its user already has as many waiting as one user
        may, or if the queue is full (the caller holds the lock; `t` is in the queue)."""
        mine = sum(1 for w in self._waiting if w.user == t.user) - 1
        if mine >= self.queued_per_user:
            after = self._retry_after(t)
            raise TooManyQueries(
                f"'{name}' already has {_queries(self._users[t.user])} running and {mine} "
                f"waiting, the most one user may have (at most {self.per_user} running, "
                f"{self.queued_per_user} waiting): try again in {after} s, when one has ended",
                retry_after=after,
                running=self._users[t.user],
                waiting=mine,
            )
        if len(self._waiting) - 1 >= self.queue_size:
            after = self._retry_after(t)
            raise QueueFull(
                f"the Query Service is busy ({self._load()}, as many as its queue holds): "
                f"try again in {after} s",
                retry_after=after,
                queue_size=self.queue_size,
            )

    def _load(self) -> str:
        """Running and waiting, but for the query being refused (still in the queue)."""
        return f"{_queries(len(self._running))} running, {len(self._waiting) - 1} waiting"

    def _retry_after(self, t: Ticket) -> int:
        """Whole seconds until one of the running queries in `t`'s way has ended at the latest:
        its user's own when the user is at their share, else its org's, else any."""
        if self._users[t.user] >= self.per_user:
            way = [r for r in self._running if r.user == t.user]
        elif self._orgs[t.org] >= self.per_org:
            way = [r for r in self._running if r.org == t.org]
        else:
            way = self._running
        now = time.monotonic()
        return max(1, math.ceil(min((r.ends_by for r in way), default=now) - now))

    # -- what tests and benches read ----------------------------------------------------------
    def running(self, user_id: UUID | None = None) -> int:
        """Queries running (of one user, or in all)."""
        with self._cond:
            return len(self._running) if user_id is None else self._users[user_id]

    def waiting(self, user_id: UUID | None = None) -> int:
        """Queries waiting (of one user, or in all)."""
        with self._cond:
            return sum(1 for t in self._waiting if user_id is None or t.user == user_id)

    def wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Waits for `done()` (called under the lock at each admission and end) to hold."""
        with self._cond:
            return self._cond.wait_for(done, timeout)
