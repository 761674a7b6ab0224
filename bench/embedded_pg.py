"""A bench's own Postgres: an embedded cluster in a fresh temporary directory, fsync on (real
commit costs; off at smoke size, where no figure is printed), migrated, destroyed on exit. Benches run as scripts import it from this folder."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import smoke  # this folder's
from trace_platform.db.embedded import EmbeddedPostgres
from trace_platform.db.migrate import migrate


@contextmanager
def migrated_postgres(prefix: str) -> Iterator[tuple[Path, str]]:
    """(a fresh directory for the bench's home, the migrated cluster's DSN)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    root.chmod(0o755)  # the cluster runs as the postgres user when this runs as root
    pg = EmbeddedPostgres(root / "pg", durable=smoke.durable())
    pg.start()
    try:
        dsn = pg.dsn()
        migrate(dsn)
        yield root, dsn
    finally:
        pg.destroy()
        shutil.rmtree(root, ignore_errors=True)  # the bench's home too (its object store's files)
