"""Dataset versions listed, and purged by an admin: what is kept, what is retired, who may."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.support.cli import trace as cli
from tests.support.dags import admin, three_jobs, user
from tests.support.servers import secured_api
from trace_platform.config import Settings
from trace_platform.errors import Invalid
from trace_platform.identity import create_key, ensure_user
from trace_platform.services import Services

DAY = "interval '1 day'"
# The fixture's DAG versions (1 is the deploy's own) and their states.
DAG_STATES = {
    1: "retired",
    2: "retired",
    3: "abandoned",
    4: "retired",
    5: "active",
    6: "rolled_back",
    7: "building",
}


def q(services: Services, query: str, *args: Any) -> list[dict[str, Any]]:
    with services.pool.connection() as conn:
        return conn.execute(query, args).fetchall()  # type: ignore[arg-type]


def history(services: Services) -> dict[str, Any]:
    """hello_clean with six versions `v[0..5]`, oldest first, as cutovers, rollbacks and
    rebuilds leave them (the DAG versions mapping each in brackets):

    v[0] complete, built on Postgres: two commits into its one table (DAG v1, v2)
    v[1] abandoned (DAG v3, abandoned)
    v[2] complete, one of its commits' locations also committed to v[4] (DAG v4)
    v[3] complete and current (DAG v5, active)
    v[4] complete (DAG v6, rolled back)
    v[5] building (DAG v7, building)
    """
    me = admin(services)
    res = services.control.deploy(me, three_jobs())
    clean = res.datasets["hello_clean"]
    base = f"org/{me.org_id}/dataset/{clean}/version"
    with services.pool.connection() as conn, conn.transaction():
        (first,) = conn.execute(
            "SELECT c.dataset_version, d.producer_dag_id AS dag_id FROM dataset_current c "
            "JOIN datasets d USING (dataset_uuid) WHERE dataset_uuid = %s",
            [clean],
        ).fetchall()
        dag_id = first["dag_id"]
        v = [first["dataset_version"], *(uuid.uuid4() for _ in range(5))]
        table = f"dataset_{clean.hex}.v_{v[0].hex}"
        conn.execute(
            "UPDATE dataset_versions SET location = %s, state = 'complete', "
            f"created_at = now() - 10 * {DAY} WHERE dataset_version = %s",
            [table, v[0]],
        )
        conn.execute(
            "INSERT INTO dag_versions (dag_id, version, spec, source_yaml, checksum, deployed_by) "
            "SELECT dag_id, g, spec, source_yaml, checksum, deployed_by FROM dag_versions, "
            "generate_series(2, 7) g WHERE dag_id = %s",
            [dag_id],
        )
        for version, state in DAG_STATES.items():
            conn.execute(
                "UPDATE dag_versions SET state = %s WHERE dag_id = %s AND version = %s",
                [state, dag_id, version],
            )
        conn.execute(
            "UPDATE dags SET active_version = 5, building_version = 7 WHERE dag_id = %s", [dag_id]
        )
        for i, (dag_version, state) in enumerate(
            [(3, "abandoned"), (4, "complete"), (5, "complete"), (6, "complete"), (7, "building")],
            start=1,
        ):
            conn.execute(
                "INSERT INTO dataset_versions (dataset_version, dataset_uuid, dag_id, dag_version, "
                f"location, state, created_at) VALUES (%s, %s, %s, %s, %s, %s, now() - {10 - i} "
                f"* {DAY})",
                [v[i], clean, dag_id, dag_version, f"{base}/{v[i]}/", state],
            )
        conn.execute("DELETE FROM dag_version_outputs WHERE dataset_uuid = %s", [clean])
        for dag_version, i in ((1, 0), (2, 0), (3, 1), (4, 2), (5, 3), (6, 4), (7, 5)):
            conn.execute(
                "INSERT INTO dag_version_outputs (dag_id, dag_version, job, dataset_uuid, "
                "dataset_version) VALUES (%s, %s, 'transform', %s, %s)",
                [dag_id, dag_version, clean, v[i]],
            )
        conn.execute(
            "UPDATE dataset_current SET dataset_version = %s WHERE dataset_uuid = %s", [v[3], clean]
        )
        shared = f"{base}/shared/"
        commits = [
            (0, "range:0-10", table, 10),
            (0, "range:10-20", table, 10),
            (1, "range:0-10", f"{base}/{v[1]}/range=0-10/", 1),
            (2, "range:0-10", f"{base}/{v[2]}/range=0-10/", 2),
            (2, "range:10-20", shared, 3),
            (3, "range:0-10", f"{base}/{v[3]}/range=0-10/", 4),
            (4, "range:0-10", shared, 5),
            (5, "range:0-10", f"{base}/{v[5]}/range=0-10/", 6),
        ]
        for i, scope, location, rows in commits:
            conn.execute(
                "INSERT INTO dataset_commits (commit_id, dataset_uuid, dataset_version, task_id, "
                "attempt, scope, location, row_count, byte_count) "
                "VALUES (%s, %s, %s, %s, 1, %s, %s, %s, %s)",
                [uuid.uuid4(), clean, v[i], uuid.uuid4(), scope, location, rows, rows * 100],
            )
    return {"v": v, "table": table, "base": base, "shared": shared, "clean": clean}


def state(services: Services) -> dict[str, list[dict[str, Any]]]:
    """Everything a purge may change."""
    return {
        t: q(services, f"SELECT * FROM {t} ORDER BY 1, 2")
        for t in ("dataset_versions", "dataset_commits", "dag_version_outputs", "dataset_current")
    } | {"retired_locations": q(services, "SELECT * FROM retired_locations ORDER BY id")}


def test_versions_are_listed_newest_first_with_what_needs_them(services: Services) -> None:
    h = history(services)
    v = h["v"]
    listed = services.control.dataset_versions(admin(services), "hello_clean")
    assert [r["dataset_version"] for r in listed] == list(reversed(v))
    shape = [
        (
            r["state"],
            r["dag_version"],
            r["current"],
            r["active_map"],
            r["building_map"],
            r["rollback_versions"],
            r["commits"],
            r["row_count"],
        )
        for r in listed
    ]
    assert shape == [
        ("building", 7, False, False, True, [], 1, 6),
        ("complete", 6, False, False, False, [6], 1, 5),
        ("complete", 5, True, True, False, [], 1, 4),
        ("complete", 4, False, False, False, [4], 2, 5),
        ("abandoned", 3, False, False, False, [], 1, 1),
        ("complete", 1, False, False, False, [1, 2], 2, 20),
    ]
    assert listed[-1]["location"] == h["table"] and listed[-1]["byte_count"] == 2000


def test_purge_keeps_what_is_needed_and_retires_the_rest(services: Services) -> None:
    h = history(services)
    v, base, me, cp = h["v"], h["base"], admin(services), services.control
    before = state(services)
    dry = cp.purge_versions(me, "hello_clean", 1, dry_run=True)
    assert state(services) == before  # a dry run changes nothing
    assert [p["dataset_version"] for p in dry["purged"]] == [v[2], v[1], v[0]]
    assert {k["dataset_version"]: k["reasons"] for k in dry["kept"]} == {
        v[5]: ["building", "building map"],
        v[4]: ["newest"],
        v[3]: ["current", "active map"],
    }
    # v1's table once (its commits name it too); the location v5 still reads is not retired.
    retiring = sorted(
        [
            {"backend": "parquet", "location": f"{base}/{v[1]}/range=0-10/"},
            {"backend": "parquet", "location": f"{base}/{v[2]}/range=0-10/"},
            {"backend": "postgres", "location": h["table"]},
        ],
        key=lambda r: r["location"],
    )
    assert (dry["commits"], dry["locations"], dry["rollback_lost"]) == (5, retiring, [1, 2, 4])

    done = cp.purge_versions(me, "hello_clean", 1)
    assert {**done, "dry_run": True} == dry
    left = [r["dataset_version"] for r in cp.dataset_versions(me, "hello_clean")]
    assert left == [v[5], v[4], v[3]]
    gone = [v[0], v[1], v[2]]
    for table in ("dataset_commits", "dag_version_outputs", "dataset_versions"):
        assert q(services, f"SELECT 1 FROM {table} WHERE dataset_version = ANY(%s)", gone) == []
    retired = q(
        services, "SELECT org_id, backend, location, reason, deleted_at FROM retired_locations"
    )
    assert sorted(retired, key=lambda r: r["location"]) == [
        {**loc, "org_id": me.org_id, "reason": "purged", "deleted_at": None} for loc in retiring
    ]
    # The other dataset of the DAG is untouched.
    assert cp.dataset_versions(me, "hello_raw")

    # keep 0: only what is still needed stays; now nothing reads the shared location.
    last = cp.purge_versions(me, "hello_clean", 0)
    assert [p["dataset_version"] for p in last["purged"]] == [v[4]]
    assert last["locations"] == [{"backend": "parquet", "location": h["shared"]}]
    assert last["rollback_lost"] == [6]
    left = [r["dataset_version"] for r in cp.dataset_versions(me, "hello_clean")]
    assert left == [v[5], v[3]]
    assert cp.purge_versions(me, "hello_clean", 0)["purged"] == []
    with pytest.raises(Invalid, match="keep must be 0 or more"):
        cp.purge_versions(me, "hello_clean", -1)


def test_purge_is_for_admins_of_the_datasets_org(settings: Settings, dsn: str) -> None:
    with secured_api(settings, dsn) as (svc, url):
        history(svc)
        admin_key = svc.new_admin_key or (svc.settings.home / "admin.key").read_text().strip()
        svc.control.set_read_roles(admin(svc), "hello_clean", ["analyst"], [])
        _, reader_key = user(svc, "rita", ["analyst"])
        _, stranger_key = user(svc, "sam")
        other = uuid.uuid4()
        with svc.pool.connection() as conn, conn.transaction():
            conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'other')", (other,))
            eve_key = create_key(conn, ensure_user(conn, other, "eve", is_admin=True).user_id)

        def call(key: str, method: str, path: str, **kw: Any) -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}"}
            return httpx.request(method, f"{url}/v1/datasets/{path}", headers=headers, **kw)

        before = state(svc)
        # A reader sees the versions, but may not purge them.
        listed = call(reader_key, "GET", "hello_clean/versions")
        assert listed.status_code == 200 and len(listed.json()) == 6
        r = call(reader_key, "POST", "hello_clean/purge", json={"keep": 0})
        assert r.status_code == 403 and "only org admins may purge" in r.json()["message"]
        # Someone who may not read it, and another org's admin, cannot tell it exists.
        unknown = call(admin_key, "GET", "nope/versions").json()
        for key in (stranger_key, eve_key):
            r = call(key, "GET", "hello_clean/versions")
            assert r.status_code == 404
            assert r.json()["message"] == unknown["message"].replace("nope", "hello_clean")
        r = call(eve_key, "POST", "hello_clean/purge", json={"keep": 0})
        assert r.status_code == 404
        r = call(admin_key, "POST", "hello_clean/purge", json={"keep": -1})
        assert r.status_code == 422 and "keep" in r.json()["message"]
        assert state(svc) == before

        r = call(admin_key, "POST", "hello_clean/purge", json={"keep": 1, "dry_run": True})
        assert r.status_code == 200 and len(r.json()["purged"]) == 3
        assert state(svc) == before
        r = call(admin_key, "POST", "hello_clean/purge", json={"keep": 1})
        assert r.status_code == 200 and len(r.json()["locations"]) == 3
        assert len(call(reader_key, "GET", "hello_clean/versions").json()) == 3


def test_cli_lists_and_purges(services: Services, dsn: str) -> None:
    h = history(services)
    v = h["v"]
    env = {"TRACE_STATE_DSN": dsn, "TRACE_HOME": str(services.settings.home)}
    listed = cli(["datasets", "versions", "hello_clean"], env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    lines = {str(x): line for x in v for line in listed.stdout.splitlines() if str(x) in line}
    assert len(lines) == 6
    assert "building" in lines[str(v[5])] and "yes" in lines[str(v[3])]
    assert "active" in lines[str(v[3])] and "1, 2" in lines[str(v[0])]

    before = state(services)
    dry = cli(["datasets", "purge", "hello_clean", "--keep", "1", "--dry-run"], env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "would purge 3 version(s), 5 commit(s); 3 location(s) retired" in dry.stdout
    assert all(str(x) in dry.stdout for x in v[:3])
    assert state(services) == before
    bad = cli(["datasets", "purge", "hello_clean", "--keep=-1"], env)
    assert bad.returncode == 1 and "keep must be 0 or more" in bad.stdout
    done = cli(["datasets", "purge", "hello_clean", "--keep", "1"], env)
    assert done.returncode == 0 and "purged 3 version(s)" in done.stdout
    assert "DAG version(s) 1, 2, 4 can no longer be rolled back to" in done.stdout
    assert len(q(services, "SELECT 1 FROM retired_locations WHERE reason = 'purged'")) == 3
