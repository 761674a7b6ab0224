"""An attempt's set-up heartbeats (worker/attempt.py): a retake carries on its lease."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from trace_platform.contract import Claim
from trace_platform.worker.attempt import LeaseClock, SetupBeats


def claim(lease_seconds: float) -> Claim:
    return Claim(
        task_id=uuid.uuid4(),
        start_day=1,
        attempt=1,
        lease_token=uuid.uuid4(),
        lease_until=datetime.now(UTC) + timedelta(seconds=lease_seconds),
        heartbeat_seconds=5,
    )


def test_a_retake_carries_on_the_lease_clock_and_the_heartbeats() -> None:
    """The attempt's start again on a fresh host (its first host exited before it read the
    run) keeps the lease as its heartbeats moved it, and beats when the first start would
    have: not from the claim's own `lease_until`, long past by then."""
    c = claim(lease_seconds=-10)  # the claim's lease, renewed since by heartbeats
    renewed = LeaseClock(datetime.now(UTC) + timedelta(seconds=30))
    first: Any = SimpleNamespace(clock=renewed, beat_at=time.monotonic() + 0.5)
    retake = SetupBeats(None, c, 60.0, lambda: None, after=first)  # type: ignore[arg-type]
    assert retake.clock is renewed and retake.next_at == first.beat_at
    fresh = SetupBeats(None, claim(30), 60.0, lambda: None)  # type: ignore[arg-type]
    assert 25 < fresh.clock.left() <= 30 and fresh.next_at > time.monotonic() + 4
