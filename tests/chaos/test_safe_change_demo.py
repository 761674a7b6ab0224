"""Safe change on the whole stack: the demo DAG on a devnet, real workers and Spark. Editing the
decode job rebuilds only it and its downstream while queries keep answering exactly the
pre-deploy answers, then exactly the new ones (never a mix); a range that arrives during a
rebuild is held and processed once on the new version; a rollback restores the answers at
once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.dags import admin, finished_run
from tests.support.devnet import egress_to
from tests.support.wait import wait_for
from trace_platform.chain import Rpc, calldata
from trace_platform.config import Settings
from trace_platform.devnet import ChainSpec, Devnet
from trace_platform.lite.demo import saved_rows
from trace_platform.lite.stack import LiteStack
from trace_platform.services import Services

pytestmark = pytest.mark.slow
SPEC = ChainSpec(seed=5, blocks=300, accounts=30, validators=3, epoch_blocks=50)
DEMO = Path(__file__).resolve().parents[2] / "examples" / "dags" / "monad_demo.yaml"
NOWHERE = "0x000000000000000000000000000000000000dead"
# One statement over the decoded dataset and both analytics built from it: a reader that saw
# versions of different deploys at once would get a combination no deploy ever produced.
PROBE = (
    "SELECT (SELECT count(*) FROM erc20_transfers), (SELECT count(*) FROM token_supply), "
    "(SELECT max(total_supply) FROM token_supply), (SELECT count(*) FROM token_balances), "
    "(SELECT count(*) FROM staking_events)"
)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    d = Devnet(tmp_path_factory.mktemp("devnet"))
    info, c = d.up(SPEC)
    with egress_to(info.url):
        yield info.url, c.token
    d.down()


def demo(url: str, token: str | None = None) -> str:
    text = (
        DEMO.read_text()
        .replace("http://127.0.0.1:8545", url)
        .replace("window_blocks: 500", "window_blocks: 120")
        .replace("window_blocks: 100", "window_blocks: 50")
        .replace("size: 2000", "size: 100")
    )
    if token is not None:
        text = text.replace(
            "    operator: decode_erc20_transfers\n",
            f"    operator: decode_erc20_transfers\n    config: {{token_address: '{token}'}}\n",
        )
    return text


def probe(svc: Services) -> tuple[Any, ...]:
    return tuple(svc.query.query(admin(svc), PROBE).as_json()["rows"][0])


def active_work(svc: Services) -> int:
    with svc.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM task_status WHERE status IN ('queued', 'running')"
        ).fetchone()
    return int(row["n"]) if row else 0


def scopes(svc: Services, job: str, version: int) -> list[tuple[str, str]]:
    with svc.pool.connection() as conn:
        rows = conn.execute(
            "SELECT r.input_event -> 'range' ->> 'start' AS start, s.status "
            "FROM task_registry r JOIN task_status s USING (task_id, start_day) "
            "WHERE r.job = %s AND r.dag_version = %s ORDER BY 1, 2",
            (job, version),
        ).fetchall()
    return [(r["start"], r["status"]) for r in rows]


class Prober:
    """Queries in a loop on its own thread, recording every answer."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.seen: list[tuple[Any, ...]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.seen.append(probe(self.svc))
            time.sleep(0.05)

    def __enter__(self) -> Prober:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def test_a_deploy_rebuilds_beside_live_data_and_cuts_over_without_a_hole_or_a_mix(
    settings: Settings, dsn: str, chain: tuple[str, str]
) -> None:
    url, token = chain
    rpc = Rpc(url)
    with LiteStack(
        settings, workers=2, dsn=dsn, worker_env={"TRACE_QUEUE_POLL_SECONDS": "0.2"}
    ) as stack:
        svc, me = stack.services, admin(stack.services)
        svc.control.deploy(me, demo(url), str(DEMO))
        run = svc.control.trigger(
            me, "monad_demo", config={"from_block": 0, "to_block": 199, "chunk_size": 100}
        )["run_id"]
        assert all(t["status"] == "succeeded" for t in finished_run(svc, run, 600))
        wait_for(lambda: active_work(svc) == 0 or None, 120, "version 1 idle")
        before = probe(svc)
        assert before[0] > 0 and before[1] > 0 and before[4] > 0

        # v2: decode only a token that does not exist. Only decode and its downstream rebuild.
        with Prober(svc) as p:
            res = svc.control.deploy(me, demo(url, NOWHERE), str(DEMO))
            assert res.rebuilt_jobs == [
                "large_transfers",  # the demo's alert rule over the decoded transfers
                "token_balances",
                "token_supply",
                "transfers",
                "transfers_complete",
            ]
            assert not res.live and res.replays["transfers"].tasks == 2
            wait_for(
                lambda: svc.control.show_dag(me, "monad_demo")["active_version"] == 2 or None,
                600,
                "cutover to version 2",
            )
            after = probe(svc)
            time.sleep(1)  # a few answers after the cutover too
        assert after[0] == after[1] == after[3] == 0 and after[2] is None
        assert after[4] == before[4]  # staking was not rebuilt: same data throughout
        assert set(p.seen) == {before, after}, sorted(set(p.seen) - {before, after})
        assert p.seen.index(after) > 0 and p.seen[-1] == after
        assert [s for _, s in scopes(svc, "staking", 2)] == []  # unaffected: never re-run

        # v3: decode every token again, cut over by hand, while a new range arrives: the
        # rebuild holds it and processes it once on version 3 after the cutover.
        res = svc.control.deploy(me, demo(url), str(DEMO), manual_cutover=True)
        assert res.manual_cutover and res.replays["transfers"].tasks == 2
        run = svc.control.trigger(
            me, "monad_demo", config={"from_block": 200, "to_block": 299, "chunk_size": 100}
        )["run_id"]

        def ready() -> bool | None:
            st = svc.control.changes.status(me, "monad_demo")["rebuild"]
            held = [s for s in scopes(svc, "transfers", 3) if s[1] == "buffered"]
            idle = active_work(svc) == 0  # the live version done with the new range too
            return (st["blocked_by"] is None and held == [("200", "buffered")] and idle) or None

        wait_for(ready, 600, "version 3 rebuilt, with the new range held")
        # Until the cutover, the rebuilt datasets answer as version 2; staking (not rebuilt)
        # already has the new range: the live version kept processing.
        assert probe(svc)[:4] == after[:4] and probe(svc)[4] > after[4]
        assert scopes(svc, "transfers", 2)[-1] == ("200", "succeeded")  # v2 stayed fresh
        cut = svc.control.changes.cutover(me, "monad_demo")
        assert (cut["version"], cut["released"]) == (3, 1)
        wait_for(lambda: active_work(svc) == 0 or None, 600, "version 3 drained")
        assert scopes(svc, "transfers", 3) == [
            ("0", "succeeded"),
            ("100", "succeeded"),
            ("200", "succeeded"),
        ]
        supply = {
            r["block_number"]: int(r["total_supply"])
            for r in saved_rows(svc, me, "token_supply", token=token)
        }
        for b in (50, 150, 199, 250, 299):
            assert supply[b] == rpc.eth_call(token, calldata("totalSupply()"), b), b

        # Rollback right after the cutover: version 2's answers at once, and nothing of
        # version 3 lands afterwards.
        final = probe(svc)
        back = svc.control.changes.rollback(me, "monad_demo")
        assert (back["version"], back["rolled_back"]) == (2, 3)
        assert probe(svc)[:4] == (0, 0, None, 0)
        wait_for(lambda: active_work(svc) == 0 or None, 600, "version 2 caught up")
        with svc.pool.connection() as conn:
            late = conn.execute(
                "SELECT count(*) AS n FROM dataset_commits WHERE dag_version = 3 "
                "AND created_at > (SELECT activated_at FROM dag_versions v JOIN dags d "
                "USING (dag_id) WHERE d.name = 'monad_demo' AND v.version = 2)"
            ).fetchone()
        assert late is not None and late["n"] == 0
        forward = svc.control.changes.rollback(me, "monad_demo", to=3)
        assert forward["version"] == 3 and probe(svc) == final
