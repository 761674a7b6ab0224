"""A pinned dataset: what a query reads for its whole run (built by catalog.pin in the API
process, sent to a query worker as JSON). Kept light: a worker imports it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID


@dataclass(frozen=True)
class Pin:
    """One dataset at the version a query reads for its whole run."""

    name: str
    dataset_uuid: UUID
    version: UUID
    backend: str
    files: tuple[str, ...] = ()  # Parquet: the committed files' URIs
    table: str | None = None  # Postgres: "schema.table" of the version, if it exists yet
    hot: Pin | None = None  # the dataset's hot window, served together with it
    hot_key: str | None = None

    @property
    def empty(self) -> bool:
        return not self.files and self.table is None

    def to_json(self) -> dict[str, Any]:
        """For the query worker (which gets the pinned plan, not the registry)."""
        return {
            "name": self.name,
            "dataset_uuid": str(self.dataset_uuid),
            "version": str(self.version),
            "backend": self.backend,
            "files": list(self.files),
            "table": self.table,
            "hot": self.hot.to_json() if self.hot is not None else None,
            "hot_key": self.hot_key,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Pin:
        return cls(
            name=str(d["name"]),
            dataset_uuid=UUID(d["dataset_uuid"]),
            version=UUID(d["version"]),
            backend=str(d["backend"]),
            files=tuple(str(f) for f in d["files"]),
            table=d["table"],
            hot=cls.from_json(d["hot"]) if d["hot"] is not None else None,
            hot_key=d["hot_key"],
        )
