"""What an operator sees: its task (never the lease token), config, its slot's env, a store
scoped to its inputs and outputs, and a way to emit events."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trace_platform import layout
from trace_platform.contract import EventIn, OutputCommit, TaskPayload
from trace_platform.objectstore import ObjectStore


@dataclass
class OperatorResult:
    """What an operator returns: final events (sent atomically with the completion) and the
    output pieces it committed (attempt-fenced by the Dispatcher)."""

    events: list[EventIn] = field(default_factory=list)
    outputs: list[OutputCommit] = field(default_factory=list)
    state: dict[str, Any] | None = None  # the job's new durable state, saved on success


class OperatorError(Exception):
    """A failure worth retrying (the default for any exception)."""

    retryable = True


class PermanentError(OperatorError):
    """A failure no retry can fix (bad config, bad input): the task fails at once."""

    retryable = False


@dataclass
class OperatorContext:
    task: TaskPayload
    workdir: Path
    _send: Callable[[dict[str, Any]], None]
    # The slot's env vars and secrets for this task only (never the host's os.environ, so
    # nothing of one task reaches the next, nor the Spark JVM's environment).
    env: dict[str, str] = field(default_factory=dict)
    _store: ObjectStore | None = None
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("trace.operator"))
    _spark: Any = None
    # A Spark Connect URL (sc://): the task's data work runs on that cluster, whose executors
    # read and write the object store themselves (trace_platform.spark.objects).
    spark_remote: str | None = None
    _batches: int = 0

    @property
    def config(self) -> dict[str, Any]:
        return self.task.config

    def emit(self, event: EventIn | dict[str, Any]) -> None:
        """Emit an event now (mid-task); the wrapper forwards it, attempt-fenced."""
        ev = event if isinstance(event, EventIn) else EventIn.model_validate(event)
        self._send({"type": "event", "event": ev.model_dump(mode="json")})

    @property
    def store(self) -> ObjectStore:
        """The object store, scoped to this task's inputs (read) and outputs (read, write)."""
        if self._store is None:
            raise RuntimeError("this context has no object store")
        return self._store

    @property
    def spark(self) -> Any:
        """This task's own Spark session (conf, temp views, functions) on the host's
        long-lived JVM; ended with the task."""
        if self._spark is None:
            from trace_platform.spark import task_session

            self._spark = task_session(self.spark_remote)
        return self._spark

    def close(self) -> None:
        if self._spark is not None:
            from trace_platform.spark import end_task

            end_task(self._spark)
            self._spark = None

    @property
    def buffer_prefix(self) -> str:
        """Where this attempt writes batches for buffered datasets (its own keys only)."""
        return layout.buffer_prefix(self.task.org_id, self.task.task_id, self.task.attempt)

    def publish_rows(
        self,
        dataset: str,
        rows: Iterable[dict[str, Any]],
        *,
        max_rows: int | None = None,
        max_bytes: int | None = None,
    ) -> list[str]:
        """Writes `rows` as JSONL batches under the attempt's buffer prefix and asks the
        wrapper to publish each to buffered dataset `dataset` (the job must be one of its
        writers); the trusted sink loads them. One batch, or as many as keep each within
        `max_rows` rows and `max_bytes` bytes (the dataset's bounds: the sink refuses a batch
        over them whole). Returns the batches' keys."""
        keys: list[str] = []
        lines: list[bytes] = []
        size = 0
        for r in rows:
            line = (json.dumps(r, separators=(",", ":"), default=str) + "\n").encode()
            full = (max_rows is not None and len(lines) >= max_rows) or (
                max_bytes is not None and size + len(line) > max_bytes
            )
            if lines and full:
                keys.append(self._put_batch(dataset, lines))
                lines, size = [], 0
            lines.append(line)
            size += len(line)
        if lines or not keys:
            keys.append(self._put_batch(dataset, lines))
        return keys

    def _put_batch(self, dataset: str, lines: list[bytes]) -> str:
        self._batches += 1
        key = f"{self.buffer_prefix}batch-{self._batches:05d}.jsonl"
        self.store.put(key, b"".join(lines))
        self.publish_batch(dataset, key)
        return key

    def publish_batch(self, dataset: str, key: str) -> None:
        """Publishes a batch this attempt already wrote (`.jsonl` or `.parquet`, under
        `buffer_prefix`) to buffered dataset `dataset`."""
        self._send({"type": "buffer", "buffer": {"dataset": dataset, "location": key}})

    def progress(self, **values: Any) -> None:
        """Progress shown with the task; sent with the next heartbeat."""
        self._send({"type": "progress", "progress": values})
