"""The Lambda invoker (`trace lambda-invoker`): the lambda runtime's counterpart of the worker
wrapper, and trusted as it is.

wake-up (the lambda queue, which no platform worker reads) -> claim the task through the
internal API with the worker credential (the same lease, attempt, reaper, timeout and retry
policy as a container job's) -> heartbeats while the function runs -> invoke it with the task's
payload -> judge its answer as an untrusted claim (`judge`) -> events, buffer publishes and the
completion through the same attempt-fenced calls as the wrapper -> ack the wake-up.

A failed invocation (timed out, crashed, refused) or an answer that is not a valid result fails
the attempt, and the Dispatcher retries it by the task's own policy. Lambda cannot be stopped
mid-invocation, so an answer that comes after its attempt lost its lease is still reported:
the Dispatcher lands it only while that attempt is the task's current one (fencing), so an
earlier invocation's late answer lands nothing once a later attempt started."""

from __future__ import annotations

import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError

from trace_platform.aws.invokers import Invoker, Reply
from trace_platform.aws.lambda_handler import MAX_PAYLOAD_BYTES, LambdaEvent, LambdaResult
from trace_platform.contract import Claim, TaskPayload
from trace_platform.queue import payloads
from trace_platform.queue.driver import Message, QueueDriver
from trace_platform.worker.attempt import LeaseClock, SetupBeats, within_lease
from trace_platform.worker.client import ApiError, DispatcherClient
from trace_platform.worker.membership import new_worker_id
from trace_platform.worker.reports import gist, one_line, send_report

log = logging.getLogger(__name__)


def judge(task: TaskPayload, reply: Reply) -> tuple[LambdaResult | None, dict[str, Any]]:
    """An invocation's end as the attempt reports it: the valid result (its events and buffer
    batches still to send), or None and the failure, saying why. Nothing the function answered
    is taken on trust: an answer over Lambda's 6 MB, not a LambdaResult, or naming an output
    the Dispatcher did not assign this attempt fails it."""
    if reply.body is None:
        why = reply.failure or "the invocation ended without an answer"
        return None, {"error": f"lambda invocation failed: {why}", "retryable": True}
    if len(reply.body) > MAX_PAYLOAD_BYTES:
        return None, {
            "error": f"lambda returned garbage: an answer of {len(reply.body):,} bytes, over "
            f"Lambda's {MAX_PAYLOAD_BYTES:,}",
            "retryable": True,
        }
    try:
        result = LambdaResult.model_validate_json(reply.body)
    except ValidationError as e:
        return None, {
            "error": f"lambda returned garbage, not a Trace result ({gist(e)}): "
            f"{one_line(reply.body[:200].decode(errors='replace'), 200)}",
            "retryable": True,
        }
    assigned = {o.dataset_uuid for o in task.outputs}
    stray = sorted({str(o.dataset_uuid) for o in result.outputs} - {str(a) for a in assigned})
    if stray:
        return None, {
            "error": "lambda result names output(s) not assigned to this attempt: "
            + ", ".join(stray),
            "retryable": False,
        }
    if result.outcome == "failed":
        error = result.error or "the handler reported a failure without a message"
        return result, {"error": error, "retryable": result.retryable}
    return result, {
        "final_events": result.final_events,
        "outputs": result.outputs,
        "operator_state": result.state,
        "operator_state_revision": task.operator_state_revision,
    }


class LambdaRunner:
    def __init__(
        self,
        driver: QueueDriver,
        client: DispatcherClient,
        invoker: Invoker,
        *,
        queue_name: str = "lambda",
        concurrency: int = 4,
        visibility_seconds: float = 60.0,
        wait_seconds: float = 2.0,
        worker_id: str | None = None,
    ) -> None:
        self.driver, self.client, self.invoker = driver, client, invoker
        self.queue_name = queue_name
        self.concurrency = concurrency
        self.visibility = visibility_seconds
        self.wait_seconds = wait_seconds
        # The CLI passes its registry membership's id; "lambda." says what claimed a task.
        self.worker_id = worker_id or new_worker_id(f"lambda.{socket.gethostname()}")
        self._free = threading.Semaphore(concurrency)
        self.invocations = 0  # started (tests and logs)

    def run(self, stop: threading.Event) -> None:
        """Takes wake-ups until `stop`; returns once every invocation begun has been reported
        (an invocation cannot be stopped: it is waited for)."""
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="lambda") as pool:
            while not stop.is_set():
                if not self._free.acquire(timeout=0.5):
                    continue
                took = 1
                while took < self.concurrency and self._free.acquire(blocking=False):
                    took += 1
                try:
                    msgs = self.driver.receive(
                        self.queue_name, took, self.visibility, self.wait_seconds
                    )
                except Exception:
                    log.exception("lambda invoker: receive failed")
                    msgs = []
                    stop.wait(1.0)
                for _ in range(took - len(msgs)):
                    self._free.release()
                for msg in msgs:
                    pool.submit(self._serve, msg)

    def _serve(self, msg: Message) -> None:
        try:
            self.handle(msg)
        except Exception as e:  # the lease runs out, and the reaper retries the attempt
            log.exception("lambda invoker: a wake-up's handling failed")
            self._nack(msg, f"invoker error: {e}")
        finally:
            self._free.release()

    def handle(self, msg: Message) -> None:
        """One wake-up: claimed, invoked and reported, then acked (or given back)."""
        try:
            wake = payloads.decode(msg.payload)
        except payloads.PayloadError as e:
            self._nack(msg, f"poison message: {e}")
            return
        if not isinstance(wake, payloads.TaskWakeup):
            self._nack(msg, f"not a task wake-up: kind={wake.kind}")
            return
        try:
            claim = self.client.claim(wake.task_id, self.worker_id)
        except ApiError as e:
            if e.status in (403, 404, 409):  # not claimable: the wake-up was only a hint
                self.driver.ack(self.queue_name, msg.receipt)
            else:
                self._nack(msg, f"claim failed: {e}", 1)
            return
        self.run_claimed(claim, msg)
        self.driver.ack(self.queue_name, msg.receipt)

    def run_claimed(self, claim: Claim, msg: Message) -> None:
        """The claimed attempt invoked and reported (`invoke`, then `report`)."""
        got = self.invoke(claim, msg)
        if got is not None:
            self.report(claim, *got)

    def invoke(self, claim: Claim, msg: Message) -> tuple[TaskPayload, Reply, LeaseClock] | None:
        """The function invoked for the attempt, its lease beaten meanwhile: the task, the
        invocation's end and the lease's clock (None: nothing to report, or reported already)."""
        task = claim.task if claim.task is not None else self.client.fetch(claim)
        if task.status == "canceled":
            send_report(self.client, claim, "canceled")
            return None
        if task.status != "running":  # reaped between claim and fetch: not ours to run
            return None
        if task.runtime != "lambda":
            # A wake-up on the lambda queue for another runtime's task (forged, or queued by
            # an older version): never run as a Lambda. Handed back (no try used); the
            # Dispatcher wakes it again on its own runtime's queue.
            error = f"a task of runtime {task.runtime} woken on the lambda queue: not invoked"
            send_report(self.client, claim, "released", error=error)
            return None
        self.invocations += 1
        with SetupBeats(self.client, claim, self.visibility, lambda: self._extend(msg)) as beats:
            env = dict(task.slot_env)
            if task.slot_secret_names:
                try:
                    env.update(self.client.secrets(claim))
                except ApiError as e:
                    if e.status in (403, 404):  # the deployer may no longer use a secret
                        send_report(self.client, claim, "failed", error=e.message, retryable=False)
                        return None
                    raise
            event = LambdaEvent(task=task, env=env).model_dump_json().encode()
            if len(event) > MAX_PAYLOAD_BYTES:
                error = (
                    f"the task's payload is {len(event):,} bytes, over Lambda's "
                    f"{MAX_PAYLOAD_BYTES:,} for an invocation"
                )
                send_report(self.client, claim, "failed", beats.clock, error=error, retryable=False)
                return None
            reply = self.invoker.invoke(task, event)
        if beats.canceled:
            # The user canceled while the function ran (it cannot be stopped): whatever it
            # answers lands nothing, as a worker's canceled operator emits nothing.
            send_report(self.client, claim, "canceled", beats.clock)
            return None
        if beats.lost is not None:
            # Reaped, or a later attempt began, while the function ran: its answer is still
            # reported, and lands only if this attempt is still the task's current one.
            log.warning(
                "task %s attempt %s: lease lost during the invocation: %s",
                claim.task_id,
                claim.attempt,
                beats.lost,
            )
        return task, reply, beats.clock

    def report(self, claim: Claim, task: TaskPayload, reply: Reply, clock: LeaseClock) -> None:
        """The invocation's answer, judged, through the wrapper's attempt-fenced calls: its
        events and buffer batches first, then the completion."""
        result, kw = judge(task, reply)
        if result is not None:
            try:
                if result.events:
                    events = result.events
                    within_lease(clock, "events", lambda: self.client.events(claim, events))
                for body in result.buffers:
                    within_lease(
                        clock, "buffer publish", lambda b=body: self.client.buffer_publish(claim, b)
                    )
            except ApiError as e:
                log.warning("task %s attempt %s: %s", claim.task_id, claim.attempt, e)
                error = f"lambda result refused: {e.message}"
                retryable = e.status not in (403, 422)
                send_report(self.client, claim, "failed", clock, error=error, retryable=retryable)
                return
        outcome = "succeeded" if result is not None and result.outcome == "succeeded" else "failed"
        send_report(self.client, claim, outcome, clock, **kw)

    def _extend(self, msg: Message) -> None:
        try:
            self.driver.extend_visibility(self.queue_name, msg.receipt, self.visibility)
        except Exception as e:  # only risks a duplicate wake-up, which the claim refuses
            log.warning("could not extend the wake-up's visibility: %s", e)

    def _nack(self, msg: Message, why: str, delay: float = 0) -> None:
        try:
            self.driver.nack(self.queue_name, msg.receipt, why, delay_seconds=delay)
        except Exception as e:
            log.warning("could not nack a wake-up (%s): %s", why, e)
