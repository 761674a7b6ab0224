"""A new DAG over existing data (issue 44), on a real Postgres, tasks driven by hand (each writes
its input's range to its output) so every count is exact: a first deploy processes the history
its inputs already hold, a backfill replays exactly the scopes asked for and is idempotent and
cancelable as a whole, and a trigger that would start nothing says so."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.cli import trace
from tests.support.dags import admin, user
from tests.support.safe_change import claimable, finish, q, start
from trace_platform.contract import CompleteRequest
from trace_platform.control import service as control_service
from trace_platform.errors import Conflict, Forbidden, Invalid, NotFound
from trace_platform.services import Services

UPSTREAM = """
name: up
jobs:
  src:
    operator: noop
    outputs: [{backend: parquet}]
publish:
  - {job: src, output_index: 0, dataset: up_rows}
"""

# The new user: one job reading another DAG's published data, nothing else.
NEW_DAG = """
name: windows
jobs:
  count:
    operator: noop
    inputs: [{from: {dataset: up_rows}}]
    outputs: [{backend: parquet}]
publish:
  - {job: count, output_index: 0, dataset: windows_rows}
"""

RANGES = [(0, 500), (500, 1000), (1000, 1500)]


def _run_queued(services: Services) -> list[str]:
    """Runs every queued task once (not what they start); returns their scopes."""
    done = []
    for task_id in claimable(services):
        ref, payload = start(services, task_id)
        assert finish(services, ref, payload) == "succeeded"
        rng = (payload.input_event or {}).get("range")
        done.append(f"range:{rng['start']}-{rng['end']}" if rng else "fire")
    return sorted(done)


def _commits(services: Services, dataset: str) -> list[dict[str, Any]]:
    return q(
        services,
        "SELECT c.scope, c.location, c.task_id FROM dataset_commits c "
        "JOIN dataset_current cur USING (dataset_version) JOIN datasets d "
        "ON d.dataset_uuid = cur.dataset_uuid WHERE d.dataset_name = %s ORDER BY c.scope",
        dataset,
    )


@pytest.fixture
def upstream(services: Services) -> Services:
    """`up_rows` holding three committed ranges (and the events announcing them)."""
    me = admin(services)
    services.control.deploy(me, UPSTREAM)
    services.control.trigger(me, "up", config={"ranges": [list(r) for r in RANGES]})
    assert _run_queued(services) == ["fire"]
    return services


def test_a_first_deploy_processes_the_history_its_inputs_hold(upstream: Services) -> None:
    svc, me = upstream, admin(upstream)
    plan = svc.control.deploy(me, NEW_DAG, dry_run=True)
    assert plan.replays["count"].tasks == 3
    assert plan.replays["count"].sources == {"up_rows": 3}
    assert plan.replays["count"].run_id is None and claimable(svc) == []  # a diff starts nothing
    res = svc.control.deploy(me, NEW_DAG)
    assert res.live and res.replays["count"].tasks == 3 and res.replays["count"].run_id
    runs = svc.control.list_runs(me, "windows")
    assert [(r["kind"], r["tasks"], r["status"]) for r in runs] == [("deploy", 3, "running")]
    assert _run_queued(svc) == ["range:0-500", "range:1000-1500", "range:500-1000"]
    assert [c["scope"] for c in _commits(svc, "windows_rows")] == [
        "range:0-500",
        "range:1000-1500",
        "range:500-1000",
    ]
    assert svc.control.list_runs(me, "windows")[0]["status"] == "succeeded"


def test_a_backfill_replays_exactly_the_overlapping_scopes_and_changes_nothing_twice(
    upstream: Services,
) -> None:
    svc, me = upstream, admin(upstream)
    svc.control.deploy(me, NEW_DAG)
    _run_queued(svc)
    before = _commits(svc, "windows_rows")
    for (a, b), expect in [
        ((500, 999), ["range:500-1000"]),
        ((999, 999), ["range:500-1000"]),
        ((1000, 1000), ["range:1000-1500"]),
        ((400, 1200), ["range:0-500", "range:1000-1500", "range:500-1000"]),
        ((2000, 3000), []),
    ]:
        plan = svc.control.changes.backfill(me, "windows", from_block=a, to_block=b, dry_run=True)
        got = sorted(plan["jobs"]["count"]["scopes"])
        assert got == expect, (a, b, got)
        assert plan["run_id"] is None and claimable(svc) == []
    res = svc.control.changes.backfill(me, "windows", from_block=500, to_block=999)
    assert res["tasks"] == 1 and res["run_id"] is not None
    assert _run_queued(svc) == ["range:500-1000"]
    after = _commits(svc, "windows_rows")
    # The same scopes, one rewritten in place (replace): no scope added or repeated.
    assert [c["scope"] for c in after] == [c["scope"] for c in before]
    changed = [c["scope"] for b, c in zip(before, after, strict=True) if b != c]
    assert changed == ["range:500-1000"]
    again = svc.control.changes.backfill(me, "windows", scopes=["range:500-1000"])
    assert again["tasks"] == 1
    _run_queued(svc)
    assert [c["scope"] for c in _commits(svc, "windows_rows")] == [c["scope"] for c in before]
    retired = q(svc, "SELECT count(*) AS n FROM retired_locations WHERE reason = 'superseded'")
    assert retired[0]["n"] == 2  # each rewrite retired the one location it replaced
    runs = svc.control.list_runs(me, "windows")
    assert [r["kind"] for r in runs].count("backfill") == 2


def test_a_backfill_canceled_midway_leaves_every_scope_whole(upstream: Services) -> None:
    svc, me = upstream, admin(upstream)
    svc.control.deploy(me, NEW_DAG)
    _run_queued(svc)
    before = _commits(svc, "windows_rows")
    res = svc.control.changes.backfill(me, "windows")
    assert res["tasks"] == 3
    first, *_ = claimable(svc)
    ref, _ = start(svc, first)  # one scope's task is running when the cancel comes
    out = svc.control.cancel_run(me, res["run_id"])
    assert out["canceled"] == 3
    assert claimable(svc) == []
    assert svc.dispatcher.get_task(first).cancel_requested
    # The running one reports canceled (the wrapper does, on the heartbeat's word): nothing lands.
    svc.dispatcher.complete(CompleteRequest(**ref.model_dump(), outcome="canceled"))
    assert _commits(svc, "windows_rows") == before
    (run,) = [r for r in svc.control.list_runs(me, "windows") if r["kind"] == "backfill"]
    assert run["status"] == "canceled"


def test_backfills_say_what_they_refuse(upstream: Services) -> None:
    svc, me = upstream, admin(upstream)
    svc.control.deploy(me, NEW_DAG)
    bob, _ = user(svc, "bob")
    with pytest.raises(Forbidden, match="'bob' may not backfill DAG 'windows'"):
        svc.control.changes.backfill(bob, "windows")
    with pytest.raises(NotFound, match=r"has no job 'nope'.*its jobs: count"):
        svc.control.changes.backfill(me, "windows", jobs=["nope"])
    with pytest.raises(Invalid, match="job 'src' reads no input"):
        svc.control.changes.backfill(me, "up", jobs=["src"])
    with pytest.raises(Invalid, match="not both"):
        svc.control.changes.backfill(me, "windows", from_block=1, to_block=2, scopes=["all"])
    with pytest.raises(Invalid, match="at most --to-block"):
        svc.control.changes.backfill(me, "windows", from_block=9, to_block=2)
    with pytest.raises(NotFound):
        svc.control.changes.backfill(me, "absent")


def test_a_trigger_that_would_start_nothing_says_how_to_backfill(upstream: Services) -> None:
    svc, me = upstream, admin(upstream)
    svc.control.deploy(me, NEW_DAG)
    fires = q(svc, "SELECT count(*) AS n FROM trigger_fires")[0]["n"]
    with pytest.raises(Conflict, match=r"no source job.*count.*trace dag backfill windows") as e:
        svc.control.trigger(me, "windows")
    assert e.value.code == "no_source_job"
    assert q(svc, "SELECT count(*) AS n FROM trigger_fires")[0]["n"] == fires  # nothing stored


def test_the_cli_and_http_twins(upstream: Services, api: httpx.Client) -> None:
    """`trace dag backfill --dry-run`, `trace dag trigger --wait` on a DAG with no source job
    (answers at once, exit 1, naming the backfill), and the HTTP backfill and run cancel."""
    svc, me = upstream, admin(upstream)
    svc.control.deploy(me, NEW_DAG)
    _run_queued(svc)
    env = {"TRACE_STATE_DSN": svc.dsn, "TRACE_HOME": str(svc.settings.home)}
    out = trace(["dag", "backfill", "windows", "--from-block", "500", "--to-block", "999",
                 "--dry-run"], env)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "range:500-1000" in out.stdout and "1 of up_rows" in out.stdout
    assert "would replay 1 scope(s)" in out.stdout
    out = trace(["dag", "trigger", "windows", "--wait", "--timeout", "5"], env, timeout=60)
    assert out.returncode == 1 and "trace dag backfill windows" in out.stdout, out.stdout
    r = api.post("/v1/dags/windows/backfill", json={"scopes": ["range:0-500"]})
    assert r.status_code == 200, r.text
    run_id = r.json()["run_id"]
    assert r.json()["jobs"]["count"]["tasks"] == 1
    r = api.post(f"/v1/runs/{run_id}/cancel")
    assert r.status_code == 200 and r.json()["canceled"] == 1, r.text
    assert api.post("/v1/dags/windows/backfill", json={"bogus": 1}).status_code == 422


# The database itself refuses the second cancel it is asked for (a real trigger): a run's
# cancel stops half way, one task canceled and committed, the rest not.
REFUSE_SECOND_CANCEL = """
CREATE TABLE test_cancels (n int NOT NULL);
INSERT INTO test_cancels VALUES (0);
CREATE FUNCTION test_refuse_second_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.cancel_requested AND NOT OLD.cancel_requested THEN
    UPDATE test_cancels SET n = n + 1;
    IF (SELECT n FROM test_cancels) = 2 THEN
      RAISE EXCEPTION 'the test refuses this cancel';
    END IF;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER test_refuse_second_cancel BEFORE UPDATE ON task_status
  FOR EACH ROW EXECUTE FUNCTION test_refuse_second_cancel();
"""


def _cancel_rows(services: Services, run_id: object) -> list[dict[str, Any]]:
    return q(
        services,
        "SELECT outcome, details FROM audit_log WHERE action = 'run.cancel' AND target = %s "
        "ORDER BY id",
        str(run_id),
    )


def test_a_run_cancel_is_audited_once_with_what_it_canceled_even_half_done(
    upstream: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, me = upstream, admin(upstream)
    # A batch of tasks a transaction: batches of one, so the first commits before the second
    # is refused (a refused batch is wholly undone).
    monkeypatch.setattr(control_service, "_CANCEL_BATCH", 1)
    svc.control.deploy(me, NEW_DAG)
    _run_queued(svc)
    run_id = svc.control.changes.backfill(me, "windows")["run_id"]
    first, *_ = claimable(svc)
    start(svc, first)  # running: its cancel asks it to stop
    with svc.pool.connection() as conn:
        conn.execute(REFUSE_SECOND_CANCEL)
    with pytest.raises(Exception, match="the test refuses this cancel"):
        svc.control.cancel_run(me, run_id)
    # The one task canceled before the failure stays so, and the log says which, and why the
    # cancel stopped.
    (half,) = _cancel_rows(svc, run_id)
    asked = q(svc, "SELECT task_id FROM task_status WHERE cancel_requested")
    assert [str(r["task_id"]) for r in asked] == half["details"]["tasks"]
    assert half["outcome"] == "ok" and half["details"]["canceled"] == 1
    assert "the test refuses this cancel" in half["details"]["stopped_by"]

    with svc.pool.connection() as conn:
        conn.execute("DROP TRIGGER test_refuse_second_cancel ON task_status")
    assert svc.control.cancel_run(me, run_id)["canceled"] == 2  # the rest
    rest = _cancel_rows(svc, run_id)[1]
    assert rest["outcome"] == "ok" and "stopped_by" not in rest["details"]
    done = half["details"]["tasks"] + rest["details"]["tasks"]
    assert len(set(done)) == 3
    assert half["details"]["stopping"] + rest["details"]["stopping"] == 1  # the running one

    # Again: the running task is still stopping, nothing else is left: nothing is canceled,
    # and the row says so rather than count the running task a second time.
    assert svc.control.cancel_run(me, run_id)["canceled"] == 0
    again = _cancel_rows(svc, run_id)[2]
    assert again["outcome"] == "noop" and again["details"]["canceled"] == 0
    assert svc.dispatcher.get_task(first).status == "running"
