"""In-process LRU caches, each counted (hits, misses, evictions, invalidations) and listed by
name for `stats()` (what a metrics endpoint reads).

Two kinds (docs/identity.md, "Caches"): an immutable lookup (a task's registry row) is never
wrong once read, so its entries only age out of the LRU; a mutable one (an API key's user) is
trusted only while the process listens for the database's invalidations
(`db/invalidation.py`), and each entry lives at most `ttl` seconds besides, a safety net should
an announcement ever be missed.

A lookup that raced an invalidation must not store what it read before it: `generation` counts
invalidations, a reader takes it before reading the database, and `put` drops the value if it
moved meanwhile."""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class CacheStats:
    name: str
    size: int
    maxsize: int
    hits: int
    misses: int
    evictions: int
    invalidations: int
    clears: int

    @property
    def hit_rate(self) -> float:
        looked = self.hits + self.misses
        return self.hits / looked if looked else 0.0


class LruCache(Generic[K, V]):
    """A thread-safe LRU of at most `maxsize` entries, each kept at most `ttl` seconds (None:
    until evicted)."""

    def __init__(self, name: str, maxsize: int, ttl: float | None = None) -> None:
        if maxsize < 1:
            raise ValueError("a cache holds at least one entry")
        self.name = name
        self.maxsize = maxsize
        self.ttl = ttl
        self._data: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()
        self.generation = 0
        self.hits = self.misses = self.evictions = self.invalidations = self.clears = 0
        _register(self)

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._data.get(key)
            if found is not None and (self.ttl is None or time.monotonic() - found[0] < self.ttl):
                self._data.move_to_end(key)
                self.hits += 1
                return found[1]
            if found is not None:
                del self._data[key]
            self.misses += 1
            return None

    def put(self, key: K, value: V, generation: int | None = None) -> bool:
        """Stores `value` unless an invalidation came since `generation` was read (then what
        the caller read may already be stale): whether it was stored."""
        with self._lock:
            if generation is not None and generation != self.generation:
                return False
            self._data[key] = (time.monotonic(), value)
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
                self.evictions += 1
            return True

    def invalidate(self, key: K) -> None:
        with self._lock:
            self.generation += 1
            self.invalidations += 1
            self._data.pop(key, None)

    def invalidate_where(self, stale: Callable[[V], bool]) -> None:
        """Drops every entry whose value `stale` names (a scan: for rare changes only)."""
        with self._lock:
            self.generation += 1
            self.invalidations += 1
            for key in [k for k, (_, v) in self._data.items() if stale(v)]:
                del self._data[key]

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self.clears += 1
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self.name,
                len(self._data),
                self.maxsize,
                self.hits,
                self.misses,
                self.evictions,
                self.invalidations,
                self.clears,
            )


# Weakly: a cache goes with what built it (a closed Services' with it).
_ALL: weakref.WeakSet[LruCache[object, object]] = weakref.WeakSet()
_ALL_LOCK = threading.Lock()


def _register(cache: LruCache[K, V]) -> None:
    with _ALL_LOCK:
        _ALL.add(cache)  # type: ignore[arg-type]


def stats() -> dict[str, CacheStats]:
    """Every live cache of this process by name, counts summed over caches of one name (a
    process may build several Services, each with its own; a production process builds one)."""
    with _ALL_LOCK:
        caches = list(_ALL)
    out: dict[str, CacheStats] = {}
    for c in caches:
        s = c.stats()
        have = out.get(s.name)
        if have is None:
            out[s.name] = s
            continue
        out[s.name] = CacheStats(
            s.name,
            have.size + s.size,
            have.maxsize + s.maxsize,
            have.hits + s.hits,
            have.misses + s.misses,
            have.evictions + s.evictions,
            have.invalidations + s.invalidations,
            have.clears + s.clears,
        )
    return out
