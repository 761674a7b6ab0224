"""What a running attempt reports: events (deduplicated; each new one creates the tasks it
starts, in the same transaction) and output commits. A task speaks only for its own outputs."""

from __future__ import annotations

import uuid
from collections.abc import Set as AbstractSet
from typing import Any
from uuid import UUID

from trace_platform import layout
from trace_platform.contract import EventIn, EventsRequest, EventsResponse, OutputCommit
from trace_platform.dispatcher import access
from trace_platform.dispatcher.fencing import fenced, reject_finished, reject_withdrawn
from trace_platform.dispatcher.intents import Intents
from trace_platform.errors import Forbidden
from trace_platform.store.tasks import NewCommit, NewEvent, StateStore, StoreTx


def check_outputs(st: dict[str, Any], dataset_uuids: list[UUID], what: str) -> dict[str, Any]:
    """A task speaks only for the datasets its own job produces in its dag_version (fixed
    when the task was created); a task with no outputs can emit and commit nothing."""
    outputs = {o["dataset_uuid"]: o for o in st["outputs"]}
    for ds in dataset_uuids:
        if str(ds) not in outputs:
            raise Forbidden(
                f"{what} names dataset {ds}, which task {st['task_id']} does not produce "
                f"(its outputs: {', '.join(outputs) or 'none'})"
            )
    return outputs


def assigned_version(st: dict[str, Any], out: dict[str, Any], c: OutputCommit) -> UUID:
    """The version a commit lands in: the one the Dispatcher assigned the task's output, which
    the commit may only confirm (another version, even of the same dataset, is not its own)."""
    version = out.get("dataset_version")
    if version is None:
        raise Forbidden(
            f"an output commit for dataset {c.dataset_uuid}: task {st['task_id']} was assigned "
            "no version of it to write"
        )
    if c.dataset_version is not None and str(c.dataset_version) != str(version):
        raise Forbidden(
            f"an output commit names version {c.dataset_version} of dataset {c.dataset_uuid}; "
            f"task {st['task_id']} writes only its assigned version {version}"
        )
    return UUID(str(version))


def check_location(st: dict[str, Any], attempt: int, out: dict[str, Any], c: OutputCommit) -> None:
    """A committed location is the one the Dispatcher computes for this attempt and scope: the
    version's own table (Postgres), or the attempt's own keys under the version's prefix
    (`layout.scope_prefix`). Readers and the collector act on it, so it is never taken as
    sent."""
    if c.location is None:  # a scope with nothing to read
        return
    assigned = out.get("location")
    if assigned is None:
        raise Forbidden(
            f"an output commit names location {c.location!r}: task {st['task_id']} was "
            f"assigned none for dataset {c.dataset_uuid}"
        )
    if out.get("backend") == "postgres":
        want = str(assigned)
        rule = "the version's own table"
    else:
        try:
            want = layout.scope_prefix(
                str(assigned),
                UUID(str(st["task_id"])),
                attempt,
                rng=c.range,
                partition_key=c.partition_key,
            )
        except ValueError as e:
            raise Forbidden(f"an output commit's scope: {e}") from None
        rule = "this attempt's own prefix for the scope"
    if c.location != want:
        raise Forbidden(
            f"an output commit names location {c.location!r}; task {st['task_id']} attempt "
            f"{attempt} may commit {c.scope} of dataset {c.dataset_uuid} only at {want!r} "
            f"({rule})"
        )


def check_event_location(
    st: dict[str, Any], attempt: int, out: dict[str, Any], ev: EventIn
) -> None:
    """An event's payload `location` is where a reader fetched before the commit lands looks
    (`operators.inputs.scope_location`): the same one place its commit may name."""
    location = ev.payload.get("location") if isinstance(ev.payload, dict) else None
    if location is None:
        return
    if not isinstance(location, str):
        raise Forbidden(f"an event's payload location must be a string, not {location!r}")
    as_commit = OutputCommit.model_construct(  # checked here, not by the model's bounds
        dataset_uuid=ev.dataset_uuid,
        partition_key=ev.partition_key,
        range=ev.range,
        location=location,
    )
    check_location(st, attempt, out, as_commit)


def check_commits(
    st: dict[str, Any], attempt: int, commits: list[OutputCommit]
) -> list[tuple[OutputCommit, UUID]]:
    """Every commit against what was assigned (its dataset, version and location); each with
    the version it lands in. Any mismatch refuses the whole completion: nothing is stored."""
    outputs = check_outputs(st, [c.dataset_uuid for c in commits], "an output commit")
    checked = []
    for c in commits:
        out = outputs[str(c.dataset_uuid)]
        version = assigned_version(st, out, c)
        check_location(st, attempt, out, c)
        checked.append((c, version))
    return checked


def purged_outputs(tx: StoreTx, checked: list[tuple[OutputCommit, UUID]]) -> list[str]:
    """The output versions these checked commits (`check_commits`) land in that an admin
    purged since the task was made."""
    wanted = {str(v) for _, v in checked}
    if not wanted:
        return []
    return sorted(wanted - tx.existing_versions(sorted(wanted)))


def commit_outputs(
    tx: StoreTx, st: dict[str, Any], attempt: int, checked: list[tuple[OutputCommit, UUID]]
) -> set[tuple[str, str]]:
    """Lands commits already checked (`check_commits`, each with its version); returns the
    (dataset, scope) pairs of `replace` outputs that rewrote an earlier commit: the events for
    those scopes are invalidations."""
    rewritten: set[tuple[str, str]] = set()
    for c, version in checked:
        strategy = tx.insert_commit(
            NewCommit(
                commit_id=uuid.uuid4(),
                dataset_uuid=c.dataset_uuid,
                dataset_version=version,
                task_id=st["task_id"],
                attempt=attempt,
                scope=c.scope,
                partition_key=c.partition_key,
                range_start=c.range.start if c.range else None,
                range_end=c.range.end if c.range else None,
                location=c.location,
                row_count=c.row_count,
                byte_count=c.byte_count,
                dag_version=st.get("dag_version"),
                chain_id=c.chain.chain_id if c.chain else None,
                first_block_hash=c.chain.first_hash if c.chain else None,
                last_block_hash=c.chain.last_hash if c.chain else None,
                parent_hash=c.chain.parent_hash if c.chain else None,
            )
        )
        if strategy == "replace":
            rewritten.add((str(c.dataset_uuid), c.scope))
    return rewritten


class Emitter:
    """Stores an attempt's events; each new one creates the tasks it starts."""

    def __init__(self, store: StateStore, intents: Intents) -> None:
        self.store = store
        self.intents = intents

    def insert(
        self,
        tx: StoreTx,
        st: dict[str, Any],
        attempt: int,
        events: list[EventIn],
        rewritten: AbstractSet[tuple[str, str]] = frozenset(),
    ) -> tuple[list[UUID], int, int]:
        """Stores new events and, in the same transaction, creates the tasks they start. An
        event for a scope this attempt rewrote (`rewritten`, from `commit_outputs`) reaches its
        readers as an invalidation: what they built from that scope before is stale."""
        if not events:
            return [], 0, 0
        outputs = check_outputs(st, [e.dataset_uuid for e in events], "an event")
        for ev in events:
            check_event_location(st, attempt, outputs[str(ev.dataset_uuid)], ev)
        return self.start(tx, st, attempt, events, rewritten)

    def start(
        self,
        tx: StoreTx,
        producer: dict[str, Any],
        attempt: int,
        events: list[EventIn],
        rewritten: AbstractSet[tuple[str, str]] = frozenset(),
    ) -> tuple[list[UUID], int, int]:
        """Stores events the caller has checked (`insert`'s, or the sink's for a buffered
        dataset) under their producing task (`producer`: its status row's task_id, org_id,
        start_day, dag_id and outputs) and creates the tasks they start, in `tx`."""
        ids = tx.insert_events(
            [
                NewEvent(
                    event_id=uuid.uuid4(),
                    start_day=producer["start_day"],
                    org_id=producer["org_id"],
                    task_id=producer["task_id"],
                    attempt=attempt,
                    dataset_uuid=ev.dataset_uuid,
                    dedupe_key=ev.dedupe_key,
                    cursor=ev.cursor,
                    partition_key=ev.partition_key,
                    range_start=ev.range.start if ev.range else None,
                    range_end=ev.range.end if ev.range else None,
                    payload=ev.payload,
                )
                for ev in events
            ]
        )
        accepted: list[UUID] = []
        created = 0
        for ev, event_id in zip(events, ids, strict=True):
            if event_id is None:  # a duplicate returns nothing and starts nothing
                continue
            accepted.append(event_id)
            invalidates = (str(ev.dataset_uuid), ev.dedupe_key) in rewritten
            specs = list(
                tx.tasks_for_event(
                    org_id=producer["org_id"],
                    producer=producer,
                    event_id=event_id,
                    event=ev,
                    invalidates=invalidates,
                )
            )
            refs = self.intents.create_tasks(specs, tx)
            for (spec, _), ref in zip(specs, refs, strict=True):
                if spec.dag_id != producer["dag_id"]:  # a shared read: may its DAG read it?
                    access.fail_if_refused(tx, ref.task_id)
            created += len(refs)
        return accepted, len(events) - len(accepted), created

    def emit(self, req: EventsRequest) -> EventsResponse:
        """Events reported while the attempt runs (`/internal/events`)."""
        with self.store.transaction() as tx:
            tx.lock_task_dag_shared(req.task_id)
            st = fenced(tx, req)
            reject_finished(st, req)
            reject_withdrawn(st, req)
            ids, dups, created = self.insert(tx, st, req.attempt, req.events)
        return EventsResponse(
            accepted=len(ids), duplicates=dups, event_ids=ids, tasks_created=created
        )
