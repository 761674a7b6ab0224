"""The sink's upsert on a real Postgres (store/sink.py): a batch of new keys goes in by one
COPY straight into the table; one holding a stored key (published twice, retried, repeated
within itself) falls back to the staged ON CONFLICT path with every row of the batch, however
far the direct COPY got, and counts only the rows that were new."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from trace_platform.store import sink as sink_sql

COLUMNS = [{"name": "k", "type": "text"}, {"name": "amount", "type": "uint256"}]
NAMES = ["org_id", "k", "amount", "record_id"]
ORG, RECORD = uuid.uuid4(), uuid.uuid4()


@pytest.fixture
def conn(dsn: str) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    table = f"dataset_{uuid.uuid4().hex}.rows"
    with psycopg.connect(dsn, autocommit=True) as c:
        with c.transaction():
            sink_sql.ensure_table(c, table, COLUMNS, ["k"])
        yield c, table


def _load(c: psycopg.Connection[Any], table: str, rows: list[tuple[str, int]]) -> int:
    with c.transaction():
        return sink_sql.upsert(c, table, ["k"], NAMES, ([ORG, k, a, RECORD] for k, a in rows))


def _stored(c: psycopg.Connection[Any], table: str) -> list[tuple[str, str]]:
    schema, _, name = table.partition(".")
    q = sql.SQL("SELECT k, amount::text FROM {} ORDER BY k").format(sql.Identifier(schema, name))
    return [(k, a) for k, a in c.execute(q).fetchall()]


def test_new_keys_go_in_by_one_copy_and_count(
    conn: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, table = conn
    big = 2**256 - 1

    def no_stage(*_: Any) -> int:
        raise AssertionError("new keys went through the staging table")

    monkeypatch.setattr(sink_sql, "_staged", no_stage)
    assert _load(c, table, [("a", 1), ("b", big)]) == 2
    assert _stored(c, table) == [("a", "1"), ("b", str(big))]


@pytest.mark.parametrize(
    "batch",
    [
        [("a", 9), ("c", 3)],  # "a" stored: the conflict on the first row
        [("c", 3), ("d", 4), ("a", 9), ("e", 5)],  # on a middle row: the rest still land
        [("c", 3), ("c", 7), ("d", 4)],  # a key twice in the batch itself
    ],
)
def test_a_stored_or_repeated_key_falls_back_with_every_row(
    conn: tuple[Any, str], batch: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, table = conn
    assert _load(c, table, [("a", 1), ("b", 2)]) == 2
    staged: list[int] = []
    real = sink_sql._staged

    def counted(*args: Any) -> int:
        staged.append(1)
        return real(*args)

    monkeypatch.setattr(sink_sql, "_staged", counted)
    new = {k for k, _ in batch} - {"a", "b"}
    assert _load(c, table, batch) == len(new)
    got = dict(_stored(c, table))
    assert got["a"] == "1"  # a stored key keeps its row
    assert set(got) == {"a", "b", *new}
    assert got.get("c") in (None, "3")  # the first of a repeated key wins
    assert _load(c, table, batch) == 0  # the same batch again: nothing new
    assert staged == [1, 1]


def test_a_value_the_table_refuses_is_not_taken_for_a_conflict(conn: tuple[Any, str]) -> None:
    c, table = conn
    with pytest.raises(psycopg.errors.IntegrityError):  # the uint256 CHECK, not a fallback
        _load(c, table, [("a", 1), ("z", 2**256)])
    assert _stored(c, table) == []
