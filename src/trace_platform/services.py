"""Wires the pieces for one process from the settings: pool, queue driver, Dispatcher."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from trace_platform.config import Profile, Settings
from trace_platform.control.service import ControlPlane
from trace_platform.db.pool import make_pool, state_dsn
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.outbox import OutboxPublisher
from trace_platform.lite.bootstrap import bootstrap
from trace_platform.queue import QueueDriver, make_driver


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

    @classmethod
    def build(cls, settings: Settings, dsn: str | None = None) -> Services:
        dsn = dsn or state_dsn(settings)
        pool = make_pool(dsn, max_size=settings.pool_max_size)
        driver = make_driver(settings, dsn)
        dispatcher = Dispatcher(pool, settings)
        services = cls(
            settings=settings,
            dsn=dsn,
            pool=pool,
            driver=driver,
            dispatcher=dispatcher,
            publisher=OutboxPublisher(pool, driver, batch_size=settings.outbox_batch_size),
            control=ControlPlane(pool, dispatcher),
        )
        if settings.profile is Profile.lite:
            services.new_admin_key = bootstrap(settings, pool)
        return services

    def close(self) -> None:
        self.driver.close()
        self.pool.close()
