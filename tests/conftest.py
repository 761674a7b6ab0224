"""Test harness: one throwaway Postgres cluster per run (or TRACE_TEST_DSN's server), a
migrated template database, and a fresh database cloned from it for each test."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support.databases import Databases, with_db
from tests.support.scheduling import (
    SHARED_GROUPS,
    DurationRecorder,
    LongestFirst,
    grouped_modules,
)
from trace_platform.config import Settings
from trace_platform.db.embedded import EmbeddedPostgres
from trace_platform.db.migrate import migrate
from trace_platform.services import Services

TEMPLATE = "trace_template"
# Modules whose tests start Spark, whole stacks, many processes or long fuzzing runs: marked slow
# here (as tests/chaos and the end-to-end modules mark themselves), so `make check` (-m "not
# slow") stays the quick loop; `make test` runs them all. Measured by `pytest --durations`.
SLOW_MODULES = frozenset(
    {
        "tests/integration/test_alert_evaluate.py",
        "tests/integration/test_alerts_stack.py",
        "tests/integration/test_api_fuzz.py",
        "tests/integration/test_authorization.py",
        "tests/integration/test_backfill.py",
        "tests/integration/test_benches_smoke.py",
        "tests/integration/test_buffered_stack.py",
        "tests/integration/test_claim_retry.py",
        "tests/integration/test_cli.py",
        "tests/integration/test_cli_terminal.py",
        "tests/integration/test_compose.py",
        "tests/integration/test_dag_files.py",
        "tests/integration/test_dataset_versions.py",
        "tests/integration/test_delivery_cli.py",
        "tests/integration/test_embedded.py",
        "tests/integration/test_exact_amounts.py",
        "tests/integration/test_exchange_listener.py",
        "tests/integration/test_generic_plans.py",
        "tests/integration/test_generic_plans_icu.py",
        "tests/integration/test_hostile_inputs.py",
        "tests/integration/test_immutable_files.py",
        "tests/integration/test_name_owners.py",
        "tests/integration/test_query_limits.py",
        "tests/integration/test_read_replica.py",
        "tests/integration/test_safe_change.py",
        "tests/integration/test_safe_change_attacks.py",
        "tests/integration/test_spark_isolation.py",
        "tests/integration/test_worker_loop.py",
        "tests/property/test_lifecycle_machine.py",
        "tests/unit/test_query_guard_fuzz.py",
        "tests/unit/test_spark_objects.py",
    }
)
# The test operators (noop, emit_events, probe, …): for this process (DAG validation) and every
# worker it spawns. A production install never sets this; the aws profile refuses it.
os.environ["TRACE_OPERATOR_REGISTRY"] = "testing"
# Every Spark JVM of the run (in-process sessions and every worker's operator hosts) on the
# quick compiler profile: the tests' data is small, and C2 doubled their JVMs' CPU.
os.environ.setdefault("TRACE_SPARK_JIT", "quick")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A DSN (to database `postgres`) of a server the tests may create databases on."""
    external = os.environ.get("TRACE_TEST_DSN")
    if external:
        yield external
        return
    root = Path(tempfile.mkdtemp(prefix="trace-test-pg-", dir="/tmp"))
    root.chmod(0o755)
    pg = EmbeddedPostgres(root / "cluster", durable=False)
    pg.start()
    try:
        yield pg.dsn("postgres")
    finally:
        pg.destroy()


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> str:
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(TEMPLATE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE)))
    migrate(with_db(pg_server, TEMPLATE))
    return TEMPLATE


@pytest.fixture(scope="session")
def databases(pg_server: str, template_db: str) -> Iterator[Databases]:
    dbs = Databases(pg_server, template_db)
    yield dbs
    dbs.close()


@pytest.fixture
def dsn(databases: Databases) -> Iterator[str]:
    """A fresh, migrated database for this test (River-style per-test schema)."""
    dsn = databases.take()
    yield dsn
    databases.drop(dsn)


@pytest.fixture
def settings(tmp_path: Path, dsn: str) -> Settings:
    return Settings(
        state_dsn=dsn,
        auth="permissive",
        home=tmp_path / "home",
        lease_seconds=2.0,
        heartbeat_seconds=0.3,
        retry_backoff_seconds=0.05,
        retry_backoff_max_seconds=0.2,
        reaper_interval_seconds=0.2,
        queue_poll_seconds=0.2,
    )


@pytest.fixture
def services(settings: Settings, dsn: str) -> Iterator[Services]:
    svc = Services.build(settings, dsn)
    yield svc
    svc.close()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's real S3 HTTP server on 127.0.0.1 (in memory): the stand-in for MinIO/AWS here."""
    from moto.server import ThreadedMotoServer

    from trace_platform.db.embedded import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).resolve().parent.parent
    missing = sorted(m for m in SLOW_MODULES if not (root / m).exists())
    if missing:  # a renamed module would silently join the quick loop
        raise pytest.UsageError(f"tests/conftest.py SLOW_MODULES names no file: {missing}")
    grouped = grouped_modules()
    for item in items:
        module = item.path.resolve().relative_to(root).as_posix()
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        for mark in item.iter_markers("xdist_group"):
            if SHARED_GROUPS.get(module) != (mark.args[0] if mark.args else mark.kwargs["name"]):
                raise pytest.UsageError(
                    f"{item.nodeid}: its xdist_group mark must be listed in "
                    "tests/support/scheduling.SHARED_GROUPS (the scheduler reads groups there)"
                )
        if shares_a_module_fixture(item) and module not in grouped:
            raise pytest.UsageError(
                f"{item.nodeid} uses a module-scoped fixture that "
                "tests/support/scheduling.grouped_modules does not see: its module would make "
                "it once per worker"
            )


def shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs and defs[-1].scope == "module"
        for name, defs in info.name2fixturedefs.items()
        if name in info.names_closure
    )


@pytest.hookimpl(tryfirst=True)  # before xdist picks its own for "loadgroup"
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") == "loadgroup":
        return LongestFirst(config, log)
    return None


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get("TRACE_TEST_DURATIONS_OUT")
    if out:
        config.pluginmanager.register(DurationRecorder(out), "trace-durations")
