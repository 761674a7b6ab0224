"""Connection pools and DSN resolution (embedded Postgres when no DSN is configured)."""

from __future__ import annotations

from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from trace_platform.config import Settings
from trace_platform.db.embedded import EmbeddedPostgres
from trace_platform.db.migrate import migrate


def embedded_cluster(settings: Settings) -> EmbeddedPostgres:
    assert settings.pg_data_dir is not None
    return EmbeddedPostgres(
        settings.pg_data_dir, bindir=settings.pg_bindir, os_user=settings.pg_os_user
    )


def state_dsn(settings: Settings, *, start: bool = True, run_migrations: bool = True) -> str:
    """The state DSN; in Lite with none configured, starts (or reuses) the embedded cluster."""
    if settings.state_dsn is not None:
        dsn = settings.state_dsn.get_secret_value()
    else:
        pg = embedded_cluster(settings)
        if start:
            pg.start()
        dsn = pg.dsn()
    if run_migrations:
        migrate(dsn)
    return dsn


def make_pool(
    dsn: str,
    *,
    max_size: int = 10,
    min_size: int = 1,
    name: str = "trace",
    autocommit: bool = False,
    options: str | None = None,
) -> ConnectionPool:
    """`autocommit` for single-statement work (one round trip, no BEGIN/COMMIT); `options` are
    server settings for the session, e.g. "-c synchronous_commit=off"."""
    if options:
        dsn = make_conninfo(dsn, options=options)
    pool = ConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs={"row_factory": dict_row, "autocommit": autocommit},
        name=name,
        open=False,
    )
    pool.open(wait=True, timeout=30)
    return pool
