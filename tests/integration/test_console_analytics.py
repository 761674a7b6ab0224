"""The console's Monad analytics page and its Parquet export, over a real API (keys required)
and the harness's Postgres: the platform DAG's datasets seeded as committed Parquet (no
pipeline), the saved queries run through the Query Service as the logged-in user."""

from __future__ import annotations

import io
import uuid

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from tests.support.console import console, inline_problems, post
from tests.support.dags import admin, user
from tests.support.datasets import commit_parquet
from tests.support.servers import admin_key
from trace_platform.console.web import CSP
from trace_platform.identity import create_key, ensure_user
from trace_platform.registry.reserved import PLATFORM_DAG
from trace_platform.services import Services

TOKEN = "0x" + "ab" * 20
HOLDERS = ("0x" + "11" * 20, "0x" + "22" * 20)
# Numbers that appear nowhere else on a page: seen only when the analytics were read.
SUPPLY = (7_000_001, 9_000_002)
STAKE = 4_400_004
DATASETS = ("blocks", "token_supply", "token_balances", "staking_concentration")


def platform_dag() -> str:
    """The platform's DAG publishing what the analytics read (its jobs never run here)."""
    jobs = "".join(
        f"  {d}: {{operator: noop, outputs: [{{backend: parquet}}]}}\n" for d in DATASETS
    )
    publish = "".join(f"  - {{job: {d}, output_index: 0, dataset: {d}}}\n" for d in DATASETS)
    return f"name: {PLATFORM_DAG}\njobs:\n{jobs}publish:\n{publish}"


@pytest.fixture
def demo(secure: tuple[Services, str]) -> tuple[Services, str]:
    """Blocks 0-9 of a token minted at block 2 (to the first holder) and block 5 (to the
    second), and two staking periods."""
    svc, url = secure
    svc.control.deploy(admin(svc), platform_dag())
    i64 = pa.int64()
    tables = {
        "blocks": pa.table({"block_number": pa.array(range(10), i64)}),
        "token_supply": pa.table(
            {
                "token_address": [TOKEN, TOKEN],
                "block_number": pa.array([2, 5], i64),
                "total_supply": pa.array(SUPPLY, i64),
            }
        ),
        "token_balances": pa.table(
            {
                "token_address": [TOKEN, TOKEN],
                "account": list(HOLDERS),
                "block_number": pa.array([2, 5], i64),
                "balance": pa.array([SUPPLY[0], SUPPLY[1] - SUPPLY[0]], i64),
            }
        ),
        "staking_concentration": pa.table(
            {
                "window_end": pa.array([4, 9], i64),
                "epoch": pa.array([0, 1], i64),
                "validators": pa.array([2, 3], i64),
                "total_stake": pa.array([STAKE, STAKE * 2], i64),
                "hhi": [0.5, 0.34],
                "nakamoto_coefficient": pa.array([1, 2], i64),
                "top_share": [0.5, 0.4],
            }
        ),
    }
    for name, table in tables.items():
        commit_parquet(svc, name, table, 0, 10)
    return svc, url


def test_the_analytics_page_shows_each_analytic_as_a_table_and_a_chart(
    demo: tuple[Services, str],
) -> None:
    svc, url = demo
    with console(url, admin_key(svc)) as c:
        page = c.get("/console/analytics")  # the token: the one with the largest supply
        assert page.status_code == 200, page.text
        assert page.headers["content-security-policy"] == CSP
        assert inline_problems(page.text) == []
        text = page.text
        assert "not available" not in text, text
        assert f'value="{TOKEN}"' in text and 'href="/console/analytics"' in text
        # (1) Supply by block: carried forward over every block (10 blocks: a step of 1).
        assert text.count(f"<td>{SUPPLY[1]}</td>") == 5 and text.count(f"<td>{SUPPLY[0]}</td>") >= 3
        assert "Total supply by block" in text and 'class="series"' in text
        # (2) The top holders (the first holds more) as bars, and each one's balance history.
        assert text.index(f"<td>{HOLDERS[0]}</td>") < text.index(f"<td>{HOLDERS[1]}</td>")
        assert 'class="bar"' in text and f"Balance of {HOLDERS[0]}" in text
        assert f'<th scope="col">{HOLDERS[1]}</th>' in text  # one column per holder
        # (3) Staking concentration per period.
        assert f"<td>{STAKE * 2}</td>" in text and "Nakamoto coefficient per period" in text
        # The form's parameters: one holder, every 5th block (0, 5 and the last, 9).
        one = c.get("/console/analytics", params={"token": TOKEN, "n": "1", "every": "5"}).text
        assert HOLDERS[1] not in one and f"Balance of {HOLDERS[0]}" in one
        assert one.count(f"<td>{SUPPLY[1]}</td>") == 2 and 'value="5"' in one
        bad = c.get("/console/analytics", params={"token": "nope", "n": "x"})
        assert bad.status_code == 200 and bad.text.count("give a token address") == 3
        assert f"<td>{STAKE}</td>" in bad.text  # staking needs no token


def test_without_the_datasets_or_their_read_role_each_analytic_is_not_available(
    demo: tuple[Services, str],
) -> None:
    svc, url = demo
    _, bob_key = user(svc, "bob")  # no role: the platform DAG's datasets are its deployers'
    other = uuid.uuid4()
    with svc.pool.connection() as conn, conn.transaction():
        conn.execute("INSERT INTO orgs (org_id, name) VALUES (%s, 'other')", (other,))
        eve_key = create_key(conn, ensure_user(conn, other, "eve", is_admin=True).user_id)
    for key in (bob_key, eve_key):  # eve's org has no demo run at all
        with console(url, key) as c:
            for params in ({}, {"token": TOKEN, "every": "1"}):
                page = c.get("/console/analytics", params=params)
                assert page.status_code == 200, page.text
                assert page.text.count("not available") == 4, page.text
                assert inline_problems(page.text) == []
                assert "<td>" not in page.text and "<svg" not in page.text
                for secret in (*SUPPLY, STAKE, *HOLDERS):
                    assert str(secret) not in page.text.replace(TOKEN, "")


def test_before_any_commit_each_analytic_says_it_has_no_data_yet(
    secure: tuple[Services, str],
) -> None:
    svc, url = secure
    svc.control.deploy(admin(svc), platform_dag())  # deployed, never run
    with console(url, admin_key(svc)) as c:
        page = c.get("/console/analytics", params={"token": TOKEN})
        assert page.status_code == 200, page.text
        # The Query Service's reason, per analytic.
        assert page.text.count("not available") == 4, page.text
        assert "dataset &#39;staking_concentration&#39; has no data yet" in page.text


def test_a_query_exported_as_parquet_holds_the_csvs_rows(demo: tuple[Services, str]) -> None:
    svc, url = demo
    sql = (
        "SELECT b.account, b.block_number, b.balance, s.total_supply "
        "FROM token_balances b JOIN token_supply s USING (block_number) ORDER BY b.account"
    )
    with console(url, admin_key(svc)) as c:
        assert 'formaction="/console/query.parquet"' in c.get("/console/query").text
        csv = post(c, "/console/query.csv", {"sql": sql})
        parquet = post(c, "/console/query.parquet", {"sql": sql})
        assert parquet.status_code == 200, parquet.text
        assert parquet.headers["content-type"] == "application/vnd.apache.parquet"
        assert parquet.headers["content-disposition"] == 'attachment; filename="query.parquet"'
        table = pq.read_table(io.BytesIO(parquet.content))
        from_csv = pcsv.read_csv(io.BytesIO(csv.content))
        assert table.column_names == from_csv.column_names
        assert table.to_pylist() == from_csv.to_pylist()
        assert table.to_pylist() == [
            {
                "account": HOLDERS[0],
                "block_number": 2,
                "balance": SUPPLY[0],
                "total_supply": SUPPLY[0],
            },
            {
                "account": HOLDERS[1],
                "block_number": 5,
                "balance": SUPPLY[1] - SUPPLY[0],
                "total_supply": SUPPLY[1],
            },
        ]
        # The query page's limits: the Query Service's row cap refuses as it does for CSV.
        too_many = f"SELECT * FROM range({svc.settings.query_max_rows + 1})"
        for fmt in ("csv", "parquet"):
            assert post(c, f"/console/query.{fmt}", {"sql": too_many}).status_code == 422, fmt
    _, bob_key = user(svc, "bob")
    with console(url, bob_key) as c:
        refused = post(c, "/console/query.parquet", {"sql": sql})
        assert refused.status_code == 404 and b"PAR1" not in refused.content
