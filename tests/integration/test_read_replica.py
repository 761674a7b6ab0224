"""The read replica (TRACE_READ_REPLICA_DSN, db/replica.py) against a real streaming replica:
a hot standby of the harness's server made by `pg_basebackup -R`, one for the module; each
test's database (cloned on the server from its template) is replicated with the rest."""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client import generate_latest

from tests.support.dags import admin, three_jobs
from tests.support.replica import StreamingReplica
from tests.support.wait import wait_for
from trace_platform.config import Settings
from trace_platform.contract import ClaimRequest, CompleteRequest, HeartbeatRequest, TaskSpec
from trace_platform.db.embedded import EmbeddedPostgres, free_port
from trace_platform.db.replica import ReadPools
from trace_platform.errors import NotFound
from trace_platform.lite.stack import ApiServer
from trace_platform.metrics.api import ApiMetrics
from trace_platform.services import Services
from trace_platform.store.dag_tasks import DagTaskStore


@pytest.fixture(scope="module")
def replica(pg_server: str) -> Iterator[StreamingReplica]:
    """A streaming replica of the harness's server (every test database of it), for this
    module's tests only: stopped when they are done, so no later test's WAL is replayed."""
    primary = EmbeddedPostgres.serving(pg_server)
    if primary is None:
        pytest.skip("TRACE_TEST_DSN's server: no data directory here to make a replica of")
    root = Path(tempfile.mkdtemp(prefix="trace-test-replica-", dir="/tmp"))
    root.chmod(0o755)  # the server's OS user goes through it
    standby = StreamingReplica(primary, root / "replica")
    try:
        yield standby.start()
    finally:
        standby.destroy()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def services(dsn: str, replica: StreamingReplica, tmp_path: Path) -> Iterator[Services]:
    """Services over this test's database, reading the replica's copy of it (its lag checked
    at every read, so a test sees each change at once)."""
    replica.caught_up()  # the database was cloned a moment ago
    dbname = str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])
    settings = Settings(
        state_dsn=dsn,
        read_replica_dsn=replica.dsn(dbname),
        read_replica_max_lag_seconds=60,
        auth="permissive",
        home=tmp_path / "home",
    )
    svc = Services.build(settings, dsn)
    assert svc.reads is not None
    svc.reads.check_every = 0.0
    try:
        yield svc
    finally:
        svc.close()
        replica.resume()  # a failed test may leave it paused


def reads(services: Services) -> ReadPools:
    assert services.reads is not None
    return services.reads


def count(services: Services, metric: str, **labels: str) -> float:
    """A sample of the read pools' metrics, as /metrics shows it."""
    for family in reads(services).collect():
        for s in family.samples:
            if s.name == metric and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise AssertionError(f"no sample {metric} {labels}")


def served(services: Services, where: str) -> float:
    return count(services, "trace_state_reads_total", served_by=where)


def fallbacks(services: Services, reason: str) -> float:
    return count(services, "trace_read_replica_fallbacks_total", reason=reason)


def primary_runs(services: Services) -> set[Any]:
    with services.pool.connection() as conn:
        me = admin(services)
        dags = services.control._deployable_dag_ids(conn, me)
        rows = DagTaskStore(conn).list_runs(org_id=me.org_id, dag_ids=dags, dag=None, limit=50)
        return {r["run_id"] for r in rows.fetchall()}


def test_reads_are_served_by_the_replica(services: Services, replica: StreamingReplica) -> None:
    """Lists read the replica: with its replay paused, a run the primary has is not listed; a
    run shown by id is read again on the primary when the replica does not know it (a trigger's
    caller sees its run); once replay resumes the list has it."""
    cp, me = services.control, admin(services)
    cp.deploy(me, three_jobs())
    first = cp.trigger(me, "hello")["run_id"]
    replica.caught_up()
    before = served(services, "replica")
    assert [r["run_id"] for r in cp.list_runs(me)] == [first]
    assert served(services, "replica") == before + 1

    replica.pause()
    fired = cp.trigger(me, "hello")
    second = fired["run_id"]
    assert primary_runs(services) == {first, second}
    assert [r["run_id"] for r in cp.list_runs(me)] == [first]  # the replica's answer
    assert reads(services).verdict().replica

    # Read your writes: what the replica does not have yet is read on the primary.
    assert fallbacks(services, "not_found") == 0
    assert cp.show_run(me, second)["run_id"] == second
    (task_id,) = fired["tasks"]
    assert cp.get_task(me, task_id).status == "queued"
    assert fallbacks(services, "not_found") == 2
    with pytest.raises(NotFound):  # nowhere at all: still not found, from the primary
        cp.show_run(me, uuid.uuid4())

    replica.resume()
    replica.caught_up()
    assert {r["run_id"] for r in cp.list_runs(me)} == {first, second}


def test_a_replica_behind_by_more_than_the_limit_is_not_read(
    services: Services, replica: StreamingReplica, caplog: pytest.LogCaptureFixture
) -> None:
    cp, me = services.control, admin(services)
    reads(services).max_lag = 0.5
    cp.deploy(me, three_jobs())
    replica.caught_up()
    # Fresh (the harness may be cloning the next test's database meanwhile: a moment's lag).
    wait_for(lambda: reads(services).verdict().replica, 10, "the replica fresh")

    replica.pause()
    run = cp.trigger(me, "hello")["run_id"]
    with caplog.at_level(logging.INFO, logger="trace_platform.db.replica"):
        caplog.clear()
        lagging = wait_for(
            lambda: (v := reads(services).verdict()).reason == "lagging" and v, 10, "lagging"
        )
        assert lagging.lag is not None and lagging.lag > 0.5
        before = served(services, "primary")
        assert run in {r["run_id"] for r in cp.list_runs(me)}  # the primary's answer
        assert served(services, "primary") == before + 1
        assert fallbacks(services, "lagging") >= 1
        # Exposed: the API's /metrics has the lag, and the change was logged once.
        scraped = generate_latest(ApiMetrics(services).registry).decode()
        (line,) = [x for x in scraped.splitlines() if x.startswith("trace_read_replica_lag_s")]
        assert float(line.split()[-1]) > 0.5
        # Replay paused, it stayed behind through every check since: one line, not one a check.
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "TRACE_READ_REPLICA_MAX_LAG_SECONDS=0.5" in warnings[0]
        replica.resume()
        wait_for(lambda: reads(services).verdict().replica, 10, "the replica fresh again")
        after_lag = served(services, "primary")
    assert any("reads go to the read replica" in r.getMessage() for r in caplog.records)
    # A clone of the harness's next database must not make the last read land on the primary.
    reads(services).max_lag = 60
    before = served(services, "replica")
    # Now the replica's answer, once its replay reached the run (fresh by the lag check is
    # not yet replayed to the last commit: a loaded full run read it a moment early).
    wait_for(lambda: run in {r["run_id"] for r in cp.list_runs(me)}, 10, "the run on the replica")
    assert served(services, "replica") > before and served(services, "primary") == after_lag


def test_writes_never_go_to_the_replica(services: Services, replica: StreamingReplica) -> None:
    """A whole lifecycle with the replica set, its read-only paths read between each step (in
    process and over HTTP): nothing fails, so no write reached the read-only replica; and a
    write sent through the read pools fails loudly."""
    cp, me, d = services.control, admin(services), services.dispatcher
    deployed = cp.deploy(me, three_jobs())
    fired = cp.trigger(me, "hello")
    run, (source,) = fired["run_id"], fired["tasks"]
    adhoc = cp.create_task(me, TaskSpec(job="adhoc", operator="noop"))
    replica.caught_up()

    def read_everything() -> None:
        assert [x["name"] for x in cp.list_dags(me)] == ["hello"]
        assert cp.show_dag(me, "hello")["version"] == deployed.version
        assert {x["dataset_name"] for x in cp.list_datasets(me)} == {"hello_raw", "hello_clean"}
        assert cp.show_dataset(me, "hello_raw")["dataset_uuid"] == deployed.datasets["hello_raw"]
        assert cp.dataset_versions(me, "hello_raw")
        assert run in {r["run_id"] for r in cp.list_runs(me)}
        assert cp.show_run(me, run)["tasks"]
        assert {source, adhoc.task_id} <= {t["task_id"] for t in cp.list_tasks(me)}
        assert cp.get_task(me, source).task_id == source
        assert cp.audit_log(me)["entries"]

    before = served(services, "replica")
    read_everything()
    assert served(services, "replica") == before + 10
    assert all(fallbacks(services, r) == 0 for r in ("not_found", "failed", "lagging"))

    c = d.claim(ClaimRequest(task_id=source, worker_id="w"))
    lease = {"task_id": source, "attempt": c.attempt, "lease_token": c.lease_token}
    d.heartbeat(HeartbeatRequest(**lease))
    read_everything()
    d.complete(CompleteRequest(**lease, outcome="succeeded"))
    replica.caught_up()
    read_everything()
    assert cp.get_task(me, source).status == "succeeded"
    assert cp.cancel_task(me, adhoc.task_id).status == "canceled"
    again = cp.trigger(me, "hello")["run_id"]
    assert cp.cancel_run(me, again)["canceled"] == 1
    assert cp.set_read_roles(me, "hello_raw", ["analysts"], []) == ["analysts"]
    assert cp.purge_versions(me, "hello_raw", keep=1, dry_run=True)["purged"] == []
    cp.deploy(me, three_jobs().replace("count: 3", "count: 4"))
    read_everything()

    # Over HTTP: the routes of those paths answer, a run fired a moment ago included.
    server = ApiServer(services, "127.0.0.1", free_port(), background=False)
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            for path in ("/v1/dags", "/v1/dags/hello", "/v1/datasets", "/v1/runs", "/v1/tasks"):
                assert http.get(path).status_code == 200, path
            new = http.post("/v1/dags/hello/trigger").json()
            shown = http.get(f"/v1/runs/{new['run_id']}")
            assert shown.status_code == 200 and shown.json()["run_id"] == new["run_id"]
            assert http.get(f"/v1/tasks/{new['tasks'][0]}").json()["status"] == "queued"
    finally:
        server.stop()
    assert served(services, "replica") > before + 30

    def write(pool: Any) -> None:
        with pool.connection() as conn:
            conn.execute("UPDATE dags SET paused = paused")

    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        reads(services).read(write)


def test_a_replica_that_fails_a_read_hands_it_to_the_primary(
    services: Services, replica: StreamingReplica
) -> None:
    cp, me = services.control, admin(services)
    cp.deploy(me, three_jobs())
    run = cp.trigger(me, "hello")["run_id"]
    replica.caught_up()
    assert [r["run_id"] for r in cp.list_runs(me)] == [run]  # the replica's pool has a session
    reads(services).check_every = 3600.0  # no check before the next read: the read itself fails
    dbname = psycopg.conninfo.conninfo_to_dict(reads(services).replica_dsn or "")["dbname"]
    with psycopg.connect(replica.dsn("postgres"), autocommit=True) as conn:
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
            (dbname,),
        ).fetchone()
    assert killed and killed[0] >= 1
    assert [r["run_id"] for r in cp.list_runs(me)] == [run]
    assert fallbacks(services, "failed") == 1
    reads(services).check_every = 0.0
    assert reads(services).verdict().replica  # checked again: a new session, fresh
    assert [r["run_id"] for r in cp.list_runs(me)] == [run]
    assert fallbacks(services, "failed") == 1


def test_a_replica_that_is_not_one_is_not_read(
    services: Services, replica: StreamingReplica, caplog: pytest.LogCaptureFixture
) -> None:
    """Unreachable, the primary itself, another database: each read on the primary, logged;
    and the answer is checked again only after `check_every`."""
    me = admin(services)
    dbname = str(psycopg.conninfo.conninfo_to_dict(services.dsn)["dbname"])
    nobody = f"host=127.0.0.1 port={free_port()} dbname={dbname} user=x password=x"
    cases = {
        "unreachable": nobody,
        "not_standby": services.dsn,
        "other_server": replica.dsn("postgres"),
    }
    for reason, dsn in cases.items():
        pools = ReadPools(services.pool, dsn, check_every=3600.0)
        try:
            with caplog.at_level(logging.WARNING, logger="trace_platform.db.replica"):
                caplog.clear()
                rows = pools.read(lambda pool: services.control._list_dags(pool, me))
                verdict = pools.verdict()
                assert rows == [] and verdict.reason == reason
            # The read's check, not made again: each check makes a new answer.
            assert pools.verdict() is verdict
            assert "reads go to the primary" in caplog.text, reason
            assert math.isnan(
                next(s.value for f in pools.collect() for s in f.samples if "lag" in s.name)
            )
            fell = [
                s.value
                for f in pools.collect()
                for s in f.samples
                if s.name == "trace_read_replica_fallbacks_total"
            ]
            assert sum(fell) == 1
        finally:
            pools.close()
