"""Acting on the data (issue 40): the sink, alert latency and the Delivery Service, measured side
by side in one run on one embedded Postgres (fsync on), each row with its own Lite stack (real
`trace sink`, `trace worker` and `trace delivery` processes) and counting only its own work.

1. Sink rows/s: N rows of a buffered dataset (transfers: block, tx hash, log index, token,
   addresses, an exact uint256 amount, block time; unique_key (tx_hash, log_index)) written as
   JSONL batches under a claimed attempt's buffer prefix, published through the Dispatcher's
   attempt-fenced buffer publish (what the wrapper's internal call runs), and landed by one
   `trace sink` process; clock from the first publish to the last batch settled. Against a plain
   `COPY` of the same rows (already typed Python values, the same batches, a transaction each)
   into a table of the same DDL and unique index, on the same Postgres, run before and after
   the sink (their mean is the peer). Refuses unless the table holds exactly the N rows, all of
   this row's batches, with sampled rows equal to what was generated (amounts exact).
2. Alert latency: an `alert_evaluate` job (Spark, a real worker's sandboxed host) raises K alerts
   a run; from its publish of them (the alert_events buffer record's time) to the first verified
   receipt of each alert's webhook at a local receiver (standardwebhooks), through the sink, the
   `alert_route` task, the sink again and the Delivery Service. Rounds run one at a time. Refuses
   if an alert recorded for its runs is not received, or anything else arrives.
3. Deliveries/s: M pending deliveries made by the real routing path beforehand, then two
   `trace delivery` processes started; from the first attempt to the last verified receipt,
   each idempotency key received at least once with its stored body (duplicates counted and
   printed), every delivery settled `delivered`.

Every service runs with Lite's defaults (an idle sink looks at its queues again after 0.05 s
just after work, backing off to 0.5 s; an idle Delivery Service waits on its queue, LISTEN in
Lite; it leases 50 deliveries and sends 8 at a time). Rows 1 and 3 also print the CPU per row
or delivery of the row's `trace` processes, of Postgres and of this process (the bench, the
receiver, the stack's API): on a shared machine, a rate is bounded by them. Row 3 prints its
attempts' HTTP latency too (a receiver that drops connections shows there).

    .venv/bin/python bench/act_bench.py [--rows 200000] [--batch 5000] [--rounds 20]
        [--alerts 15] [--deliveries 5000] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import alerts as alert_support
from tests.support import buffers as buffer_support
from tests.support.dags import admin
from tests.support.wait import wait_for

import smoke  # this folder's: run as a script
from dispatch_bench import _ancestor_in, pct, processes  # this folder's: run as a script
from embedded_pg import migrated_postgres  # this folder's: run as a script
from machine import loadavg  # this folder's: run as a script
from trace_platform.alerts.routing import idempotency_key
from trace_platform.config import Settings
from trace_platform.delivery.control import DeliveryControl
from trace_platform.identity.vault import vault_for
from trace_platform.lite.demo.receiver import DemoReceiver
from trace_platform.lite.stack import LiteStack
from trace_platform.services import Services
from trace_platform.store import sink as sink_sql
from trace_platform.store.buffers import BufferStore

BIG = 2**256 - 1
COLUMNS = [
    {"name": "block_number", "type": "int64"},
    {"name": "tx_hash", "type": "text"},
    {"name": "log_index", "type": "int64"},
    {"name": "token", "type": "text"},
    {"name": "from_address", "type": "text"},
    {"name": "to_address", "type": "text"},
    {"name": "amount", "type": "uint256"},
    {"name": "block_time", "type": "timestamp"},
]
KEY = ["tx_hash", "log_index"]
SINK_DAG = f"""
name: act_sink
jobs:
  load:
    operator: publish_rows  # never run: the bench holds its claim and publishes
    config: {{dataset: act_transfers}}
    buffer_outputs: [act_transfers, act_warm]
buffered:
  - {{name: act_transfers, columns: {json.dumps(COLUMNS)}, unique_key: {json.dumps(KEY)},
     writers: [act_sink.load]}}
  - {{name: act_warm, columns: [{{name: k, type: text}}], unique_key: [k],
     writers: [act_sink.load]}}
"""
LATENCY_RULE = "act_latency"


def refuse(why: str) -> SystemExit:
    return SystemExit(f"refusing to print: {why}")


# -- shared pieces ----------------------------------------------------------------------------
class TimedReceiver(DemoReceiver):
    """The demo's verifying receiver, noting when each idempotency key first arrived verified
    (counted as it comes: a check over every arrival per request would slow the receiver)."""

    def __init__(self) -> None:
        super().__init__(path="/hook")
        self.first: dict[str, float] = {}
        self.verified_n = 0
        self._lock = threading.Lock()

    def _arrived(self, body: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        code, extra = super()._arrived(body, headers)
        now = time.time()
        if code == 204:  # verified (this receiver answers nothing else to a verified one)
            with self._lock:
                self.verified_n += 1
                self.first.setdefault(headers.get("webhook-id", ""), now)
        return code, extra


@contextmanager
def receiving(svc: Services, destination: str) -> Iterator[TimedReceiver]:
    """A receiver on 127.0.0.1 and the org's destination pointing at it (its secret the
    receiver's only)."""
    recv = TimedReceiver()
    ctl = DeliveryControl(svc.pool, vault_for(svc.settings))
    recv.secret = ctl.add_destination(admin(svc), destination, recv.url, allow_private=True)
    recv.start()
    try:
        yield recv
    finally:
        recv.stop()


def until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    try:
        return wait_for(check, timeout, what)
    except AssertionError as e:
        raise refuse(str(e)) from None


def records(svc: Services, where: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    with svc.pool.connection() as conn:
        return conn.execute(f"SELECT * FROM buffer_records WHERE {where}", args).fetchall()


def table_of(svc: Services, name: str) -> sql.Identifier:
    with svc.pool.connection() as conn:
        row = BufferStore(conn).buffered_by_name(org_id=admin(svc).org_id, name=name).fetchone()
    if row is None:
        raise refuse(f"no buffered dataset '{name}'")
    schema, _, table = row["table_name"].partition(".")
    return sql.Identifier(schema, table)


def cpu(stack: LiteStack, postmaster: str) -> dict[str, float]:
    """CPU seconds so far of the row's `trace` processes, of Postgres, and of this process (the
    bench, the receiver, the stack's API)."""
    procs = processes()
    daemons = {str(p.pid) for p in stack.daemons}
    out = {"trace": 0.0, "Postgres": 0.0, "bench": 0.0}
    for pid, p in procs.items():
        top = _ancestor_in(pid, procs, daemons | {postmaster})
        if pid == str(os.getpid()):
            out["bench"] += p.cpu
        elif top == postmaster:
            out["Postgres"] += p.cpu
        elif top is not None:
            out["trace"] += p.cpu
    return out


def cpu_since(before: dict[str, float], after: dict[str, float], per: int) -> dict[str, float]:
    """CPU seconds per unit of work, by role."""
    return {k: (after[k] - before[k]) / per for k in before}


def shown(used: dict[str, float], scale: float, unit: str) -> str:
    return ", ".join(f"{k} {v * scale:.1f} {unit}" for k, v in used.items())


# -- 1. sink rows/s against COPY --------------------------------------------------------------
def transfers(n: int, seed: int = 40) -> list[list[Any]]:
    """n transfer rows as the table takes them (COLUMNS' order), amounts from tiny to 2^256-1."""
    rng = random.Random(seed)
    tokens = [f"0x{rng.getrandbits(160):040x}" for _ in range(20)]
    rows = []
    for i in range(n):
        block = 20_000_000 + i // 40
        bits = rng.choice((16, 64, 96, 128, 200, 256))
        amount = BIG if i % 997 == 0 else rng.getrandbits(bits)
        rows.append(
            [
                block,
                f"0x{rng.getrandbits(256):064x}",
                i % 40,
                rng.choice(tokens),
                f"0x{rng.getrandbits(160):040x}",
                f"0x{rng.getrandbits(160):040x}",
                amount,
                datetime.fromtimestamp(1_700_000_000 + block // 2, UTC),
            ]
        )
    return rows


def as_json(row: list[Any]) -> dict[str, Any]:
    """A row as a producer writes it: amounts as decimal text, times as ISO 8601."""
    out = dict(zip((c["name"] for c in COLUMNS), row, strict=True))
    out["amount"] = str(out["amount"])
    out["block_time"] = out["block_time"].isoformat()
    return out


def chunks(rows: list[list[Any]], size: int) -> list[list[list[Any]]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def copy_rate(dsn: str, org_id: uuid.UUID, batches: list[list[list[Any]]]) -> float:
    """Rows/s of a plain COPY of the batches (a transaction each) into a fresh table of the
    sink's own DDL (same types, checks and unique index)."""
    table = f"dataset_{uuid.uuid4().hex}.copy_peer"
    names = ["org_id", *(c["name"] for c in COLUMNS), "record_id"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            sink_sql.ensure_table(conn, table, COLUMNS, KEY)
        schema, _, name = table.partition(".")
        stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(
            sql.Identifier(schema, name), sql.SQL(", ").join(map(sql.Identifier, names))
        )
        record = uuid.uuid4()
        t0 = time.perf_counter()
        for batch in batches:
            with conn.transaction(), conn.cursor().copy(stmt) as cp:
                for row in batch:
                    cp.write_row([org_id, *row, record])
        elapsed = time.perf_counter() - t0
        n = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, name)))
        got = n.fetchone()
    rows = sum(len(b) for b in batches)
    if got is None or got[0] != rows:
        raise refuse(f"the COPY table holds {got} rows, not {rows}")
    return rows / elapsed


def check_sink_table(svc: Services, rows: list[list[Any]], record_ids: list[uuid.UUID]) -> None:
    """Exactly this row's N rows, all from its own batches, and sampled rows exact."""
    table, org = table_of(svc, "act_transfers"), admin(svc).org_id
    with svc.pool.connection() as conn:
        total, own = (
            conn.execute(
                sql.SQL(
                    "SELECT count(*) AS total, count(*) FILTER (WHERE org_id = %s"
                    " AND record_id = ANY(%s)) AS own FROM {}"
                ).format(table),
                (org, record_ids),
            )
            .fetchone()
            .values()
        )
        if (total, own) != (len(rows), len(rows)):
            raise refuse(
                f"the sink's table holds {total} rows ({own} of its batches), not {len(rows)}"
            )
        for row in random.Random(7).sample(rows, min(200, len(rows))):
            got = conn.execute(
                sql.SQL(
                    "SELECT block_number, tx_hash, log_index, token, from_address, to_address,"
                    " amount::text AS amount, block_time FROM {} WHERE tx_hash = %s"
                    " AND log_index = %s"
                ).format(table),
                (row[1], row[2]),
            ).fetchone()
            want = [*row[:6], str(row[6]), row[7]]
            if got is None or list(got.values()) != want:
                raise refuse(f"row {row[1]}:{row[2]} is {got}, not {want}")


def publish_batches(
    svc: Services, dataset: str, batches: list[list[dict[str, Any]]]
) -> Callable[[], list[uuid.UUID]]:
    """The batches written under a claimed attempt's buffer prefix (before the clock), then a
    function publishing them all as the wrapper does (returns the record ids)."""
    me = admin(svc)
    (task_id,) = svc.control.trigger(me, "act_sink")["tasks"]
    c = alert_support.claim(svc, task_id)
    keys = [
        buffer_support.write_lines(
            svc, buffer_support.batch_key(svc, c, me.org_id, f"{dataset}-{i}.jsonl"), b
        )
        for i, b in enumerate(batches)
    ]

    def publish() -> list[uuid.UUID]:
        return [buffer_support.publish(svc, c, dataset, k).record_id for k in keys]

    return publish


def loaded(svc: Services, ids: list[uuid.UUID]) -> list[dict[str, Any]] | None:
    recs = records(svc, "record_id = ANY(%s)", (ids,))
    dead = [r for r in recs if r["status"] == "dead"]
    if dead:
        raise refuse(f"a batch was refused by the sink: {dead[0]['error']}")
    return recs if len(recs) == len(ids) and all(r["status"] == "loaded" for r in recs) else None


def sink_row(
    svc: Services, settings: Settings, postmaster: str, n: int, batch: int
) -> dict[str, Any]:
    rows = transfers(n)
    batches = chunks(rows, batch)
    svc.control.deploy(admin(svc), SINK_DAG)  # before the sink starts: it serves both at once
    publish = publish_batches(svc, "act_transfers", [[as_json(r) for r in b] for b in batches])
    warm = publish_batches(svc, "act_warm", [[{"k": "warm"}]])
    copy_before = copy_rate(svc.dsn, admin(svc).org_id, batches)
    with LiteStack(settings, workers=0, sinks=1, deliverers=0) as stack:
        warm_ids = warm()
        until(lambda: loaded(svc, warm_ids), 120, "the sink's warm-up batch loaded")
        cpu0, t0 = cpu(stack, postmaster), time.time()
        ids = publish()
        published = time.time() - t0
        recs = until(lambda: loaded(svc, ids), max(120, n / 2000), "every batch loaded")
        used = cpu_since(cpu0, cpu(stack, postmaster), n)
    copy_after = copy_rate(svc.dsn, admin(svc).org_id, batches)
    if sum(r["rows_loaded"] for r in recs) != n:
        raise refuse(f"{sum(r['rows_loaded'] for r in recs)} rows loaded, not {n}")
    check_sink_table(svc, rows, ids)
    elapsed = max(r["finished_at"] for r in recs).timestamp() - t0
    return {
        "n": n,
        "batches": len(batches),
        "sink": n / elapsed,
        "published_s": published,
        "copy": (copy_before, copy_after),
        "cpu": used,
    }


# -- 2. alert latency -------------------------------------------------------------------------
def latency_dag(k: int) -> str:
    """K alerts a run; the run's own time in each key, so every run's alerts are new."""
    rule = (
        "SELECT current_timestamp() AS event_time,"
        " CASE WHEN id % 5 = 0 THEN 'critical' ELSE 'warning' END AS severity,"
        " concat(CAST(unix_micros(current_timestamp()) AS STRING), '-', CAST(id AS STRING))"
        " AS dedupe_key,"
        f" named_struct('n', id, 'amount', '{BIG}') AS payload"
        f" FROM range(1, {k + 1})"
    )
    return f"""
name: act_latency
jobs:
  rules:
    operator: alert_evaluate
    config: {{rules: [{{name: {LATENCY_RULE}, sql: "{rule}"}}]}}
  route_latency:
    operator: alert_route
    inputs: [{{from: {{dataset: alert_events}}}}]
    config: {{routes: [{{destination: act_latency, rules: [{LATENCY_RULE}]}}]}}
"""


def expected_alerts(svc: Services, tasks: list[uuid.UUID], k: int) -> dict[str, dict[str, Any]]:
    """idempotency key -> the alert and its alert_events record, for the rounds' runs (each
    exactly one batch of K alerts, landed)."""
    recs = records(svc, "task_id = ANY(%s)", (tasks,))
    if len(recs) != len(tasks) or any(
        r["status"] != "loaded" or r["rows_loaded"] != k for r in recs
    ):
        raise refuse(f"the rules' runs' batches: {[(r['status'], r['rows_loaded']) for r in recs]}")
    by_id = {r["record_id"]: r for r in recs}
    org = admin(svc).org_id
    with svc.pool.connection() as conn:
        rows = conn.execute(
            sql.SQL("SELECT * FROM {} WHERE record_id = ANY(%s)").format(
                table_of(svc, "alert_events")
            ),
            (list(by_id),),
        ).fetchall()
    return {
        idempotency_key(org, r, "act_latency"): {**r, "record": by_id[r["record_id"]]} for r in rows
    }


def latency_round(svc: Services, recv: TimedReceiver, k: int) -> uuid.UUID:
    """One run of the rules job, waited for until its K alerts arrived; refused at once, with
    its error, if the run failed (its status looked at once a second, not at every poll)."""
    want = len(recv.first) + k
    (task,) = svc.control.trigger(admin(svc), "act_latency")["tasks"]
    looked = time.monotonic()

    def received() -> bool:
        nonlocal looked
        if len(recv.first) >= want:
            return True
        if time.monotonic() - looked >= 1.0:
            looked = time.monotonic()
            view = svc.dispatcher.get_task(uuid.UUID(str(task)))
            if view.status in ("failed", "canceled"):
                raise refuse(f"the rules' run {task} {view.status}: {view.last_error}")
        return False

    until(received, 300, f"{k} alerts received")
    return task


def stages(svc: Services, alerts: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Median seconds of each leg: the sink landing the alerts, routing, the sink landing the
    deliveries, the Delivery Service sending."""
    with svc.pool.connection() as conn:
        rows = conn.execute(
            "SELECT d.idempotency_key, r.created_at, r.finished_at FROM deliveries d"
            " JOIN buffer_records r USING (record_id) WHERE d.idempotency_key = ANY(%s)",
            (list(alerts),),
        ).fetchall()
    legs: dict[str, list[float]] = {"sink": [], "route": [], "sink again": [], "send": []}
    for r in rows:
        a = alerts[r["idempotency_key"]]["record"]
        legs["sink"].append((a["finished_at"] - a["created_at"]).total_seconds())
        legs["route"].append((r["created_at"] - a["finished_at"]).total_seconds())
        legs["sink again"].append((r["finished_at"] - r["created_at"]).total_seconds())
        legs["send"].append(alerts[r["idempotency_key"]]["at"] - r["finished_at"].timestamp())
    return {leg: statistics.median(v) for leg, v in legs.items()}


def latency_row(
    svc: Services, settings: Settings, rounds: int, k: int, warmup: bool
) -> dict[str, Any]:
    stack = LiteStack(settings, workers=1, sinks=1, deliverers=1)
    with receiving(svc, "act_latency") as recv, stack:
        svc.control.deploy(admin(svc), latency_dag(k))
        cold = [latency_round(svc, recv, k)] if warmup else []  # Spark and hosts start
        timed = [latency_round(svc, recv, k) for _ in range(rounds)]
        time.sleep(1.0)  # anything extra still on its way is counted
        arrived = dict(recv.first)
        alerts = expected_alerts(svc, cold + timed, k)
        dup, unverified = recv.verified_n - len(arrived), recv.rejected
    missing, extra = set(alerts) - set(arrived), set(arrived) - set(alerts)
    if missing or extra or unverified or len(alerts) != k * (len(cold) + len(timed)):
        raise refuse(
            f"alerts: {len(alerts)} recorded, {len(missing)} not received, {len(extra)} extra,"
            f" {unverified} not verified"
        )
    for key, a in alerts.items():
        a["at"] = arrived[key]
        a["latency"] = arrived[key] - a["record"]["created_at"].timestamp()
    timed_set = {r["record_id"] for r in records(svc, "task_id = ANY(%s)", (timed,))}
    lat = [a["latency"] for a in alerts.values() if a["record_id"] in timed_set]
    cold_lat = [a["latency"] for a in alerts.values() if a["record_id"] not in timed_set]
    return {
        "n": len(lat),
        "rounds": rounds,
        "p50": statistics.median(lat),
        "p99": pct(lat, 99),
        "max": max(lat),
        "cold": max(cold_lat) if cold_lat else None,
        "dup": dup,
        "stages": stages(svc, {k: a for k, a in alerts.items() if a["record_id"] in timed_set}),
    }


# -- 3. deliveries/s --------------------------------------------------------------------------
def make_deliveries(svc: Services, m: int) -> dict[str, str]:
    """M pending deliveries by the real path (alerts landed by a sink, routed by alert_route
    in-process as its trusted host runs it, the routed batch landed): key -> body."""
    # Deployed after the latency row: its route job sees only this row's alerts.
    svc.control.deploy(admin(svc), alert_support.dag("act_bulk", ("act_bulk",)))
    rows = [alert_support.alert(f"bulk-{i}", "critical", timedelta(0)) for i in range(m)]
    alert_support.publish_alerts(svc, rows, "act_bulk")
    with tempfile.TemporaryDirectory() as tmp:
        for task in alert_support.route_tasks(svc):
            alert_support.route(svc, Path(tmp) / str(task), task)
    with svc.pool.connection() as conn:
        made = conn.execute(
            "SELECT idempotency_key, body, status FROM deliveries WHERE destination = 'act_bulk'"
        ).fetchall()
    if len(made) != m or any(d["status"] != "pending" for d in made):
        raise refuse(f"{len(made)} deliveries made for {m} alerts")
    return {d["idempotency_key"]: d["body"] for d in made}


def delivery_row(svc: Services, settings: Settings, postmaster: str, m: int) -> dict[str, Any]:
    with receiving(svc, "act_bulk") as recv:
        want = make_deliveries(svc, m)
        spawned = time.time()
        with LiteStack(settings, workers=0, sinks=0, deliverers=2) as stack:
            until(lambda: recv.first, 120, "a first delivery received")  # the processes are up
            cpu0, before = cpu(stack, postmaster), len(recv.first)
            until(lambda: len(recv.first) >= m, max(120, m / 20), f"{m} deliveries received")
            used = cpu_since(cpu0, cpu(stack, postmaster), max(1, m - before))
            time.sleep(1.0)  # a late duplicate is counted
            arrived, n_verified = dict(recv.first), recv.verified_n
            bodies = {a.webhook_id: a.body for a in recv.arrivals if a.verified}
    missing, extra = set(want) - set(arrived), set(arrived) - set(want)
    wrong = [k for k in want if bodies.get(k) != want[k]]
    if missing or extra or wrong or recv.rejected:
        raise refuse(
            f"deliveries: {len(missing)} missing, {len(extra)} extra, {len(wrong)} with another"
            f" body, {recv.rejected} not verified"
        )
    with svc.pool.connection() as conn:
        first, done, http = (
            conn.execute(
                "SELECT min(a.started_at) AS first, count(DISTINCT d.delivery_id) FILTER"
                " (WHERE d.status = 'delivered') AS done, percentile_cont(ARRAY[0.5, 0.99])"
                " WITHIN GROUP (ORDER BY a.latency_ms) AS http FROM deliveries d"
                " JOIN delivery_attempts a USING (delivery_id) WHERE d.destination = 'act_bulk'"
            )
            .fetchone()
            .values()
        )
    if done != m:
        raise refuse(f"{done} of {m} deliveries settled as delivered")
    last = max(arrived.values())
    return {
        "m": m,
        "rate": m / (last - first.timestamp()),
        "start_s": first.timestamp() - spawned,
        "dup": n_verified - len(arrived),
        "cpu": used,
        "http_ms": http,
    }


# -- the run ----------------------------------------------------------------------------------
def report(sink: dict[str, Any], lat: dict[str, Any], dlv: dict[str, Any], load: str) -> None:
    copy = statistics.mean(sink["copy"])
    ratio = sink["sink"] / copy
    print(f"machine: {os.cpu_count()} cores, shared; load before {load}; Postgres fsync on")
    print(
        f"\n1. sink, {sink['n']:,} rows in {sink['batches']} JSONL batches, 1 `trace sink`"
        f" process: {sink['sink']:,.0f} rows/s (publishing took {sink['published_s']:.2f} s of"
        f" it)\n   plain COPY of the same rows, same index: {copy:,.0f} rows/s (before"
        f" {sink['copy'][0]:,.0f}, after {sink['copy'][1]:,.0f})\n   ratio {ratio:.2f}x"
        f" (target >= 0.5x); CPU per row: {shown(sink['cpu'], 1e6, 'us')}"
    )
    legs = ", ".join(f"{k} {v:.2f} s" for k, v in lat["stages"].items())
    cold = f"; first run (hosts and Spark start) {lat['cold']:.2f} s" if lat["cold"] else ""
    print(
        f"\n2. alert latency, publish of the alerts -> verified receipt, {lat['n']} alerts in"
        f" {lat['rounds']} runs: p50 {lat['p50']:.2f} s, p99 {lat['p99']:.2f} s, max"
        f" {lat['max']:.2f} s (target p99 <= 2 s){cold}\n   legs (medians): {legs};"
        f" duplicates {lat['dup']}"
    )
    print(
        f"\n3. deliveries, {dlv['m']:,} to one receiver, 2 `trace delivery` processes:"
        f" {dlv['rate']:,.0f}/s from the first attempt to the last receipt (target >= 500/s);"
        f" process start to first attempt {dlv['start_s']:.2f} s; duplicates {dlv['dup']}"
        f"\n   attempts' HTTP latency p50 {dlv['http_ms'][0]:.0f} ms, p99 {dlv['http_ms'][1]:.0f}"
        f" ms; CPU per delivery: {shown(dlv['cpu'], 1e3, 'ms')}"
    )
    print(f"\nload after: {loadavg()}")


def main() -> None:
    os.environ["TRACE_OPERATOR_REGISTRY"] = "testing"  # the sink row's producer job
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--alerts", type=int, default=15, help="alerts a run raises")
    ap.add_argument("--deliveries", type=int, default=5_000)
    ap.add_argument("--no-warmup", dest="warmup", action="store_false")
    args = smoke.parse_args(
        ap, rows=300, batch=100, rounds=1, alerts=3, deliveries=30, warmup=False
    )
    load = loadavg()
    with migrated_postgres("trace-act-bench-") as (root, dsn):
        settings = Settings(state_dsn=dsn, home=root / "home", auth="permissive")
        # The bench's own services: it claims producer tasks and holds them without heartbeats
        # (a long lease), and checks each row's work after the row's stack has stopped.
        svc = Services.build(settings.model_copy(update={"lease_seconds": 3600.0}), dsn)
        postmaster = (root / "pg" / "data" / "postmaster.pid").read_text().split()[0]
        try:
            sink = sink_row(svc, settings, postmaster, args.rows, args.batch)
            lat = latency_row(svc, settings, args.rounds, args.alerts, args.warmup)
            dlv = delivery_row(svc, settings, postmaster, args.deliveries)
        finally:
            svc.close()
    report(sink, lat, dlv, load)


if __name__ == "__main__":
    smoke.main(main)
