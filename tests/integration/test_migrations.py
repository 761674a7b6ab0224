"""The migration runner: ordered, once each, safe when run concurrently, refuses edited history."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.support.servers import empty_database
from trace_platform.db import migrate as mig


@pytest.fixture
def empty_db(pg_server: str) -> Iterator[str]:
    with empty_database(pg_server) as db:
        yield db


def test_concurrent_migrations_apply_each_once(empty_db: str) -> None:
    results: list[list[str]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(mig.migrate(empty_db))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    versions = [m.version for m in mig.available()]
    assert sorted(v for r in results for v in r) == versions  # all applied, exactly once
    assert mig.migrate(empty_db) == []


def test_edited_migration_is_refused(empty_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    mig.migrate(empty_db)
    original = mig.available()
    edited = [
        mig.Migration(original[0].version, original[0].name, original[0].sql + "\n-- edit"),
        *original[1:],
    ]
    monkeypatch.setattr(mig, "available", lambda: edited)
    with pytest.raises(mig.MigrationError, match="changed after it was applied"):
        mig.migrate(empty_db)
