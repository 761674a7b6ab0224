"""Prometheus metrics (docs/operations.md, "Metrics"): the API's /metrics on a listener of its
own equals the database (tasks by status, outbox, queues, deliveries, sink backlog, workers),
counts what its Dispatcher handled, times requests by route template, and is reached through
no API route; a worker's counts what it ran."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.invariants import expire_lease
from tests.support.queue_conformance import wake
from tests.support.servers import admin_key, bearer
from tests.support.wait import wait_for
from trace_platform.config import QueueBackend, Settings
from trace_platform.contract import ClaimRequest, CompleteRequest, HeartbeatRequest, TaskSpec
from trace_platform.db.embedded import free_port
from trace_platform.errors import Conflict
from trace_platform.lite.stack import ApiServer, LiteStack
from trace_platform.metrics.api import CacheCollector
from trace_platform.metrics.state import QUEUE_STATES, STATUSES, StateCollector
from trace_platform.queue import make_driver
from trace_platform.services import Services

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape by (name, sorted labels); the parser refuses a malformed one."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def scrape(port: int) -> Samples:
    r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert r.status_code == 200, r.text
    return parse(r.text)


def rows(dsn: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, args).fetchall()


@pytest.fixture
def api(settings: Settings, dsn: str) -> Iterator[tuple[Services, str, int]]:
    """Services that require keys, an API serving them (no background loops: the test moves
    every task itself) and its /metrics port: (services, API URL, metrics port)."""
    port = free_port()
    svc = Services.build(
        settings.model_copy(update={"auth": "required", "metrics_port": port}), dsn
    )
    server = ApiServer(svc, "127.0.0.1", free_port(), background=False)
    server.start()
    try:
        yield svc, server.url, port
    finally:
        server.stop()
        svc.close()


def test_the_api_metrics_equal_the_database(api: tuple[Services, str, int], dsn: str) -> None:
    svc, url, port = api
    d = svc.dispatcher
    spec = TaskSpec(job="m", operator="noop", max_attempts=1)
    ids = [d.create_task(spec).task_id for _ in range(5)]
    svc.publisher.drain()  # their wake-ups on the queue
    claims = [d.claim(ClaimRequest(task_id=t, worker_id="w1")) for t in ids[:3]]
    d.complete(CompleteRequest(**lease(claims[0]), outcome="succeeded"))
    d.complete(CompleteRequest(**lease(claims[1]), outcome="failed", error="no"))
    d.heartbeat(HeartbeatRequest(**lease(claims[2])))
    with pytest.raises(Conflict):
        d.heartbeat(HeartbeatRequest(**{**lease(claims[2]), "lease_token": uuid.uuid4()}))
    expire_lease(svc, claims[2].task_id)
    assert d.reap() == 1  # its only try: failed
    d.create_task(spec)  # a wake-up left unsent
    # Requests: a DAG that does not exist (its route's template), a path no route has.
    key = admin_key(svc)
    assert httpx.get(f"{url}/v1/dags/xyz", headers=bearer(key)).status_code == 404
    assert httpx.get(f"{url}/v1/no/such/path", headers=bearer(key)).status_code == 404

    got = scrape(port)
    exact = dict(rows(dsn, "SELECT status, count(*) FROM task_status GROUP BY status"))
    assert exact == {"queued": 3, "succeeded": 1, "failed": 2}  # the test did what it meant
    for status in ("queued", "buffered", "running"):
        assert value(got, "trace_tasks", status=status) == exact.get(status, 0), status
    [(unsent, oldest)] = rows(
        dsn,
        "SELECT count(*), extract(epoch FROM now() - min(created_at)) FROM outbox "
        "WHERE sent_at IS NULL",
    )
    assert unsent == 1 and value(got, "trace_outbox_unsent") == 1
    assert 0 < value(got, "trace_outbox_oldest_unsent_seconds") <= float(oldest) + 5
    [(queued,)] = rows(dsn, "SELECT count(*) FROM queue_messages WHERE queue_name = 'tasks'")
    assert queued == 5  # nothing received them
    assert value(got, "trace_queue_messages", queue="tasks", state="ready") == queued
    assert value(got, "trace_queue_messages", queue="tasks", state="leased") == 0
    assert value(got, "trace_queue_messages", queue="lambda", state="ready") == 0
    assert value(got, "trace_queue_oldest_ready_seconds", queue="tasks") > 0
    # What this process's Dispatcher handled.
    assert value(got, "trace_heartbeats_total", result="accepted") == 1
    assert value(got, "trace_heartbeats_total", result="refused") == 1
    assert value(got, "trace_attempts_reaped_total", reason="lease_expired") == 1
    assert value(got, "trace_attempts_reaped_total", reason="timed_out") == 0
    # Latencies by route template: never the raw path (its cardinality is the callers').
    hist = "trace_http_request_duration_seconds_count"
    assert value(got, hist, route="/v1/dags/{name}", method="GET", status="404") == 1
    assert value(got, hist, route="unmatched", method="GET", status="404") == 1
    routes = {dict(labels).get("route") for name, labels in got if name == hist}
    assert not any("xyz" in r or "no/such" in r for r in routes if r), routes
    # Every read answered.
    assert all(v == 0 for (n, _), v in got.items() if n == "trace_metrics_read_errors_total")


def lease(c: Any) -> dict[str, Any]:
    return {"task_id": c.task_id, "attempt": c.attempt, "lease_token": c.lease_token}


def test_metrics_are_on_their_own_loopback_port_not_the_api(
    api: tuple[Services, str, int],
) -> None:
    """No API key reaches them through the API (an org admin's included: the figures are every
    org's); the listener is bound to the API's host (loopback here) and serves /metrics alone."""
    svc, url, port = api
    key = admin_key(svc)
    for headers in ({}, bearer(key), {"X-Internal-Token": svc.internal_token or ""}):
        assert httpx.get(f"{url}/metrics", headers=headers).status_code in (401, 404)
    assert httpx.get(f"{url}/metrics", headers=bearer(key)).status_code == 404
    assert bound_to(port) == "127.0.0.1"
    assert httpx.get(f"http://127.0.0.1:{port}/other").status_code == 404
    assert httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 200


def bound_to(port: int) -> str:
    """The address a listener on `port` of this host is bound to (from /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        host, hex_port = local.split(":")
        if int(hex_port, 16) == port and state == "0A":  # LISTEN
            return ".".join(str(b) for b in reversed(bytes.fromhex(host)))
    raise AssertionError(f"nothing listens on port {port}")


def collected(collector: StateCollector) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in collector.collect()
        for s in family.samples
    }


def test_backlogs_and_estimates_equal_the_database(services: Services, dsn: str) -> None:
    """Every scrape-time figure against the rows it stands for: tasks by status (estimated
    from the statistics, for all statuses), each queue's states, deliveries, the sink's
    backlog by dataset and the worker registry."""
    counts = {"queued": 40, "buffered": 80, "running": 120, "succeeded": 400, "failed": 160}
    dataset = uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for status, n in counts.items():
            conn.execute(
                "INSERT INTO task_status (task_id, start_day, status) "
                "SELECT gen_random_uuid(), 0, %s FROM generate_series(1, %s)",
                (status, n),
            )
        for (part,) in conn.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits "
            "WHERE inhparent = 'task_status'::regclass"
        ).fetchall():
            conn.execute(f"ANALYZE {part}")
        # Queues: ready, delayed, leased in place and in a batch lease, dead.
        conn.execute(
            "INSERT INTO queue_messages (queue_name, payload, visible_at, lease_until, lease_token)"
            " VALUES ('tasks', '{}', now() - interval '30 s', NULL, NULL),"
            " ('tasks', '{}', now() + interval '1 h', NULL, NULL),"
            " ('tasks', '{}', now(), now() + interval '1 min', gen_random_uuid()),"
            " ('buffer.x', '{}', now() - interval '5 s', NULL, NULL)"
        )
        conn.execute(
            "INSERT INTO queue_leases (token, queue_name, lease_until, held, ids, attempts, "
            "max_attempts, created_at, last_error, payloads) VALUES (gen_random_uuid(), "
            "'tasks', now() + interval '1 min', '{7,8}', '{7,8,9}', '{1,1,1}', '{20,20,20}', "
            "ARRAY[now(), now(), now()], '{NULL,NULL,NULL}', '[{}, {}, {}]')"
        )
        conn.execute(
            "INSERT INTO queue_dead (id, queue_name, payload, created_at, attempts) "
            "VALUES (99, 'tasks', '{}', now(), 20)"
        )
        # Deliveries: two pending (one overdue by a minute), one sending, one delivered.
        for status, created, due in (
            ("pending", "10 min", "1 min"),
            ("pending", "1 min", "-1 h"),
            ("sending", "20 min", "0 s"),
            ("delivered", "1 h", "0 s"),
        ):
            conn.execute(
                "INSERT INTO deliveries (delivery_id, org_id, idempotency_key, destination, "
                "record_id, rule, severity, event_time, body, status, created_at, "
                "next_attempt_at) VALUES (gen_random_uuid(), gen_random_uuid(), "
                "gen_random_uuid()::text, 'ops', gen_random_uuid(), 'r', 'high', now(), '{}', "
                "%s, now() - %s::interval, now() - %s::interval)",
                (status, created, due),
            )
        # The sink's backlog: pending and loaded batches (their dataset's rows aside).
        conn.execute("SET session_replication_role = replica")  # no foreign keys checked
        for status, age in (("pending", "2 min"), ("pending", "1 min"), ("loaded", "1 h")):
            conn.execute(
                "INSERT INTO buffer_records (record_id, dataset_uuid, org_id, task_id, attempt, "
                "start_day, job, location, content_type, status, created_at) VALUES "
                "(gen_random_uuid(), %s, gen_random_uuid(), gen_random_uuid(), 1, 0, 'j', "
                "gen_random_uuid()::text, 'application/jsonl', %s, now() - %s::interval)",
                (dataset, status, age),
            )
        conn.execute("SET session_replication_role = DEFAULT")
        for state, slots in (("alive", 2), ("alive", 3), ("dead", 4), ("stopped", 1)):
            ended = "now()" if state != "alive" else "NULL"
            conn.execute(
                "INSERT INTO workers (worker_id, host, pid, version, slots, beat_seconds, "
                f"state, ended_at) VALUES (gen_random_uuid()::text, 'h', 1, 'v', %s, 5, %s, "
                f"{ended})",
                (slots, state),
            )

    got = collected(StateCollector(services.pool, queues=("tasks", "lambda")))
    for status in STATUSES:
        want = counts.get(status, 0)
        assert value(got, "trace_tasks_estimated", status=status) == want, status
    for status in ("queued", "buffered", "running"):
        assert value(got, "trace_tasks", status=status) == counts[status]
    states = {s: value(got, "trace_queue_messages", queue="tasks", state=s) for s in QUEUE_STATES}
    assert states == {"ready": 1, "delayed": 1, "leased": 3}
    assert 29 < value(got, "trace_queue_oldest_ready_seconds", queue="tasks") < 60
    assert value(got, "trace_queue_messages", queue="buffer.x", state="ready") == 1
    assert value(got, "trace_queue_messages", queue="lambda", state="ready") == 0
    assert value(got, "trace_queue_dead_letters", queue="tasks") == 1
    assert value(got, "trace_deliveries", status="pending") == 2
    assert value(got, "trace_deliveries", status="sending") == 1
    assert 20 * 60 - 1 < value(got, "trace_delivery_oldest_seconds") < 20 * 60 + 30
    assert 59 < value(got, "trace_delivery_overdue_seconds") < 90
    assert value(got, "trace_sink_pending_batches", dataset_uuid=str(dataset)) == 2
    assert 119 < value(got, "trace_sink_oldest_pending_seconds", dataset_uuid=str(dataset)) < 150
    assert value(got, "trace_workers", state="alive") == 2
    assert value(got, "trace_workers", state="dead") == 1
    assert value(got, "trace_workers", state="stopped") == 1
    assert value(got, "trace_worker_slots") == 5


def test_a_read_that_runs_out_of_time_is_left_out_not_the_scrape(
    services: Services, dsn: str
) -> None:
    """Each read is bounded by its statement_timeout: one blocked (the outbox locked by
    someone else) is missing from that scrape and counted; every other figure is there."""
    collector = StateCollector(services.pool, queues=("tasks",), timeout_ms=200)
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        got = collected(collector)
    names = {name for name, _ in got}
    assert "trace_outbox_unsent" not in names
    assert value(got, "trace_metrics_read_errors_total", read="outbox") == 1
    assert value(got, "trace_metrics_read_errors_total", read="tasks") == 0
    assert value(got, "trace_tasks", status="queued") == 0
    assert "trace_queue_messages" in names and "trace_workers" in names
    got = collected(collector)  # the lock gone: the outbox is back
    assert value(got, "trace_outbox_unsent") == 0


@pytest.mark.slow
def test_a_workers_metrics_after_it_ran_tasks(settings: Settings, dsn: str) -> None:
    """`trace worker` with TRACE_WORKER_METRICS_PORT: its claims, outcomes, heartbeats and host
    starts after a task that beats and one that fails; the API counted the same heartbeats."""
    api_port, worker_port = free_port(), free_port()
    stack = LiteStack(
        settings.model_copy(update={"metrics_port": api_port}),
        workers=0,
        dsn=dsn,
        sinks=0,
        deliverers=0,
        lambda_invokers=0,
    )
    with stack:
        stack.add_worker({"TRACE_WORKER_METRICS_PORT": str(worker_port)})
        d = stack.services.dispatcher
        slow = d.create_task(TaskSpec(job="m", operator="sleep", config={"seconds": 1.2}))
        wait_for(lambda: d.get_task(slow.task_id).status == "succeeded", 60, "the sleep task")
        failing = d.create_task(TaskSpec(job="m", operator="fail", max_attempts=1))
        wait_for(lambda: d.get_task(failing.task_id).status == "failed", 60, "the failing task")
        # The worker counts a report once its answer is in (just after the commit).
        got = wait_for(
            lambda: (
                (s := scrape(worker_port))
                and value(s, "trace_worker_tasks_total", outcome="failed") == 1
                and s
            ),
            10,
            "the worker to count its reports",
        )
        api = scrape(api_port)
    assert value(got, "trace_worker_claims_total", result="claimed") == 2
    assert value(got, "trace_worker_claim_seconds_count") == 2
    assert value(got, "trace_worker_tasks_total", outcome="succeeded") == 1
    assert value(got, "trace_worker_reports_unaccepted_total") == 0
    beats = value(got, "trace_worker_heartbeats_total", result="accepted")
    assert beats >= 2  # 1.2 s at a heartbeat every 0.3 s
    assert value(api, "trace_heartbeats_total", result="accepted") == beats
    assert value(got, "trace_worker_operator_host_starts_total", reason="first") == 1
    assert value(got, "trace_worker_operator_host_starts_total", reason="restart") == 0


def test_sqs_queues_show_their_approximate_depths(services: Services, s3_endpoint: str) -> None:
    """On SQS the queue figures are the queues' own approximate counts (moto's server here); a
    queue not made yet is left out, not created by the scrape."""
    settings = Settings(
        queue_driver=QueueBackend.sqs,
        sqs_endpoint_url=s3_endpoint,
        sqs_queue_prefix=f"m{uuid.uuid4().hex[:8]}-",
        sqs_access_key_id="testing",
        sqs_secret_access_key="testing",
    )
    drv = make_driver(settings, dsn="")
    try:
        drv.publish_many("tasks", [wake(), wake()])
        drv.publish("tasks", wake(), delay_seconds=60)
        assert len(drv.receive("tasks", max_messages=1, visibility_timeout_seconds=60)) == 1
        depths = getattr(drv, "approximate_depths", None)
        collector = StateCollector(
            services.pool, queues=("tasks", "lambda"), pgqueue=False, depths=depths
        )
        got = collected(collector)
        states = {
            s: value(got, "trace_queue_messages", queue="tasks", state=s) for s in QUEUE_STATES
        }
        assert states == {"ready": 1, "delayed": 1, "leased": 1}
        assert not any(dict(labels).get("queue") == "lambda" for _, labels in got)
        assert drv.approximate_depths(["lambda"]) == {}  # type: ignore[attr-defined]
        assert value(got, "trace_metrics_read_errors_total", read="queues") == 0
    finally:
        drv.close()


def test_caches_show_their_hits_and_misses() -> None:
    """This process's caches (trace_platform.cache) by name, as the API's registry reads them."""
    cache_module = pytest.importorskip("trace_platform.cache")
    cache = cache_module.LruCache(f"m{uuid.uuid4().hex[:6]}", maxsize=1)
    cache.put("a", 1)
    assert cache.get("a") == 1 and cache.get("b") is None
    cache.put("b", 2)  # evicts a
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in CacheCollector().collect()
        for s in family.samples
    }
    assert value(got, "trace_cache_hits_total", cache=cache.name) == 1
    assert value(got, "trace_cache_misses_total", cache=cache.name) == 1
    assert value(got, "trace_cache_evictions_total", cache=cache.name) == 1
    assert value(got, "trace_cache_entries", cache=cache.name) == 1


def test_a_scrape_storm_takes_one_database_connection_not_the_apis_pool(
    api: tuple[Services, str, int], dsn: str
) -> None:
    """Anyone on the operators' network can open many scrapes at once. Each scrape read the
    state through the API's own pool: 30 at once, each stuck behind a slow read (the outbox
    locked by someone else), held every connection of it, so the API's own requests waited
    for a connection and failed. Scrapes at once share one read: one connection at most."""
    svc, url, port = api
    key = admin_key(svc)
    assert httpx.get(f"{url}/v1/dags", headers=bearer(key)).status_code == 200
    answers: list[int] = []

    def one() -> None:
        answers.append(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code)

    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        storm = [threading.Thread(target=one) for _ in range(30)]
        for t in storm:
            t.start()
        # The first scrape is waiting on the lock: the storm is under way.
        wait_for(lambda: _waiting_on_outbox(dsn) >= 1, timeout=10)
        began = time.monotonic()
        r = httpx.get(f"{url}/v1/dags", headers=bearer(key), timeout=30)
        took = time.monotonic() - began
        waiting = _waiting_on_outbox(dsn)
    for t in storm:
        t.join(timeout=60)
    assert r.status_code == 200, r.text
    assert took < 1.0, f"an API request waited {took:.1f} s behind the scrapes"
    assert waiting <= 1, f"{waiting} scrapes' reads hold connections at once"
    assert answers == [200] * 30


def _waiting_on_outbox(dsn: str) -> int:
    got = rows(
        dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query ILIKE '%%FROM outbox%%' AND pid <> pg_backend_pid()",
    )
    return int(got[0][0])


def test_a_tenants_many_buffered_datasets_do_not_blow_up_the_series(
    services: Services, dsn: str
) -> None:
    """Any user can declare buffered datasets, each with its own sink backlog and queue
    (`buffer.<uuid>`): a series per dataset and queue made the scrape grow with them without
    bound (100k datasets: 700k series each scrape). The largest few are named; the rest are
    summed under `other`, so the totals still equal the database."""
    n = 300
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # no foreign keys checked
        conn.execute(
            "INSERT INTO buffer_records (record_id, dataset_uuid, org_id, task_id, attempt, "
            "start_day, job, location, content_type, created_at) SELECT gen_random_uuid(), "
            "gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 1, 0, 'j', "
            "gen_random_uuid()::text, 'application/jsonl', now() - interval '1 min' "
            "FROM generate_series(1, %s)",
            (n,),
        )
        conn.execute(
            "INSERT INTO queue_messages (queue_name, payload, visible_at) "
            "SELECT 'buffer.' || gen_random_uuid(), '{}', now() - interval '5 s' "
            "FROM generate_series(1, %s)",
            (n,),
        )
    got = collected(StateCollector(services.pool, queues=("tasks", "lambda")))
    sink = {k: v for k, v in got.items() if k[0] == "trace_sink_pending_batches"}
    queues = {dict(k[1])["queue"] for k in got if k[0] == "trace_queue_messages"}
    assert len(sink) <= 25 and len(queues) <= 25, (len(sink), len(queues))
    assert sum(sink.values()) == n
    ready = sum(
        v
        for k, v in got.items()
        if k[0] == "trace_queue_messages" and dict(k[1])["state"] == "ready"
    )
    assert ready == n
    assert {"tasks", "lambda"} <= queues
