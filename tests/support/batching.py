"""Making a worker's concurrent calls leave in one batch, as eight wrappers' do."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trace_platform.worker.batching import Batcher


@contextmanager
def one_batch(batcher: Batcher[Any, Any], callers: int) -> Iterator[None]:
    """Holds `batcher` as if a batch were in flight while the body starts `callers` calls,
    then hands the next batch to the oldest of them: they all leave together."""
    with batcher._lock:
        batcher._busy = True
    yield
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with batcher._lock:
            if len(batcher._pending) == callers:
                batcher._pending[0].wake.release()
                return
        time.sleep(0.001)
    raise AssertionError(f"{callers} callers never queued on the batcher")
