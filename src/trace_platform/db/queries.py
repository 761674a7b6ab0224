"""Named SQL queries loaded from `db/sql/*.sql` (procrastinate style: `-- name: x` blocks)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
# `{{_part}}` in a query stands for the block named `_part` (a fragment several queries share).
_PART = re.compile(r"\{\{(_\w+)\}\}")


@cache
def load(group: str) -> dict[str, str]:
    text = (resources.files("trace_platform.db") / "sql" / f"{group}.sql").read_text()
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [ln for ln in body.strip().splitlines() if not ln.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).strip().rstrip(";")
    return {name: _PART.sub(lambda m: queries[m[1]], q) for name, q in queries.items()}


class Queries:
    """Attribute access to one group's queries: `Queries("queue").receive`."""

    def __init__(self, group: str) -> None:
        self._q = load(group)
        self.group = group

    def __getattr__(self, name: str) -> str:
        try:
            return self._q[name]
        except KeyError:
            raise AttributeError(f"no query '{name}' in db/sql/{self.group}.sql") from None


def literal_limit(query: str, limit: int) -> str:
    """`query` with its `%(limit)s` written as a number. The Dispatcher's store transactions
    plan generically (store/tasks/postgres.py), and a generic plan takes `LIMIT $1` for a tenth
    of the rows: a newest-first listing then joins and sorts every row instead of reading the
    first few off an index. A constant keeps the plan a listing's."""
    if "%(limit)s" not in query:
        raise ValueError("the query has no %(limit)s")
    return query.replace("%(limit)s", str(int(limit)))
