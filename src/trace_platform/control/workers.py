"""The worker fleet as a user sees it: org admins only (hosts, versions and slots are the
platform's, not one tenant's), each worker's running tasks counted of the admin's org alone
(the workers are shared: another org's load is not for this one to see). `trace workers list`
and `GET /v1/workers` both call this."""

from __future__ import annotations

from trace_platform.contract_fleet import WorkerState, WorkerView
from trace_platform.dispatcher.core import Dispatcher
from trace_platform.dispatcher.fleet import WorkerRegistry
from trace_platform.identity import Actor, require_admin


def list_workers(
    dispatcher: Dispatcher, actor: Actor, state: WorkerState | None = None, limit: int = 100
) -> list[WorkerView]:
    """Registered workers, alive first, newest first (ended ones are kept a week), with the
    actor's org's running tasks on each."""
    require_admin(actor, "list the workers")
    return WorkerRegistry(dispatcher).list(actor.org_id, state, limit)
