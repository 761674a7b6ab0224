"""Connection pools and DSN resolution (embedded Postgres when no DSN is configured)."""

from __future__ import annotations

import logging
import os

from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from trace_platform.config import Settings
from trace_platform.db.embedded import DB_NAME, READER, SINK, EmbeddedPostgres
from trace_platform.db.migrate import migrate

log = logging.getLogger(__name__)


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


def query_dsn(settings: Settings, data_dsn: str) -> str:
    """The Query Service's Postgres login: TRACE_READ_DSN when set (an external server: a login
    in the group `trace_published_read`); else, when `data_dsn` is an embedded cluster's (see
    `_embedded_login`), its `trace_query` login on the same database; else, with a warning, the
    data login itself."""
    if settings.read_dsn is not None:
        return settings.read_dsn.get_secret_value()
    if login := _embedded_login(data_dsn, READER):
        return login
    log.warning(
        "The Query Service reads Postgres with the data login: set TRACE_READ_DSN to a login "
        "in the role trace_published_read (SELECT on the published data only)"
    )
    return data_dsn


def sink_dsn(settings: Settings, dsn: str) -> str:
    """The hot_window sink's Postgres login, for the worker's trusted host: TRACE_DATA_DSN when
    set (an external server: a login in the group `trace_sink_write`, migration 0010); else,
    when `dsn` (the state DSN) is an embedded cluster's (see `_embedded_login`), that cluster's
    `trace_sink` login on the same database; else, with a warning, `dsn` itself."""
    if settings.data_dsn is not None:
        return settings.data_dsn.get_secret_value()
    if login := _embedded_login(dsn, SINK):
        return login
    log.warning(
        "The hot_window sink writes Postgres data with the state login: set TRACE_DATA_DSN to a "
        "login in the role trace_sink_write (dataset schemas and published views only)"
    )
    return dsn


def _embedded_login(dsn: str, user: str) -> str | None:
    """`user`'s DSN on the database of `dsn`, when `dsn` points at an embedded cluster this
    process started (Lite's own, the test harness's) or is the superuser login of one whose
    cluster.json this process can read (a worker's: one connection, once per process)."""
    info = EmbeddedPostgres.logins_of(dsn)
    if info is None:
        return None
    return info.login_dsn(user, str(conninfo_to_dict(dsn).get("dbname") or DB_NAME))


# The queue's statements (receive, ack: CTEs over unnest()ed arrays, on one unpartitioned
# table, every row found by key or off one index) are prepared by psycopg after a few runs,
# and Postgres then kept planning each run afresh: its estimate of their generic plan lost to
# the custom one, whose planning cost it does not weigh. Measured: a receive of 10 messages
# went from about 1.1 to 0.6 ms. The state pool keeps Postgres's choice, but for the
# Dispatcher's own store transactions (store/tasks/postgres.py), which run on a pool of their
# own that sets it: a generic plan takes `LIMIT $1` for a tenth of the rows, which made the
# task listings read every task, and elsewhere on the state pool (control plane, ad hoc
# reads) such a plan may hide.
GENERIC_PLANS = "-c plan_cache_mode=force_generic_plan"


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
    server settings for the session, e.g. "-c synchronous_commit=off", after any the DSN has."""
    if options:
        # The DSN's own, else the environment's (libpq reads PGOPTIONS only when the DSN
        # gives none, which it now always does).
        given = conninfo_to_dict(dsn).get("options") or os.environ.get("PGOPTIONS")
        dsn = make_conninfo(dsn, options=f"{given} {options}" if given else options)
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
