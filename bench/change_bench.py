"""What safe change costs on this machine (issue 11's figures).

1. Planning: the invalidated subgraph of a 10,000-job DAG (which jobs changed, whether each
   change alters its data, and the transitive downstream), computed as a deploy does. Built in
   Python: a DAG file is capped at 20,000 YAML nodes, well below 10,000 jobs.
2. Cutover and rollback with 100 affected datasets (a source and 99 readers, each with history:
   ranges through every job), each call timed end to end (lock, checks, pointer swap, held work
   released or work canceled, a rollback's catch-up replays) and checked: after a cutover every
   pointer is the new version's, after a rollback every pointer is the old one's again.
3. With `--demo`: the demo's decode stage (transfers, its aggregator, token_supply,
   token_balances) over a synced devnet, run as a fresh backfill (a consumer DAG paused while
   the chain syncs, then resumed: its tasks run as ordinary work) and as a deploy-triggered
   rebuild of the same DAG (deploy to cutover), side by side, both on a warm operator host. Both runs must produce the same
   tasks per job and the same analytics, or nothing is printed.

Run: `.venv/bin/python bench/change_bench.py [--jobs 10000] [--rounds 20] [--demo]`.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.safe_change import finish, start

import smoke  # this folder's: run as a script
from embedded_pg import migrated_postgres  # this folder's: run as a script
from trace_platform.config import Settings
from trace_platform.dag.schema import DagSpec
from trace_platform.identity import Actor, lite_admin
from trace_platform.registry.deploy import plan_changes
from trace_platform.services import Services


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def fmt(values: list[float]) -> str:
    return f"p50 {pct(values, 50):8.2f} ms   p95 {pct(values, 95):8.2f} ms   (n={len(values)})"


# -- 1. planning ---------------------------------------------------------------------------
def big_dag(n: int, seed: int = 1) -> dict[str, Any]:
    """n jobs in layers: 10 sources, every other job reads one or two earlier ones."""
    rng = random.Random(seed)
    jobs: dict[str, Any] = {}
    for i in range(n):
        job: dict[str, Any] = {"operator": "noop", "config": {"i": i}, "outputs": [{}]}
        if i >= 10:
            ups = {rng.randrange(max(0, i - 200), i) for _ in range(rng.choice((1, 2)))}
            job["inputs"] = [{"job": f"j{u}", "output": 0} for u in sorted(ups)]
        jobs[f"j{i}"] = job
    return {"name": "big", "jobs": jobs}


def closure_by_scan(spec: DagSpec, changed: set[str]) -> set[str]:
    """The same downstream, computed differently (jobs in file order are topological here):
    the check that the timed figure did the whole work."""
    out = set(changed)
    for name, job in spec.jobs.items():
        if any(getattr(i, "job", None) in out for i in job.inputs):
            out.add(name)
    return out


def planning(n: int) -> None:
    raw = big_dag(n)
    live = DagSpec.model_validate(raw)
    previous = {k: v.model_dump(mode="json", by_alias=True) for k, v in live.jobs.items()}
    raw["jobs"]["j3"]["config"] = {"i": "changed"}
    raw["jobs"]["j50"]["timeout_seconds"] = 99  # execution-only: no rebuild of its own
    spec = DagSpec.model_validate(raw)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        changes, rebuild = plan_changes(spec, previous)
        times.append((time.perf_counter() - t0) * 1000)
    want = closure_by_scan(spec, {"j3"})
    affected = {c.job: c.affects_materialization for c in changes}
    if rebuild != want or affected != {"j3": True, "j50": False} or len(rebuild) < 2:
        raise SystemExit("planning bench: wrong invalidated subgraph; not printing")
    print(
        f"invalidated subgraph of a {n:,}-job DAG ({len(rebuild):,} jobs rebuilt):  {fmt(times)}"
        "   target <= 2000 ms"
    )


# -- 2. cutover and rollback ---------------------------------------------------------------
def fanout_dag(readers: int, mode: int) -> str:
    lines = [
        "name: wide",
        "jobs:",
        "  source:",
        "    operator: noop",
        f"    config: {{mode: {mode}}}",
        "    outputs: [{backend: parquet}]",
    ]
    for i in range(readers):
        lines += [
            f"  r{i}:",
            "    operator: noop",
            "    inputs: [{job: source, output: 0}]",
            "    outputs: [{backend: parquet}]",
        ]
    return "\n".join(lines) + "\n"


def drive(svc: Services) -> int:
    """Runs every claimable task of the `wide` DAG by hand (only its: the count is the row's own
    work), each writing its input's ranges to its outputs (tests/support/safe_change's start and
    finish, as the safe-change tests drive their pipeline)."""
    done = 0
    while True:
        with svc.pool.connection() as conn:
            ids = [
                r["task_id"]
                for r in conn.execute(
                    "SELECT s.task_id FROM task_status s "
                    "JOIN task_registry r USING (task_id, start_day) "
                    "JOIN dags g ON g.dag_id = r.dag_id "
                    "WHERE g.name = 'wide' AND s.status = 'queued' AND NOT s.cancel_requested"
                ).fetchall()
            ]
        if not ids:
            return done
        for task_id in ids:
            finish(svc, *start(svc, task_id))
            done += 1


def pointers(svc: Services) -> dict[Any, Any]:
    with svc.pool.connection() as conn:
        rows = conn.execute(
            "SELECT c.dataset_uuid, c.dataset_version FROM dataset_current c "
            "JOIN datasets d USING (dataset_uuid) JOIN dags g ON g.dag_id = d.producer_dag_id "
            "WHERE g.name = 'wide'"
        ).fetchall()
    return {r["dataset_uuid"]: r["dataset_version"] for r in rows}


def version_map(svc: Services, version: int) -> dict[Any, Any]:
    with svc.pool.connection() as conn:
        rows = conn.execute(
            "SELECT o.dataset_uuid, o.dataset_version FROM dag_version_outputs o "
            "JOIN dags g USING (dag_id) WHERE g.name = 'wide' AND o.dag_version = %s",
            (version,),
        ).fetchall()
    return {r["dataset_uuid"]: r["dataset_version"] for r in rows}


def cutover_rollback(svc: Services, me: Actor, readers: int, rounds: int, history: int) -> None:
    ch = svc.control.changes
    svc.control.deploy(me, fanout_dag(readers, 0))
    svc.control.trigger(
        me, "wide", config={"ranges": [[i * 100, i * 100 + 100] for i in range(history)]}
    )
    tasks = drive(svc)
    if tasks != 1 + history * readers:
        raise SystemExit(f"cutover bench: history ran {tasks} tasks, not {1 + history * readers}")
    cut_ms: list[float] = []
    back_ms: list[float] = []
    for i in range(1, rounds + 1):
        res = svc.control.deploy(me, fanout_dag(readers, i))
        drive(svc)  # the rebuild: `history` ranges replayed through every job
        t0 = time.perf_counter()
        done = ch.cutover(me, "wide")
        cut_ms.append((time.perf_counter() - t0) * 1000)
        if done["datasets_swapped"] != readers + 1 or pointers(svc) != version_map(
            svc, res.version
        ):
            raise SystemExit("cutover bench: pointers are not the new version's; not printing")
        t0 = time.perf_counter()
        back = ch.rollback(me, "wide")
        back_ms.append((time.perf_counter() - t0) * 1000)
        if back["datasets_swapped"] != readers + 1 or pointers(svc) != version_map(
            svc, back["version"]
        ):
            raise SystemExit("rollback bench: pointers are not the old version's; not printing")
        drive(svc)
        ch.rollback(me, "wide", to=res.version)  # forward again: the next round changes it
        drive(svc)
    print(
        f"cutover, {readers + 1} datasets, {history} ranges each:      {fmt(cut_ms)}   target <= 50 ms"
    )
    print(
        f"rollback, {readers + 1} datasets, {history} ranges each:     {fmt(back_ms)}   target <= 1000 ms"
    )


# -- 3. the demo's decode stage: rebuild vs fresh -------------------------------------------
DEMO = Path(__file__).resolve().parents[1] / "examples" / "dags" / "monad_demo.yaml"
STAGE = ("transfers", "transfers_complete", "token_supply", "token_balances")


def split_demo(url: str, token: str | None, blocks: int) -> tuple[str, str]:
    """The demo as two DAGs: `sync` (backfill, ingest, hot) and `decoder` (the decode stage,
    reading the published `logs`; its aggregators' window is the `blocks` synced, as the demo's
    is its backfill)."""
    demo = yaml.safe_load(DEMO.read_text().replace("http://127.0.0.1:8545", url))
    sync = {**demo, "name": "sync", "jobs": {}, "publish": []}
    dec: dict[str, Any] = {"name": "decoder", "jobs": {}, "publish": []}
    # The decode stage's declared pools (a job naming an undeclared pool runs on an implicit
    # one-slot pool of that name, as in the demo).
    stage_pools = {j.get("worker_pool") for n, j in demo["jobs"].items() if n in STAGE}
    declared = demo.get("worker_pools") or {}
    if pools := {k: v for k, v in declared.items() if k in stage_pools}:
        dec["worker_pools"] = pools
    for name, job in demo["jobs"].items():
        (dec if name in STAGE else sync)["jobs"][name] = job
    dec["jobs"]["transfers"]["inputs"] = [{"from": {"dataset": "logs"}}]
    # Started by hand before the fresh run, so both runs find the DAG's operator host and its
    # Spark JVM warm (a cold host costs seconds the rebuild would not pay).
    dec["jobs"]["warm"] = {"operator": "spark_ping"}
    if token is not None:
        dec["jobs"]["transfers"]["config"] = {"token_address": token}
    for job in dec["jobs"].values():
        if job.get("operator") == "range_aggregator":
            job["config"] = {**job.get("config", {}), "size": blocks, "origin": 0}
    for p in demo["publish"]:
        (dec if p["job"] in STAGE else sync)["publish"].append(p)
    # The staking side is not part of the stage measured: out of sync, with every job that
    # reads it (whatever the demo has grown since), and so is anything reading the stage.
    for name in ("staking", "staking_complete"):
        sync["jobs"].pop(name, None)
    # Nor are the alerts (their rules read the stage's outputs; routing reads their alerts).
    for name in [
        n for n, j in sync["jobs"].items() if j["operator"] in ("alert_evaluate", "alert_route")
    ]:
        sync["jobs"].pop(name)
    while gone := [
        name
        for name, job in sync["jobs"].items()
        if any(i.get("job") not in sync["jobs"] for i in job.get("inputs", []) if "job" in i)
    ]:
        for name in gone:
            sync["jobs"].pop(name)
    sync["publish"] = [p for p in sync["publish"] if p["job"] in sync["jobs"]]
    return yaml.safe_dump(sync), yaml.safe_dump(dec)


def stage_tasks(svc: Services, version: int) -> dict[str, int]:
    with svc.pool.connection() as conn:
        rows = conn.execute(
            "SELECT r.job, count(*) AS n FROM task_registry r JOIN task_status s "
            "USING (task_id, start_day) JOIN dags d ON d.dag_id = r.dag_id "
            "WHERE d.name = 'decoder' AND r.dag_version = %s AND s.status = 'succeeded' "
            "AND r.job = ANY(%s) GROUP BY r.job",
            (version, list(STAGE)),
        ).fetchall()
    return {r["job"]: r["n"] for r in rows}


def task_seconds(svc: Services, version: int) -> tuple[float, float]:
    """The decode stage's attempts of a version: total running time, and the longest one."""
    with svc.pool.connection() as conn:
        row = conn.execute(
            "SELECT coalesce(sum(extract(epoch FROM a.finished_at - a.started_at)), 0) AS total, "
            "coalesce(max(extract(epoch FROM a.finished_at - a.started_at)), 0) AS longest "
            "FROM task_attempts a JOIN task_registry r USING (task_id, start_day) "
            "JOIN dags d ON d.dag_id = r.dag_id WHERE d.name = 'decoder' "
            "AND r.dag_version = %s AND r.job = ANY(%s)",
            (version, list(STAGE)),
        ).fetchone()
    assert row is not None
    return float(row["total"]), float(row["longest"])


def busy(svc: Services, dag: str) -> bool:
    """Whether the DAG has work left (queued, running or held)."""
    with svc.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM task_status s JOIN task_registry r USING (task_id, start_day) "
            "JOIN dags d ON d.dag_id = r.dag_id WHERE d.name = %s "
            "AND s.status IN ('queued', 'running', 'buffered')",
            (dag,),
        ).fetchone()
    return bool(row and row["n"])


def stage_busy(svc: Services) -> bool:
    return busy(svc, "decoder")


def rebuild_vs_fresh(settings: Settings, dsn: str, root: Path, blocks: int) -> None:
    from trace_platform.devnet import ChainSpec, Devnet
    from trace_platform.lite.stack import LiteStack, egress_allow

    devnet = Devnet(root / "devnet")
    info, chain = devnet.up(ChainSpec(blocks=blocks, accounts=200, validators=5))
    # The stack's workers may reach this devnet (another home's: not their own `devnet`).
    os.environ["TRACE_EGRESS_ALLOW"] = egress_allow(
        os.environ.get("TRACE_EGRESS_ALLOW", ""), f"127.0.0.1:{info.port}"
    )
    try:
        with LiteStack(settings, workers=2, dsn=dsn) as stack:
            svc = stack.services
            with svc.pool.connection() as conn:
                me = lite_admin(conn)
            sync, dec = split_demo(info.url, None, blocks)
            svc.control.deploy(me, sync)
            svc.control.deploy(me, dec)
            warm = svc.control.trigger(me, "decoder")["run_id"]
            _wait(lambda: _run_done(svc, me, warm, "decoder"), 600)
            svc.control.changes.set_paused(me, "decoder", True)
            run = svc.control.trigger(
                me, "sync", config={"from_block": 0, "to_block": blocks - 1, "chunk_size": 500}
            )["run_id"]
            # (The run's tree follows parent links into the paused decoder's tasks: wait on the
            # sync DAG's own work instead.)
            _wait(lambda: _run_done(svc, me, run, "sync") and not busy(svc, "sync"), 1800)
            # Fresh: the decode stage as ordinary work over the synced range.
            t0 = time.perf_counter()
            svc.control.changes.set_paused(me, "decoder", False)
            _wait(lambda: not stage_busy(svc), 1800)
            fresh = time.perf_counter() - t0
            fresh_answer = svc.query.query(me, PROBE.format(chain.token)).as_json()["rows"]
            # Rebuild: the same stage, re-made by a deploy (same output: the one token).
            _, dec2 = split_demo(info.url, chain.token, blocks)
            t0 = time.perf_counter()
            res = svc.control.deploy(me, dec2)
            _wait(
                lambda: (
                    svc.control.show_dag(me, "decoder")["active_version"] == res.version
                    and not stage_busy(svc)
                ),
                1800,
            )
            rebuild = time.perf_counter() - t0
            rebuilt_answer = svc.query.query(me, PROBE.format(chain.token)).as_json()["rows"]
            fresh_work, rebuild_work = task_seconds(svc, 1), task_seconds(svc, res.version)
            fresh_tasks, rebuild_tasks = stage_tasks(svc, 1), stage_tasks(svc, res.version)
            if fresh_tasks != rebuild_tasks or set(fresh_tasks) != set(STAGE):
                raise SystemExit(f"demo bench: tasks differ {fresh_tasks} vs {rebuild_tasks}")
            if fresh_answer != rebuilt_answer or not fresh_answer[0][0]:
                raise SystemExit(f"demo bench: answers differ {fresh_answer} vs {rebuilt_answer}")
    finally:
        devnet.down()
    n = sum(fresh_tasks.values())
    print(f"decode stage over {blocks:,} blocks ({n} tasks), fresh backfill:   {fresh:8.2f} s")
    print(
        f"decode stage, deploy-triggered rebuild to cutover:     {rebuild:8.2f} s   "
        f"ratio {rebuild / fresh:.2f}x   target <= 1.1x"
    )
    # Where the time went: the same tasks ran both times; their attempts' running time (summed,
    # and the longest) tells work from waiting (a first Spark job on a host pays its warm-up).
    print(
        f"  task running time, fresh: {fresh_work[0]:7.2f} s (longest {fresh_work[1]:6.2f} s); "
        f"rebuild: {rebuild_work[0]:7.2f} s (longest {rebuild_work[1]:6.2f} s)"
    )


# The demo token's supply (the devnet has other tokens, e.g. the large-amount one, which the
# rebuild's decode, narrowed to this token, leaves out).
PROBE = "SELECT count(*), max(total_supply) FROM token_supply WHERE token_address = lower('{}')"


def _run_done(svc: Services, me: Actor, run: Any, dag: str) -> bool:
    dag_id = svc.control.show_dag(me, dag)["dag_id"]
    tasks = [t for t in svc.control.show_run(me, run)["tasks"] if t["dag_id"] == dag_id]
    if any(t["status"] == "failed" for t in tasks):
        raise SystemExit("demo bench: the sync run failed")
    return bool(tasks) and all(t["status"] in ("succeeded", "canceled") for t in tasks)


def _wait(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit("demo bench: timed out")
        time.sleep(0.2)


def main() -> None:
    os.environ["TRACE_OPERATOR_REGISTRY"] = "testing"  # the no-op test operators
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--readers", type=int, default=99)
    ap.add_argument("--history", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--demo", action="store_true", help="also the decode-stage rebuild vs fresh")
    ap.add_argument("--demo-only", action="store_true", help="only the decode-stage figures")
    ap.add_argument("--blocks", type=int, default=2000)
    args = smoke.parse_args(ap, jobs=200, readers=5, history=2, rounds=1, blocks=200)

    print(f"machine: {os.cpu_count()} cores")
    if not args.demo_only:
        planning(args.jobs)
    with migrated_postgres("trace-change-bench-") as (root, dsn):  # fsync on at full size
        settings = Settings(state_dsn=dsn, home=root / "home", auth="permissive")
        svc = Services.build(settings, dsn)
        try:
            with svc.pool.connection() as conn:
                me = lite_admin(conn)
            if not args.demo_only:
                cutover_rollback(svc, me, args.readers, args.rounds, args.history)
        finally:
            svc.close()
        if args.demo or args.demo_only:
            rebuild_vs_fresh(settings, dsn, root, args.blocks)


if __name__ == "__main__":
    smoke.main(main)
