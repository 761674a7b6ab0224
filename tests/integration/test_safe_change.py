"""Safe change on a real Postgres: a deploy that changes what jobs produce builds beside the live
version, buffers new work for the rebuilt jobs, cuts over (or rolls back) every pointer and the
active version in one transaction. Tasks are driven by hand through the Dispatcher, each one
writing its input's range to its outputs, so every assertion is exact."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import trace
from tests.support.dags import admin, user
from tests.support.safe_change import (
    claimable,
    commits,
    current,
    deployed_live,
    finish,
    fire,
    pipeline,
    q,
    run_all,
    start,
    statuses,
)
from tests.support.wait import wait_for
from trace_platform.contract import ClaimRequest, CompleteRequest
from trace_platform.errors import Conflict, NotFound
from trace_platform.services import Services


@pytest.fixture
def live(services: Services) -> Services:
    """Version 1 deployed, and two ranges through the whole pipeline."""
    return deployed_live(services)


def test_a_changed_job_rebuilds_beside_the_live_version_and_cuts_over(live: Services) -> None:
    services, me = live, admin(live)
    before = current(services)
    res = services.control.deploy(me, pipeline("b"))
    assert (res.version, res.live, res.active_version) == (2, False, 1)
    assert res.rebuilt_jobs == ["agg", "decode"]
    changes = {c.job: (c.change, c.affects_materialization, c.fields) for c in res.changes}
    assert changes == {"decode": ("modified", True, ["config"])}
    assert res.replays["decode"].tasks == 2 and res.replays["agg"].tasks == 0
    assert res.replays["decode"].scopes == ["range:0-99", "range:100-199"]
    assert current(services) == before  # readers see version 1 until the cutover
    assert services.control.show_dag(me, "chg")["active_version"] == 1

    # A source range arriving mid-rebuild: version 1 processes it (readers stay fresh) and the
    # rebuilt job of version 2 gets it held, not dispatched.
    fire(services, (200, 299))
    ran = run_all(services)
    assert ("decode", 1, "200-299") in ran and ("side", 1, "200-299") in ran
    assert sorted(r for r in ran if r[1] == 2) == [
        ("agg", 2, "0-99"),
        ("agg", 2, "100-199"),
        ("decode", 2, "0-99"),
        ("decode", 2, "100-199"),
    ]
    assert statuses(services, "decode", 2) == ["buffered", "succeeded", "succeeded"]
    held = q(
        services,
        "SELECT r.task_id FROM task_registry r JOIN task_status s USING (task_id, start_day) "
        "WHERE s.status = 'buffered'",
    )
    with pytest.raises(Conflict, match="held until its DAG version's cutover"):
        services.dispatcher.claim(ClaimRequest(task_id=held[0]["task_id"], worker_id="w"))
    assert commits(services, "chg_agg")[-1] == ("range:200-299", 1)

    status = services.control.changes.status(me, "chg")
    assert status["rebuild"]["blocked_by"] is None
    assert {d["job"]: d["state"] for d in status["rebuild"]["datasets"]} == {
        "agg": "building",
        "decode": "building",
        "side": "complete",
        "source": "complete",
    }

    (done,) = services.control.changes.auto_cutover()
    assert (done["version"], done["previous"], done["datasets_swapped"], done["released"]) == (
        2,
        1,
        2,
        1,
    )
    after = current(services)
    assert after["chg_side"] == before["chg_side"]  # unaffected: same version, kept running
    assert after["chg_decoded"] != before["chg_decoded"] and after["chg_agg"] != before["chg_agg"]
    assert commits(services, "chg_agg") == [("range:0-99", 2), ("range:100-199", 2)]
    # The held range drains on version 2, once.
    assert run_all(services) == [("decode", 2, "200-299"), ("agg", 2, "200-299")]
    assert commits(services, "chg_agg") == [
        ("range:0-99", 2),
        ("range:100-199", 2),
        ("range:200-299", 2),
    ]
    # New data after the cutover runs on version 2 only.
    fire(services, (300, 399))
    assert {r[1] for r in run_all(services)} == {2}
    versions = {
        v["version"]: v["state"] for v in services.control.changes.status(me, "chg")["versions"]
    }
    assert versions == {1: "retired", 2: "active"}


def test_an_execution_only_change_is_live_at_once(live: Services) -> None:
    services = live
    before = current(services)
    res = services.control.deploy(admin(services), pipeline("a", timeout=77))
    assert res.live and res.rebuilt_jobs == [] and res.replays == {}
    assert [(c.job, c.affects_materialization, c.fields) for c in res.changes] == [
        ("agg", False, ["timeout_seconds"])
    ]
    assert current(services) == before
    assert services.control.show_dag(admin(services), "chg")["active_version"] == 2


def test_diff_changes_nothing(live: Services) -> None:
    services = live
    tables = [
        "dag_versions",
        "dataset_versions",
        "task_registry",
        "trigger_fires",
        "dag_version_outputs",
    ]
    counts = {t: q(services, f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in tables}
    res = services.control.deploy(admin(services), pipeline("b"), dry_run=True)
    assert res.rebuilt_jobs == ["agg", "decode"] and res.replays["decode"].tasks == 2
    assert {t: q(services, f"SELECT count(*) AS n FROM {t}")[0]["n"] for t in tables} == counts
    assert services.control.changes.status(admin(services), "chg")["building_version"] is None


def test_manual_cutover_waits_and_refuses_an_incomplete_rebuild(live: Services) -> None:
    services, me = live, admin(live)
    res = services.control.deploy(me, pipeline("b"), manual_cutover=True)
    assert res.manual_cutover and not res.live
    with pytest.raises(Conflict, match="2 rebuild tasks still queued or running"):
        services.control.changes.cutover(me, "chg")
    run_all(services)
    assert services.control.changes.auto_cutover() == []  # manual: never by itself
    assert services.control.changes.cutover(me, "chg")["version"] == 2
    with pytest.raises(Conflict, match="no rebuild in flight"):
        services.control.changes.cutover(me, "chg")


def test_a_failed_rebuild_blocks_cutover_and_a_new_deploy_supersedes_it(live: Services) -> None:
    services, me = live, admin(live)
    services.control.deploy(me, pipeline("b"))
    (task_id, _) = claimable(services)
    ref, _payload = start(services, task_id)
    services.dispatcher.complete(
        CompleteRequest(**ref.model_dump(), outcome="failed", error="boom", retryable=False)
    )
    run_all(services)
    assert services.control.changes.auto_cutover() == []
    blocked = services.control.changes.status(me, "chg")["rebuild"]["blocked_by"]
    assert "rebuild tasks failed: decode (1)" in blocked
    res = services.control.deploy(me, pipeline("c"))
    assert (res.version, res.abandoned, res.live) == (3, 2, False)
    states = {
        v["version"]: v["state"] for v in services.control.changes.status(me, "chg")["versions"]
    }
    assert states == {1: "active", 2: "abandoned", 3: "building"}
    assert set(statuses(services, "decode", 2)) <= {"failed", "succeeded", "canceled"}
    run_all(services)
    assert services.control.changes.auto_cutover()[0]["version"] == 3
    assert commits(services, "chg_agg") == [("range:0-99", 3), ("range:100-199", 3)]


def test_rollback_restores_answers_and_the_rolled_back_version_lands_nothing(
    live: Services,
) -> None:
    services, me = live, admin(live)
    v1 = current(services)
    services.control.deploy(me, pipeline("b"))
    run_all(services)
    services.control.changes.auto_cutover()
    v2 = current(services)
    # After the cutover: one range fully processed by version 2 only, one mid-flight.
    fire(services, (300, 399))
    run_all(services)
    fire(services, (400, 499))
    (source_task,) = claimable(services)
    ref, payload = start(services, source_task)
    finish(services, ref, payload)
    decode_v2 = [t for t in claimable(services)]
    running_ref, running_payload = start(services, decode_v2[0])
    assert (running_payload.job, running_payload.dag_version) in {("decode", 2), ("side", 2)}

    res = services.control.changes.rollback(me, "chg")
    assert (res["version"], res["rolled_back"]) == (1, 2)
    assert current(services) == {**v1, "chg_side": v2["chg_side"]}
    assert v1["chg_side"] == v2["chg_side"]
    # Version 1 catches up on exactly what it missed while version 2 was live.
    assert res["replays"] == {"decode": 2}
    # The running attempt of version 2 reports success: nothing of it lands.
    assert finish(services, running_ref, running_payload) == "canceled"
    assert not q(services, "SELECT 1 FROM dataset_commits WHERE task_id = %s", running_ref.task_id)
    ran = run_all(services)
    # The rebuilt jobs run on version 1 only; `side` is the same job in both versions: its
    # version-2 work goes on and lands in the dataset version both share.
    assert ran and {r[1] for r in ran if r[0] != "side"} == {1}
    assert ("side", 2, "400-499") in ran
    landed_after = q(
        services,
        "SELECT count(*) AS n FROM dataset_commits WHERE dag_version = 2 AND created_at > "
        "(SELECT max(activated_at) FROM dag_versions WHERE version = 1) AND dataset_version "
        "NOT IN (SELECT dataset_version FROM dag_version_outputs WHERE dag_version = 1)",
    )
    assert landed_after[0]["n"] == 0
    assert commits(services, "chg_agg") == [
        ("range:0-99", 1),
        ("range:100-199", 1),
        ("range:300-399", 1),
        ("range:400-499", 1),
    ]
    states = {
        v["version"]: v["state"] for v in services.control.changes.status(me, "chg")["versions"]
    }
    assert states == {1: "active", 2: "rolled_back"}
    # Forward again to version 2: its datasets are kept (never purged automatically).
    fwd = services.control.changes.rollback(me, "chg", to=2)
    assert fwd["version"] == 2 and current(services)["chg_agg"] == v2["chg_agg"]


def test_rollback_during_a_rebuild_abandons_it(live: Services) -> None:
    services, me = live, admin(live)
    before = current(services)
    services.control.deploy(me, pipeline("b"))
    res = services.control.changes.rollback(me, "chg")
    assert (res["rolled_back"], res["abandoned"]) == (None, 2)
    assert current(services) == before
    assert set(statuses(services, "decode", 2)) == {"canceled"}
    with pytest.raises(Conflict, match="already active"):
        services.control.changes.rollback(me, "chg", to=1)
    with pytest.raises(Conflict, match="never completed"):
        services.control.changes.rollback(me, "chg", to=2)


def test_pause_holds_work_without_losing_it(live: Services) -> None:
    services, me = live, admin(live)
    services.control.changes.set_paused(me, "chg", True)
    fire(services, (500, 599))  # accepted while paused: recorded, not started
    (task_id,) = claimable(services)
    with pytest.raises(Conflict, match="is paused"):
        services.dispatcher.claim(ClaimRequest(task_id=task_id, worker_id="w"))
    res = services.control.changes.set_paused(me, "chg", False)
    assert res["woken"] == 1
    assert ("agg", 1, "500-599") in run_all(services)


def test_only_deployers_change_a_dag(live: Services) -> None:
    services = live
    stranger, _ = user(services, "stranger")
    for op in (
        lambda: services.control.changes.cutover(stranger, "chg"),
        lambda: services.control.changes.rollback(stranger, "chg"),
        lambda: services.control.changes.set_paused(stranger, "chg", True),
        lambda: services.control.changes.status(stranger, "chg"),
    ):
        with pytest.raises(NotFound, match="no DAG named 'chg'"):
            op()


def test_events_racing_a_deploy_reach_the_rebuild_exactly_once(live: Services) -> None:
    """Source ranges land while the deploy runs: each reaches version 2's decode once, either
    replayed (it landed before) or held (after), never both, never neither."""
    services, me = live, admin(live)
    stop = threading.Event()
    fired: list[tuple[int, int]] = []

    def feed() -> None:
        n = 10
        while not stop.is_set() and n < 60:
            rng = (n * 100, n * 100 + 99)
            fire(services, rng)
            (task_id,) = [t for t in claimable(services) if _job(services, t) == "source"][:1] or [
                None
            ]
            if task_id is not None:
                try:
                    ref, payload = start(services, task_id)
                    finish(services, ref, payload)
                    fired.append(rng)
                except Conflict:
                    pass
            n += 1

    t = threading.Thread(target=feed)
    t.start()
    try:
        wait_for(lambda: len(fired) >= 3 or None, 60, "ranges before the deploy")
        services.control.deploy(me, pipeline("b"))
        at_deploy = len(fired)
        wait_for(lambda: len(fired) >= at_deploy + 3 or None, 60, "ranges after the deploy")
    finally:
        stop.set()
        t.join()
    run_all(services)
    rows = q(
        services,
        "SELECT r.input_event -> 'range' ->> 'start' AS start, count(*) AS n "
        "FROM task_registry r JOIN task_status s USING (task_id, start_day) "
        "WHERE r.job = 'decode' AND r.dag_version = 2 AND s.status <> 'canceled' GROUP BY 1",
    )
    seen = {int(r["start"]): r["n"] for r in rows}
    source_ranges = {a for a, _ in q_ranges(services)}
    assert seen == {a: 1 for a in source_ranges}


def _job(services: Services, task_id: uuid.UUID) -> str:
    return str(q(services, "SELECT job FROM task_registry WHERE task_id = %s", task_id)[0]["job"])


def q_ranges(services: Services) -> list[tuple[int, int]]:
    rows = q(
        services,
        "SELECT DISTINCT e.range_start, e.range_end FROM events e "
        "JOIN datasets ds ON ds.dataset_uuid = e.dataset_uuid "
        "WHERE ds.producer_job = 'source'",
    )
    return [(r["range_start"], r["range_end"]) for r in rows]


def test_a_cutover_killed_mid_transaction_leaves_every_pointer_old(
    live: Services, settings: Any, dsn: str
) -> None:
    services, me = live, admin(live)
    services.control.deploy(me, pipeline("b"))
    run_all(services)
    before = current(services)
    script = (
        "from trace_platform.config import Settings\n"
        "from trace_platform.services import Services\n"
        "from trace_platform.identity import lite_admin\n"
        f"s = Services.build(Settings.model_validate_json({settings.model_dump_json()!r}), {dsn!r})\n"
        "with s.pool.connection() as c:\n"
        "    me = lite_admin(c)\n"
        "s.control.changes.cutover(me, 'chg')\n"
    )
    env = {**os.environ, "TRACE_FAULTS": "rollout.cutover_after_swap"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert current(services) == before
    assert services.control.show_dag(me, "chg")["active_version"] == 1
    assert services.control.changes.cutover(me, "chg")["datasets_swapped"] == 2
    after = current(services)
    assert after["chg_agg"] != before["chg_agg"] and after["chg_decoded"] != before["chg_decoded"]


def input_events(services: Services, job: str) -> list[dict[str, Any]]:
    rows = q(
        services,
        "SELECT input_event FROM task_registry WHERE job = %s ORDER BY created_at",
        job,
    )
    return [r["input_event"] for r in rows]


def test_a_replace_correction_reruns_exactly_the_downstream_of_its_scope(live: Services) -> None:
    services = live
    before = {j: len(input_events(services, j)) for j in ("decode", "agg", "side")}
    fire(services, (100, 199))  # the source rewrites one range it had committed
    ran = run_all(services)
    assert sorted(ran) == [
        ("agg", 1, "100-199"),
        ("decode", 1, "100-199"),
        ("side", 1, "100-199"),
        ("source", 1, "fire"),
    ]
    for job in ("decode", "agg", "side"):
        events = input_events(services, job)
        assert len(events) == before[job] + 1
        assert events[-1]["invalidates"] is True and events[-1]["range"]["start"] == 100
        assert not any(e.get("invalidates") for e in events[:-1])
    # Each rewrite retired the files it replaced; the commits point at the new ones.
    retired = q(services, "SELECT count(*) AS n FROM retired_locations WHERE reason = 'superseded'")
    assert retired[0]["n"] == 4  # source, decode, agg, side: one scope each
    assert commits(services, "chg_agg") == [("range:0-99", 1), ("range:100-199", 1)]
    # A first commit of a new scope is no invalidation.
    fire(services, (700, 799))
    run_all(services)
    assert "invalidates" not in input_events(services, "agg")[-1]


def test_the_cli_diffs_follows_cuts_over_and_rolls_back(
    live: Services, dsn: str, tmp_path: Path
) -> None:
    """The commands a user runs, as a subprocess against the same database."""
    env = {
        "TRACE_STATE_DSN": dsn,
        "TRACE_HOME": str(live.settings.home),
        "TRACE_OPERATOR_REGISTRY": "testing",
    }
    dag = tmp_path / "chg.yaml"
    dag.write_text(pipeline("b"))
    diff = trace(["dag", "diff", str(dag)], env)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert "decode" in diff.stdout and "would rebuild: agg, decode" in diff.stdout
    assert "range:0-99, range:100-199" in diff.stdout
    assert q(live, "SELECT count(*) AS n FROM dag_versions")[0]["n"] == 1  # nothing changed
    out = trace(["dag", "deploy", "--manual-cutover", str(dag)], env)
    assert "version 2 (building)" in out.stdout, out.stdout + out.stderr
    run_all(live)
    status = trace(["dag", "status", "chg"], env)
    assert "version 2 building (manual cutover)" in status.stdout, status.stdout
    assert "ready to cut over" in status.stdout
    cut = trace(["dag", "cutover", "chg"], env)
    assert "cut over to version 2 (from 1): 2 datasets swapped" in cut.stdout, cut.stdout
    back = trace(["dag", "rollback", "chg", "--to", "1"], env)
    assert "rolled back to version 1 (from 2)" in back.stdout, back.stdout + back.stderr
    again = trace(["dag", "rollback", "chg", "--to", "1"], env)
    assert again.returncode == 1 and "already active" in again.stdout
    paused = trace(["dag", "pause", "chg"], env)
    assert "paused" in paused.stdout
    assert "(paused)" in trace(["dag", "status", "chg"], env).stdout
