"""The worker fleet as a user sees it: org admins only (hosts, versions and load are the
platform's, not one tenant's). `trace workers list` and `GET /v1/workers` both call this."""

from __future__ import annotations

from trace_platform.contract_fleet import WorkerState, WorkerView
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.fleet import WorkerRegistry
from trace_platform.identity import Actor, require_admin


def list_workers(
    dispatcher: Dispatcher, actor: Actor, state: WorkerState | None = None, limit: int = 100
) -> list[WorkerView]:
    """Registered workers, alive first, newest first (ended ones are kept a week)."""
    require_admin(actor, "list the workers")
    return WorkerRegistry(dispatcher).list(state, limit)
