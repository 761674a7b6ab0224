"""One transaction's calls on the in-memory tables: each does what its named query does."""

from __future__ import annotations

from trace_platform.store.tasks.memory.commit_calls import CommitCalls
from trace_platform.store.tasks.memory.lease_calls import LeaseCalls
from trace_platform.store.tasks.memory.outbox_calls import OutboxCalls
from trace_platform.store.tasks.memory.pool_calls import PoolCalls
from trace_platform.store.tasks.memory.task_calls import TaskCalls


class MemoryTx(TaskCalls, LeaseCalls, OutboxCalls, PoolCalls, CommitCalls):
    """One transaction's calls on the store's tables (see the package docstring). One module
    per group of named queries (tasks, the lease, the outbox, pools, commits and reads), as the
    SQL files' sections group them; what they share is `TxBase`."""
