from __future__ import annotations

import pytest

from trace_platform.db.queries import Queries, load


@pytest.mark.parametrize("group", ["queue", "dispatcher", "outbox"])
def test_every_named_query_loads(group: str) -> None:
    queries = load(group)
    assert queries
    for name, sql in queries.items():
        assert sql and not sql.endswith(";"), name
        assert "-- name:" not in sql


def test_unknown_query_names_the_file() -> None:
    with pytest.raises(AttributeError, match=r"db/sql/queue.sql"):
        _ = Queries("queue").nonexistent
