"""The demo DAG, shipped as package data, with a plan's chain, range and window sizes set."""

from __future__ import annotations

from importlib import resources

from trace_platform.lite.demo.plan import DemoPlan

DAG_NAME = "monad_demo"
# The same file as examples/dags/monad_demo.yaml (tests/unit/test_demo_dag.py holds them equal).
DEMO_DAG = resources.files("trace_platform.lite") / "dags" / "monad_demo.yaml"


def dag_text(plan: DemoPlan) -> str:
    """The demo DAG with this plan's chain, RPC rate, range and window sizes set by key."""
    import yaml

    dag = yaml.safe_load(DEMO_DAG.read_text())
    for slot in dag["worker_pools"]["rpc"]:
        slot["env"]["RPC_URL"] = plan.rpc_url
    jobs = dag["jobs"]
    jobs["ingest"]["config"]["network_name"] = plan.network
    jobs["ingest"]["config"]["requests_per_second"] = plan.requests_per_second
    jobs["hot"]["config"]["window_blocks"] = plan.hot_blocks
    jobs["staking_periods"]["config"]["args"]["window_blocks"] = plan.window_blocks
    for name in ("transfers_complete", "staking_complete"):
        # The analytics run once the whole backfill is in: one aggregation window = the range.
        jobs[name]["config"] = {
            "size": plan.to_block - plan.from_block + 1,
            "origin": plan.from_block,
        }
    return str(yaml.safe_dump(dag, sort_keys=False))
