"""The golden path's wall time under both profiles in one run (issue 41): the demo DAG end to end
on a devnet, under the lite profile (pgqueue, objects in a local directory) and under the aws
profile (SQS and S3 on moto's server, bench/moto_server.py), the same Dispatcher code over one
Postgres server (fsync on), a fresh database and home for each run.

The runs interleave (lite, aws, lite, aws for --repeats 2), so the machine's drift falls on
both profiles; each prints its wall time, from the deploy (and the trigger right after it) to
its run's last task ending (the task rows' finished_at), the load average before and after it,
and each pair's aws/lite ratio; the median ratio closes. Each run is a Lite stack of its own (2
`trace worker` processes, a sink, a Delivery Service, the API in this process) whose workers
have registered before the clock starts (a worker's boot is a service's start, not the run's);
both profiles run with the same settings but their adapters, the DAG as `trace demo` deploys
it for its devnet (dag_text of devnet_plan, Spark on the quick compiler profile as the demo
sets it).

Refuses to print unless every run did its work: every task of the run succeeded, with one
ingest per range; every dataset's row count equal in every run of both profiles (a hot
window's as read), `blocks` holding the node's every block exactly once and `blocks_hot` its
newest (the window); the lite run's objects under its home's object directory; the aws run's
objects in its own S3 bucket (every dataset's committed files among them, none under the
home) and its wake-ups through its own SQS queues (pgqueue's table empty).

moto is a local emulator (Python, in memory, on the same 2 cores), not AWS: the aws runs' time
says what the adapters cost against it, not what the profile costs against AWS's services.

    .venv/bin/python bench/profile_bench.py [--blocks 2000] [--repeats 3] [--chunk 500]

At smoke size (--smoke) it runs a 200-block chain once under each profile; two stacks and a
dozen Spark jobs take minutes even then, so `make test` does not run it
(tests/integration/test_benches_smoke.py) and `make bench` runs it at full size.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import psycopg
from cryptography.fernet import Fernet

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.dags import admin, finished_run
from tests.support.datasets import committed_keys

import smoke  # this folder's: run as a script
from machine import loadavg  # this folder's: run as a script
from moto_server import ACCESS, moto_server  # this folder's: run as a script
from trace_platform.chain import Rpc
from trace_platform.config import Profile, Settings
from trace_platform.db.embedded import EmbeddedPostgres
from trace_platform.db.migrate import migrate
from trace_platform.devnet import ChainSpec, Devnet
from trace_platform.lite.demo.dag import DAG_NAME, dag_text
from trace_platform.lite.demo.plan import DemoPlan, devnet_plan
from trace_platform.lite.stack import LiteStack, egress_allow

WORKERS = 2
RUN_TIMEOUT_S = 1800.0


def refuse(why: str) -> SystemExit:
    return SystemExit(f"refusing to print: {why}")


@dataclasses.dataclass
class Run:
    profile: Profile
    seconds: float
    tasks: int
    rows: dict[str, int | None]  # dataset -> row count (a hot window's: as read)
    load: str  # before; after


def aws_settings(lite: Settings, endpoint: str) -> Settings:
    """`lite` under the aws profile: SQS and S3 on moto (a bucket and queue prefix of this
    run's own), as tests/chaos/test_monad_demo.py's profile_settings makes them; the internal
    token and the secrets key given (Lite keeps its own under its home)."""
    run = uuid.uuid4().hex[:10]
    bucket = f"trace-profile-{run}"
    boto3.client("s3", endpoint_url=endpoint, **ACCESS).create_bucket(Bucket=bucket)
    return Settings(
        **{
            **lite.model_dump(exclude={"queue_driver", "object_store", "sqs_create_queues"}),
            "profile": Profile.aws,
            "internal_token": uuid.uuid4().hex + uuid.uuid4().hex,
            "secrets_key": Fernet.generate_key().decode(),
            "s3_bucket": bucket,
            "s3_endpoint_url": endpoint,
            "s3_access_key_id": ACCESS["aws_access_key_id"],
            "s3_secret_access_key": ACCESS["aws_secret_access_key"],
            "sqs_endpoint_url": endpoint,
            "sqs_queue_prefix": f"p{run}-",
            "sqs_access_key_id": ACCESS["aws_access_key_id"],
            "sqs_secret_access_key": ACCESS["aws_secret_access_key"],
        }
    )


def query(svc: Any, me: Any, sql: str) -> list[list[Any]]:
    rows: list[list[Any]] = svc.query.query(me, sql).as_json()["rows"]
    return rows


def wait_for_workers(dsn: str, n: int, timeout: float = 120.0) -> None:
    """Until the stack's `n` workers have registered (both profiles: the worker registry)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM workers WHERE state = 'alive'").fetchone()
            if row is not None and row[0] >= n:
                return
            if time.monotonic() > deadline:
                raise refuse(f"{n} worker(s) not registered after {timeout:.0f} s")
            time.sleep(0.05)


def check_adapters(settings: Settings, dsn: str, svc: Any, rows: dict[str, int | None]) -> None:
    """The run's data went where its profile puts it, and (aws) its wake-ups through SQS."""
    objects = settings.home / "objects"
    if settings.profile is Profile.lite:
        if svc.driver.__class__.__name__ != "PgQueue" or not any(objects.rglob("*.parquet")):
            raise refuse(f"the lite run's driver is {svc.driver!r}, or {objects} holds no data")
        return
    if svc.driver.__class__.__name__ != "SqsQueue":
        raise refuse(f"the aws run's driver is {svc.driver!r}")
    if objects.exists():
        raise refuse(f"the aws run wrote to a local directory: {objects}")
    s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint_url, **ACCESS)
    keys: set[str] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=settings.s3_bucket):
        keys |= {o["Key"] for o in page.get("Contents", [])}
    parquet = [name for name in rows if committed_keys(svc, name)]
    missing = {name: set(committed_keys(svc, name)) - keys for name in parquet}
    if not keys or not parquet or any(missing.values()):
        raise refuse(
            f"the aws run's bucket {settings.s3_bucket} holds {len(keys)} objects; datasets "
            f"with files: {parquet}; committed files not in it: {missing}"
        )
    sqs = boto3.client("sqs", endpoint_url=settings.sqs_endpoint_url, **ACCESS)
    urls = sqs.list_queues(QueueNamePrefix=settings.sqs_queue_prefix).get("QueueUrls", [])
    names = {u.rsplit("/", 1)[-1].removeprefix(settings.sqs_queue_prefix) for u in urls}
    with psycopg.connect(dsn, autocommit=True) as conn:
        pgqueue = conn.execute("SELECT count(*) FROM queue_messages").fetchone()
    if not {"tasks", "delivery"} <= names or pgqueue != (0,):
        raise refuse(f"the aws run's SQS queues {sorted(names)}, pgqueue rows {pgqueue}")


def one_run(
    profile: Profile,
    pg: EmbeddedPostgres,
    tag: str,
    work: Path,
    endpoint: str,
    dag: str,
    config: dict[str, int],
    plan: DemoPlan,
) -> Run:
    db = f"profile_{tag}"
    with psycopg.connect(pg.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {db}")
    dsn = pg.dsn(db)
    migrate(dsn)
    # Lite's defaults (auth required, the production operators), as `trace demo` runs.
    settings = Settings(state_dsn=dsn, home=work / f"home-{tag}")
    if profile is Profile.aws:
        settings = aws_settings(settings, endpoint)
    # The demo's setting for a devnet's few thousand rows (lite/demo/run.py), unless set.
    env = {"TRACE_SPARK_JIT": os.environ.get("TRACE_SPARK_JIT", "quick")}
    with LiteStack(settings, workers=WORKERS, dsn=dsn, worker_env=env) as stack:
        wait_for_workers(dsn, WORKERS)
        svc, me = stack.services, admin(stack.services)
        before = loadavg()
        t0 = time.time()
        svc.control.deploy(me, dag, "profile_bench")
        run_id = svc.control.trigger(me, DAG_NAME, config=config)["run_id"]
        try:
            tasks = finished_run(svc, run_id, RUN_TIMEOUT_S)
        except AssertionError as e:
            raise refuse(f"{profile.value} run {tag}: {e}") from None
        seconds = max(t["finished_at"] for t in tasks).timestamp() - t0
        after = loadavg()
        failed = [
            (t["job"], t["status"], t["last_error"]) for t in tasks if t["status"] != "succeeded"
        ]
        ingests = sum(t["job"] == "ingest" for t in tasks)
        if failed or ingests != plan.ranges:
            raise refuse(f"{profile.value} run {tag}: {ingests}/{plan.ranges} ingests; {failed}")
        rows = {
            d["dataset_name"]: None if d["row_count"] is None else int(d["row_count"])
            for d in svc.control.list_datasets(me)
        }
        # A hot window's registry count is what was inserted (its trims, as the ranges land in
        # whatever order, are not counted there): its rows as read, and the window checked.
        for name in [n for n in rows if n.endswith("_hot")]:
            rows[name] = query(svc, me, f"SELECT count(*) FROM {name}")[0][0]
        want = config["to_block"] - config["from_block"] + 1
        blocks = query(svc, me, "SELECT count(*), count(DISTINCT block_number) FROM blocks")
        kept = min(plan.hot_blocks, want)
        window = query(svc, me, "SELECT count(*), min(block_number) FROM blocks_hot")
        if (
            blocks != [[want, want]]
            or rows.get("blocks") != want
            or window != [[kept, config["to_block"] - kept + 1]]
        ):
            raise refuse(
                f"{profile.value} run {tag}: blocks reads {blocks}, its dataset counts "
                f"{rows.get('blocks')}, the hot window (count, first) {window}; the node has "
                f"{want} blocks, the window {plan.hot_blocks}"
            )
        check_adapters(settings, dsn, svc, rows)
    return Run(profile, seconds, len(tasks), rows, f"{before}; {after}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=2000, help="the devnet's blocks (all synced)")
    ap.add_argument("--chunk", type=int, default=500, help="blocks per range (one ingest each)")
    ap.add_argument(
        "--repeats", type=int, default=3, help="(lite, aws) pairs, interleaved, one after another"
    )
    args = smoke.parse_args(ap, blocks=200, chunk=100, repeats=1)
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    work = Path(tempfile.mkdtemp(prefix="trace-profile-bench-", dir="/tmp"))
    work.chmod(0o755)  # the cluster runs as the postgres user when this runs as root
    devnet = Devnet(work / "devnet")
    pg = EmbeddedPostgres(work / "pg", durable=smoke.durable())
    spec = ChainSpec(blocks=args.blocks)
    runs: list[Run] = []
    try:
        t0 = time.perf_counter()
        node, info = devnet.up(spec)
        made = time.perf_counter() - t0
        # The stacks' workers may reach this devnet (another home's: not their own `devnet`).
        os.environ["TRACE_EGRESS_ALLOW"] = egress_allow(
            os.environ.get("TRACE_EGRESS_ALLOW", ""), f"127.0.0.1:{node.port}"
        )
        plan = dataclasses.replace(
            devnet_plan(0, info.head, args.chunk, None, spec), rpc_url=node.url
        )
        dag = dag_text(plan)
        config = {"from_block": 0, "to_block": info.head, "chunk_size": args.chunk}
        pg.start()
        with moto_server() as endpoint:
            for r in range(args.repeats):
                for profile in (Profile.lite, Profile.aws):
                    tag = f"{profile.value}{r}"
                    runs.append(one_run(profile, pg, tag, work, endpoint, dag, config, plan))
        rpc = Rpc(node.url)
        try:
            node_head = int(rpc.call("eth_blockNumber"), 16)
        finally:
            rpc.close()
        if node_head != info.head:
            raise refuse(f"the devnet moved during the runs: head {info.head} -> {node_head}")
    finally:
        devnet.down()
        pg.destroy()
        shutil.rmtree(work, ignore_errors=True)
    first = runs[0].rows
    unequal = [(r.profile.value, i // 2, r.rows) for i, r in enumerate(runs) if r.rows != first]
    if unequal or not first:
        raise refuse(f"datasets' row counts differ between runs: {first} against {unequal}")
    print(
        f"golden path: the demo DAG over a devnet of {info.head + 1} blocks ({plan.ranges} "
        f"ranges of {args.chunk}; generated in {made:.0f} s, not measured), {WORKERS} workers, "
        f"one Postgres (fsync {'on' if smoke.durable() else 'off'}), a fresh database and home "
        f"per run; interleaved lite, aws x {args.repeats}"
    )
    print(
        "aws: SQS and S3 on moto, a local emulator (Python, in memory, its own process on the "
        "same 2 cores), not AWS: not comparable with AWS's latency or throughput"
    )
    for i, r in enumerate(runs):
        print(
            f"  run {i + 1} {r.profile.value:4}: {r.seconds:6.1f} s ({r.tasks} tasks succeeded; "
            f"load {r.load})"
        )
    ratios = [aws.seconds / lite.seconds for lite, aws in zip(runs[::2], runs[1::2], strict=True)]
    print(
        f"aws / lite: median {statistics.median(ratios):.2f}x (each pair: "
        + ", ".join(f"{x:.2f}x" for x in ratios)
        + ")"
    )
    print(
        f"checked in every run: every task succeeded; {len(first)} datasets' row counts equal "
        f"across runs and profiles (blocks {first['blocks']} = the node's); lite's objects "
        "in its directory, aws's in its bucket and its wake-ups through SQS"
    )
    print("  rows: " + ", ".join(f"{k} {v}" for k, v in sorted(first.items())))


if __name__ == "__main__":
    smoke.main(main)
