"""API key -> the user it acts as, cached in the API process.

The cache is used only while the process's invalidation listener is live
(`db/invalidation.py`): a key revoked or expired early, or its user removed, demoted or given
other roles, is announced by the database and dropped here as the announcement arrives
(milliseconds after the change commits). A revocation or expiry already set when the key was
read (a rotated key's grace, an expiry) is enforced from the entry itself. Without a live
listener (a CLI command, a Lambda container, a listener reconnecting) every call reads the
database. No answer "no such key" is cached: a key made a moment ago works at once, and keys
nobody holds cannot fill the cache."""

from __future__ import annotations

import time
from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from trace_platform.cache import LruCache
from trace_platform.db.invalidation import InvalidationListener
from trace_platform.identity import Actor, hash_key, lookup_key

# A safety net only: announcements do the work.
KEY_CACHE_TTL = 30.0
KEY_CACHE_SIZE = 10_000


@dataclass(frozen=True)
class _Entry:
    actor: Actor
    deadline: float | None  # time.monotonic() when the key stops by itself


class Authenticator:
    def __init__(self, pool: ConnectionPool, listener: InvalidationListener | None) -> None:
        self.pool = pool
        self.listener = listener
        self.cache: LruCache[str, _Entry] = LruCache("api_keys", KEY_CACHE_SIZE, KEY_CACHE_TTL)
        if listener is not None:
            listener.on("api_key", self.cache.invalidate)
            listener.on("user", self._user_changed)
            listener.on_reset(self.cache.clear)

    def _user_changed(self, user_id: str) -> None:
        self.cache.invalidate_where(lambda e: str(e.actor.user_id) == user_id)

    def authenticate(self, key: str | None) -> Actor | None:
        if not key:
            return None
        digest = hash_key(key)
        cached = self.listener is not None and self.listener.live
        if cached:
            hit = self.cache.get(digest)
            if hit is not None:
                if hit.deadline is None or time.monotonic() < hit.deadline:
                    return hit.actor
                self.cache.invalidate(digest)
        generation = self.cache.generation  # before the read: see LruCache.put
        with self.pool.connection() as conn:
            found = lookup_key(conn, digest)
        if found is None:
            return None
        if cached:
            deadline = (
                time.monotonic() + found.valid_for.total_seconds() if found.valid_for else None
            )
            self.cache.put(digest, _Entry(found.actor, deadline), generation)
        return found.actor
