"""The one owner of the dispatcher's state: a narrow protocol (`protocol.py`), its typed
parameters (`params.py`), the Postgres store and its in-memory twin."""

from trace_platform.store.tasks.params import (
    AttemptEnd,
    ClaimManyParams,
    ClaimParams,
    FreedSlot,
    HeartbeatParams,
    LeaseCheck,
    NewCommit,
    NewEvent,
    NewTask,
    PoolJob,
    PoolKey,
    ReadsParams,
    RetryParams,
    RunRetryParams,
    SlotLeaseParams,
    StateKey,
    TaskKey,
    Wakeup,
)
from trace_platform.store.tasks.protocol import Row, StateStore, StoreTx

__all__ = [
    "AttemptEnd",
    "ClaimManyParams",
    "ClaimParams",
    "FreedSlot",
    "HeartbeatParams",
    "LeaseCheck",
    "NewCommit",
    "NewEvent",
    "NewTask",
    "PoolJob",
    "PoolKey",
    "ReadsParams",
    "RetryParams",
    "Row",
    "RunRetryParams",
    "SlotLeaseParams",
    "StateKey",
    "StateStore",
    "StoreTx",
    "TaskKey",
    "Wakeup",
]
