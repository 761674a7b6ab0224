"""The status-index statements (COLLATE "C" predicates, migrations 0020-0021) under a database
whose default collation is not C (ICU en-US, as a managed Postgres is often created): the
same rows, read by key. The test_generic_plans tests run here against such a database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests.integration.test_generic_plans import (  # noqa: F401  (collected here)
    test_a_freed_slot_reads_only_its_pools_queued_tasks,
    test_the_reaper_reads_the_running_tasks_and_nothing_else,
    test_the_rewake_reads_only_the_stranded_tasks,
)
from trace_platform.db.migrate import migrate


@pytest.fixture
def dsn(pg_server: str) -> Iterator[str]:
    name = f"icu_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        try:
            conn.execute(
                sql.SQL(
                    "CREATE DATABASE {} TEMPLATE template0 LOCALE_PROVIDER icu "
                    "ICU_LOCALE 'en-US' LOCALE 'C.utf8'"
                ).format(sql.Identifier(name))
            )
        except psycopg.Error as e:
            pytest.skip(f"no ICU collation here: {e}")
    db = psycopg.conninfo.make_conninfo(pg_server, dbname=name)
    migrate(db)
    yield db
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
