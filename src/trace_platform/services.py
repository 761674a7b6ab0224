"""Wires the pieces for one process from the settings: pool, queue driver, Dispatcher."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from psycopg_pool import ConnectionPool

from trace_platform.config import Profile, Settings
from trace_platform.control.service import ControlPlane
from trace_platform.db.invalidation import InvalidationListener
from trace_platform.db.pool import make_pool, query_dsn, state_dsn
from trace_platform.db.replica import ReadPools
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.outbox import OutboxPublisher
from trace_platform.identity.actors import Authenticator
from trace_platform.lite.bootstrap import bootstrap, internal_token
from trace_platform.queue import QueueDriver, make_driver
from trace_platform.store.tasks.postgres import PostgresStore

if TYPE_CHECKING:
    from trace_platform.identity import Actor
    from trace_platform.query import QueryService

_QUERY_LOCK = threading.Lock()


@dataclass
class Services:
    settings: Settings
    dsn: str
    pool: ConnectionPool
    driver: QueueDriver
    dispatcher: Dispatcher
    publisher: OutboxPublisher
    control: ControlPlane
    new_admin_key: str | None = None  # set only on the very first start of a Lite install
    internal_token: str | None = None  # what /internal/* callers must present
    # Caches of mutable answers (API keys' users) are used only once `listen()` started the
    # process's invalidation listener: an API does (its lifespan); a CLI command does not.
    listener: InvalidationListener | None = None
    authenticator: Authenticator | None = None
    # Where the read-only paths read: TRACE_READ_REPLICA_DSN's replica while fresh enough,
    # else `pool` (db/replica.py). Made from `pool` alone when Services are made by hand.
    reads: ReadPools | None = None
    _query: QueryService | None = field(default=None, repr=False)

    @property
    def data_dsn(self) -> str:
        """Postgres data (hot datasets); in Lite the same server and database as state."""
        dsn = self.settings.data_dsn
        return dsn.get_secret_value() if dsn else self.dsn

    @property
    def query(self) -> QueryService:
        """The Query Service, built on first use (DuckDB is not needed by every process)."""
        with _QUERY_LOCK:  # API request threads may race to the first query
            if self._query is None:
                from trace_platform.objectstore import make_store
                from trace_platform.query import QueryService

                self._query = QueryService(
                    self.pool,
                    make_store(self.settings),
                    query_dsn(self.settings, self.data_dsn),  # the least-privilege reader
                    self.settings,
                )
            return self._query

    @classmethod
    def build(cls, settings: Settings, dsn: str | None = None) -> Services:
        lite = settings.profile is Profile.lite
        token = internal_token(settings, create=lite)  # before any connection is made
        if token is None:
            raise ValueError("TRACE_INTERNAL_TOKEN is required in the aws profile")
        dsn = dsn or state_dsn(settings)
        pool = make_pool(dsn, max_size=settings.pool_max_size)
        driver = make_driver(settings, dsn)
        # The Dispatcher's store on a pool of its own (its sessions carry its plan settings).
        dispatcher = Dispatcher(
            PostgresStore.connect(dsn, max_size=settings.pool_max_size), settings
        )
        listener = InvalidationListener(dsn)  # LISTEN on the primary: a replica hears nothing
        replica = settings.read_replica_dsn
        reads = ReadPools(
            pool,
            replica.get_secret_value() if replica is not None else None,
            max_lag_seconds=settings.read_replica_max_lag_seconds,
            max_size=settings.pool_max_size,
        )
        services = cls(
            settings=settings,
            dsn=dsn,
            pool=pool,
            driver=driver,
            dispatcher=dispatcher,
            publisher=OutboxPublisher(pool, driver, batch_size=settings.outbox_batch_size),
            control=ControlPlane(pool, dispatcher, reads),
            internal_token=token,
            listener=listener,
            authenticator=Authenticator(pool, listener),
            reads=reads,
        )
        if lite:
            services.new_admin_key = bootstrap(settings, pool)
        return services

    def listen(self) -> None:
        """Starts the invalidation listener (once), and with it the caches that need it."""
        if self.listener is not None:
            self.listener.start()

    def authenticate(self, key: str | None) -> Actor | None:
        """The user an API key acts as (None for none, unknown, revoked, expired)."""
        if self.authenticator is None:  # Services made by hand
            self.authenticator = Authenticator(self.pool, self.listener)
        return self.authenticator.authenticate(key)

    def close(self) -> None:
        if self.listener is not None:
            self.listener.stop()
        if self._query is not None:
            self._query.close()
        if self.reads is not None:
            self.reads.close()
        self.driver.close()
        self.dispatcher.pool.close()
        self.pool.close()
