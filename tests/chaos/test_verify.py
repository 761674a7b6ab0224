"""`trace verify` (issue 12): the published analytics against the node itself. On the golden
path every sampled value matches; after a dataset is tampered with (one wrong total supply, one
wrong balance, written as Parquet and committed in place of the real files) it exits non-zero
and names the analytic and the block."""

from __future__ import annotations

import decimal
import io
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.amounts import limbs, value
from tests.support.cli import trace
from tests.support.dags import admin, finished_run
from tests.support.devnet import DEMO, devnet_fixture, small_demo_dag
from trace_platform.chain import Rpc
from trace_platform.config import Settings
from trace_platform.devnet import ChainInfo, ChainSpec
from trace_platform.lite.demo import saved_rows
from trace_platform.lite.stack import LiteStack
from trace_platform.objectstore import list_all, make_store
from trace_platform.services import Services
from trace_platform.verify import Node, sample_blocks, verify_all

pytestmark = pytest.mark.slow
SPEC = ChainSpec(seed=21, blocks=300, accounts=30, validators=4, epoch_blocks=50)
HEAD = SPEC.blocks - 1


chain = devnet_fixture(SPEC)


def bumped(v: Any) -> Any:
    """The same amount plus one, in whatever exact type the column holds."""
    if isinstance(v, str):
        return str(int(v) + 1)
    if isinstance(v, dict):  # limbs, as amounts are stored
        return limbs(value(v) + 1)
    assert isinstance(v, int | decimal.Decimal), type(v)
    return v + 1


def tamper(svc: Services, dataset: str, match: dict[str, str], column: str) -> int:
    """Rewrites the current version of `dataset` with `column` off by one in the newest row
    matching `match`: new Parquet files under a new prefix, the commit pointed at them (what a
    corrupted or hand-edited store would look like to a reader). Returns that row's block."""
    store = make_store(svc.settings)
    with svc.pool.connection() as conn:
        commits = conn.execute(
            "SELECT dc.commit_id, dc.location FROM dataset_commits dc "
            "JOIN dataset_current c ON c.dataset_version = dc.dataset_version "
            "JOIN datasets d ON d.dataset_uuid = c.dataset_uuid "
            "WHERE d.dataset_name = %s AND dc.location IS NOT NULL",
            [dataset],
        ).fetchall()
    files = {
        (r["commit_id"], r["location"], o.key): pq.read_table(io.BytesIO(store.get(o.key)))
        for r in commits
        for o in list_all(store, r["location"])
        if o.key.endswith(".parquet")
    }
    found = [
        (table.column("block_number")[i].as_py(), key, i)
        for key, table in files.items()
        for i, row in enumerate(table.select(list(match)).to_pylist())
        if row == match
    ]
    block, target, index = max(found, key=lambda f: f[0])
    moved: dict[object, str] = {}
    for (commit_id, location, key), table in files.items():
        base = location.rstrip("/")
        new_location = base + "-tampered/"
        if (commit_id, location, key) == target:
            values = table.column(column).to_pylist()
            values[index] = bumped(values[index])
            i = table.schema.get_field_index(column)
            table = table.set_column(
                i, table.schema.field(i), pa.array(values, table.schema.field(i).type)
            )
        buf = io.BytesIO()
        pq.write_table(table, buf)
        store.put(base + "-tampered" + key.removeprefix(base), buf.getvalue())
        moved[commit_id] = new_location
    with svc.pool.connection() as conn:
        for commit_id, location in moved.items():
            conn.execute(
                "UPDATE dataset_commits SET location = %s WHERE commit_id = %s",
                [location, commit_id],
            )
    return int(block)


def test_verify_passes_on_the_golden_path_and_names_tampered_values(
    settings: Settings, dsn: str, chain: tuple[str, ChainInfo]
) -> None:
    url, info = chain
    token = info.token.lower()
    env = {"TRACE_STATE_DSN": dsn, "TRACE_HOME": str(settings.home)}
    with LiteStack(
        settings, workers=2, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"}
    ) as stack:
        svc, me = stack.services, admin(stack.services)
        svc.control.deploy(me, small_demo_dag(url), str(DEMO))
        run_id = svc.control.trigger(
            me, "monad_demo", config={"from_block": 0, "to_block": HEAD, "chunk_size": 100}
        )["run_id"]
        tasks = finished_run(svc, run_id, 600)
        assert all(t["status"] == "succeeded" for t in tasks), [
            (t["job"], t["status"], t["last_error"]) for t in tasks if t["status"] != "succeeded"
        ]

        def query(sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
            out = svc.query.query(me, sql, params).as_json()
            cols = [c["name"] for c in out["columns"]]
            return [dict(zip(cols, r, strict=True)) for r in out["rows"]]

        # The checks as functions: every analytic checked, every value equal to the node's.
        with Rpc(url) as rpc:
            span, outcomes = verify_all(query, Node(rpc), token, samples=8, seed=4, holders=5)
        assert span == (0, HEAD)
        by_name = {o.analytic: o for o in outcomes}
        assert [o.skipped for o in outcomes] == [None] * 4
        assert all(o.ok and o.checked == o.matched for o in outcomes), [
            m.describe() for o in outcomes for m in o.mismatches
        ]
        supply = by_name["token_supply"]
        assert supply.checked == 8 and supply.blocks[0] == 0 and supply.blocks[-1] == HEAD
        assert by_name["top_holders"].checked == 5
        assert by_name["holder_history"].checked == 5 * 8
        stake = by_name["validator_stake"]
        assert len(stake.blocks) >= 4 and stake.checked >= 4 * len(stake.blocks)

        # The real command, with the defaults a demo run leaves behind (its plan in last.json).
        plan = settings.home / "demo" / "last.json"
        plan.parent.mkdir(parents=True, exist_ok=True)
        plan.write_text(json.dumps({"rpc_url": url, "token": info.token}))
        ok = trace(["verify", "--seed", "4"], env)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert f"Verifying blocks 0-{HEAD} against {url}" in ok.stdout
        assert "every checked value matches the node" in ok.stdout
        assert re.search(r"token_supply\b.*\b8\W+8\W+8\W+match", ok.stdout), ok.stdout

        # One wrong total supply and one wrong balance: the newest of each, so the last synced
        # block (always sampled) reads them.
        changed = tamper(svc, "token_supply", {"token_address": token}, "total_supply")
        top = saved_rows(svc, me, "top_holders", token=token, n=1)[0]["account"]
        tamper(svc, "token_balances", {"token_address": token, "account": top}, "balance")
        bad = trace(["verify", "--rpc-url", url, "--token", info.token, "--seed", "4"], env)
        assert bad.returncode == 1, bad.stdout + bad.stderr
        text = " ".join(bad.stdout.split())
        assert f"mismatch token_supply at block {HEAD} ({token}): Trace " in text, bad.stdout
        # Exactly the sampled blocks that carry the tampered supply forward.
        named = re.findall(r"mismatch token_supply at block (\d+)", text)
        assert [int(b) for b in named] == [b for b in sample_blocks(0, HEAD, 8, 4) if b >= changed]
        assert f"mismatch top_holders at block {HEAD} (holder {top}): Trace " in text, bad.stdout
        assert f"mismatch holder_history at block {HEAD} (holder {top})" in text, bad.stdout
        assert "mismatch validator_stake" not in text
        assert re.search(r"validator_stake .* match", bad.stdout), bad.stdout


def test_verify_without_a_node_says_what_to_do(tmp_path: Path) -> None:
    env = {"TRACE_HOME": str(tmp_path)}
    none = trace(["verify"], env)
    assert none.returncode == 2, none.stdout + none.stderr
    assert "no node to verify against: pass --rpc-url URL" in " ".join(none.stdout.split())
    down = trace(["verify", "--rpc-url", "http://127.0.0.1:9"], env)
    assert down.returncode == 2, down.stdout + down.stderr
    assert "no node answers at http://127.0.0.1:9 (from --rpc-url)" in " ".join(down.stdout.split())
