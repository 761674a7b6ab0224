"""The worker wrapper: the platform contract around operator code, and its security boundary.

wake-up -> claim lease (Postgres, via the Dispatcher) -> task-fetch -> run the operator in the
host process while heartbeating and extending queue visibility -> forward events -> report
completion (attempt-fenced) -> ack the wake-up. Wake-ups are only hints: anything not claimable
is acknowledged and dropped.

Its parts: `held_acks` (acks ride on the next receive), `attempt` (the lease clock, the run a
host is handed), `task_network` (egress gateways and forwards), `supervisor` (a started attempt
to its end) and `reports` (what a host says, made into what the Dispatcher is told).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trace_platform.config import Settings, get_settings
from trace_platform.contract import Claim, TaskPayload
from trace_platform.metrics.worker import WorkerMetrics
from trace_platform.objectstore import ObjectStore
from trace_platform.operators import TRUSTED_OPERATORS
from trace_platform.queue import payloads
from trace_platform.queue.driver import Message, QueueDriver
from trace_platform.sandbox import Policy
from trace_platform.sandbox.gateway import EgressRefused, Gateways, parse_allow
from trace_platform.sandbox.hostdir import TaskDirs, resource_limits
from trace_platform.sandbox.tcp_forward import TcpForward
from trace_platform.worker.attempt import (
    LeaseClock,
    Running,
    SetupBeats,
    run_message,
    within_lease,
)
from trace_platform.worker.client import ApiError, DispatcherClient
from trace_platform.worker.held_acks import HeldAcks
from trace_platform.worker.operator_host import OperatorHost
from trace_platform.worker.reports import send_report
from trace_platform.worker.store_proxy import ScopedStore
from trace_platform.worker.supervisor import Supervisor
from trace_platform.worker.task_network import DEVNET, TaskNetwork, task_urls, tcp_address

log = logging.getLogger(__name__)
# How long a host running for its tenant may take to read a task's start (`start_ready`): an
# idle host reads at once, and one that does not is restarted.
START_SEND_SECONDS = 5.0


class Wrapper(TaskNetwork, Supervisor):
    def __init__(
        self,
        driver: QueueDriver,
        client: DispatcherClient,
        store: ObjectStore,
        *,
        policy: Policy | None = None,
        queue_name: str = "tasks",
        worker_id: str | None = None,
        home: Path = Path(".trace"),
        visibility_seconds: float = 60.0,
        wait_seconds: float = 5.0,
        host_env: dict[str, str] | None = None,
        trusted_env: dict[str, str] | None = None,
        platform_ports: set[int] | None = None,
        extra_binds: list[Path] | None = None,
        acks: HeldAcks | None = None,
        settings: Settings | None = None,
        host_name: str | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        """`host_env`: added to every host's allowlisted environment (Spark settings, the
        operator registry); `trusted_env`: in the task env of trusted platform operators only
        (a sink's data DSN); `platform_ports`: loopback ports no operator may reach (API,
        Postgres, object store endpoint); `acks`: the worker's shared `HeldAcks`; `settings`:
        egress and resource limits (default: the process's); `host_name`: its operator hosts'
        name (default: from `worker_id`; the wrappers of one worker share its id, so each
        needs its own); `metrics`: the worker's (its hosts' starts are counted there)."""
        settings = settings or get_settings()
        self.driver = driver
        self.client = client
        self.store = store
        self.policy = policy or Policy("off")
        self.queue_name = queue_name
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.visibility = visibility_seconds
        self.trusted_env = trusted_env or {}
        self.platform_ports = platform_ports or set()
        self.wait_seconds = wait_seconds
        self.acks = acks or HeldAcks(driver, queue_name)
        self.spark_master = (host_env or {}).get("TRACE_SPARK_MASTER", "local[*]")
        self.home = home
        self.egress_allow = [e for e in settings.egress_allow if e.strip().lower() != DEVNET]
        self.egress_devnet = len(self.egress_allow) != len(settings.egress_allow)
        parse_allow(self.egress_allow)  # a malformed entry stops the worker, not each task
        self.egress_max_urls = settings.egress_max_urls
        limits = resource_limits(settings)
        safe_id = (host_name or self.worker_id).replace(":", "_").replace("/", "_")
        self.host = OperatorHost(
            home,
            safe_id,
            self.policy,
            extra_env=host_env,
            extra_binds=extra_binds,
            limits=limits,
            metrics=metrics,
        )
        # Trusted sinks (platform code that writes Postgres data) run in a host of their own,
        # sandboxed like any other with the same limits, and only they get the data DSN, with a
        # forward to its server for the task's run (`_sink_forward`). A DSN with no TCP address
        # (a Unix socket) cannot be forwarded: that host then runs outside the sandbox.
        sink = self.trusted_env.get("TRACE_SINK_DSN")
        trusted_policy = self.policy if sink is None or tcp_address(sink) else Policy("off")
        if self.policy.isolated and not trusted_policy.isolated:
            log.warning(
                "the hot_window sink runs OUTSIDE the sandbox: its DSN has no TCP address to "
                "forward into it (a Unix socket); give TRACE_DATA_DSN a host and port"
            )
        self.trusted_host = OperatorHost(
            home,
            safe_id + "-trusted",
            trusted_policy,
            extra_env=host_env,
            limits=limits,
            metrics=metrics,
        )

    def close(self) -> None:
        """Stops this wrapper's hosts (whatever they run)."""
        self.host.kill()
        self.trusted_host.kill()

    def wakeup_task(self, msg: Message) -> uuid.UUID | None:
        """The task a wake-up names; a message that is none is nacked (None)."""
        try:
            wake = payloads.decode(msg.payload)
        except payloads.PayloadError as e:
            self.nack(msg, f"poison message: {e}")
            return None
        if not isinstance(wake, payloads.TaskWakeup):
            self.nack(msg, f"not a task wake-up: kind={wake.kind}")
            return None
        return wake.task_id

    def nack(self, msg: Message, why: str, delay_seconds: float = 0) -> None:
        """The wake-up back on the queue, saying why. A nack that fails (the database away)
        is only logged: the message comes again once its visibility lapses."""
        try:
            self.driver.nack(self.queue_name, msg.receipt, why, delay_seconds=delay_seconds)
        except Exception as e:
            log.warning("could not nack a wake-up (%s): %s", why, e)

    def refused_claim(self, msg: Message, task_id: uuid.UUID, e: ApiError) -> None:
        """A claim the API refused. Not claimable (the wake-up was only a hint), or it may
        not run (403: the Dispatcher already failed it, saying why): nothing for this worker
        to do, the wake-up is acked. Anything else: it comes again in a second."""
        if e.status in (403, 404, 409):
            log.debug("dropping wake-up for %s: %s", task_id, e.message)
            self.acks.submit(msg.receipt)
            return
        self.nack(msg, f"claim failed: {e}", delay_seconds=1)

    def attempt(self, claim: Claim, msg: Message, run: Callable[[], None]) -> None:
        """`run`: the claimed attempt, supervised to its end and reported. Then its wake-up's
        ack is held for the next receive: after the completion's commit (or its refusal), so
        a wake-up lost before this is only delivered again, and the claim refuses it."""
        try:
            run()
        except Exception as e:
            # The lease is ours until it expires; the reaper retries the attempt after that.
            log.exception("task %s attempt %s: wrapper error", claim.task_id, claim.attempt)
            self.close()
            self.nack(msg, f"wrapper error: {e}", delay_seconds=1)
            return
        self.acks.submit(msg.receipt)

    # -- one attempt ---------------------------------------------------------------------
    def _extend(self, msg: Message) -> None:
        """Keeps the wake-up invisible while the attempt runs. A failure only risks a duplicate
        wake-up (which the claim refuses), never the attempt."""
        try:
            self.driver.extend_visibility(self.queue_name, msg.receipt, self.visibility)
        except Exception as e:
            log.warning("could not extend the wake-up's visibility: %s", e)

    _within_lease = staticmethod(within_lease)

    def _report(
        self, claim: Claim, outcome: str, clock: LeaseClock | None = None, **kw: Any
    ) -> None:
        send_report(self.client, claim, outcome, clock, **kw)

    def run_claimed(
        self, claim: Claim, msg: Message, stop: threading.Event, after: Running | None = None
    ) -> None:
        """A host that exits before it reads the run is replaced, once (`supervised`): `after`,
        the start it did not read, makes this that retake (its lease clock carried on)."""
        # The claim carries the payload (read under the lease it took); an older API's does
        # not, and then it is fetched.
        task = claim.task if claim.task is not None else self.client.fetch(claim)
        if task.status == "canceled":
            self._report(claim, "canceled")
            return
        if task.status != "running":  # reaped between claim and fetch: not ours to run
            return
        if task.runtime == "lambda":
            # The Lambda invoker's alone: a wake-up for it on this queue (forged, or queued by
            # an older version) is handed back (no try used), and the Dispatcher wakes it again
            # on the lambda queue.
            error = "a task of runtime lambda woken on a platform worker: not run"
            self._report(claim, "released", error=error)
            return
        host, env = self._host_for(task)
        gateways: list[Gateways | TcpForward] = []
        dirs: TaskDirs | None = None
        # Heartbeats go on while the attempt is set up (a host's start, its secrets, its
        # egress: names a hostile DNS server answers slowly), so a slow set-up keeps its lease.
        beats = SetupBeats(self.client, claim, self.visibility, lambda: self._extend(msg), after)
        with beats:
            if task.slot_secret_names:
                try:
                    env.update(self.client.secrets(claim))
                except ApiError as e:
                    if e.status in (403, 404):  # the deployer may no longer use a secret
                        self._report(claim, "failed", error=e.message, retryable=False)
                        return
                    raise
            try:
                host.ensure((task.org_id, task.dag_id))
                task, env = self._egress(host, task, env, gateways)
                env = self._sink_forward(host, task, env, gateways)
                spark_remote = self._spark_remote(host, task, gateways)
                dirs = host.new_task(task)
                scoped = self._scoped(task, host, dirs)
            except EgressRefused as e:
                self._close(gateways, dirs)
                self._report(
                    claim, "failed", error=f"network egress refused: {e}", retryable=e.retryable
                )
                return
            except Exception as e:  # the host could not even start
                self._close(gateways, dirs)
                host.kill()
                self._report(claim, "failed", error=f"operator host failed to start: {e}")
                return
        if beats.lost is not None or beats.canceled:
            self._close(gateways, dirs)
            if beats.canceled:
                self._report(claim, "canceled", clock=beats.clock)
            else:  # reaped or superseded meanwhile: the reaper's now, nothing to report
                log.warning("task %s: lease lost while it was set up: %s", task.task_id, beats.lost)
            return
        assert dirs is not None  # made in the set-up, or it returned
        run = Running(claim, msg, task, host, dirs, gateways, scoped, self.visibility)
        run.clock, run.beat_at = beats.clock, beats.next_at
        try:
            host.send(run_message(run, env, spark_remote))
        except Exception as e:  # the host could not take it
            self._close(gateways, dirs)
            host.kill()
            if after is None and isinstance(e, BrokenPipeError):  # it exited since `ensure`:
                self.run_claimed(claim, msg, stop, after=run)  # not this run's doing
                return
            self._report(
                claim, "failed", clock=run.clock, error=f"operator host failed to start: {e}"
            )
            return
        self.supervised(run, stop, retake=after is None)

    def start_ready(self, claim: Claim, msg: Message) -> Running | None:
        """The claimed attempt started at once, when nothing in its start can wait: its
        payload came with the claim, it is to run, and it needs no secret, no network egress,
        no sink forward and no Spark forward from a host that already runs for its tenant. None:
        nothing was done, and `run_claimed` starts it (it may wait on the API, or on a host's
        start)."""
        task = claim.task
        if (
            task is None
            or task.status != "running"
            or task.slot_secret_names
            or task.runtime == "lambda"  # handed back by `run_claimed`
        ):
            return None
        host, env = self._host_for(task)
        if (
            not host.runs_for((task.org_id, task.dag_id))
            or task_urls(task, env)
            or self._spark_forwarded(task)
            or (host is self.trusted_host and host.policy.isolated)  # its sink's forward
        ):
            return None
        dirs = host.new_task(task)
        run = Running(
            claim, msg, task, host, dirs, [], self._scoped(task, host, dirs), self.visibility
        )
        try:
            host.send(run_message(run, env, None), timeout=START_SEND_SECONDS)
        except Exception as e:  # a host gone, or not reading: `run_claimed` starts another
            log.warning("task %s: operator host did not take it (%s); restarting", task.task_id, e)
            host.kill(grace=0)  # wedged: no grace (the caller waits on it)
            self._close([], dirs)
            return None
        return run

    def _host_for(self, task: TaskPayload) -> tuple[OperatorHost, dict[str, str]]:
        """The host the task runs in, and its environment (slot env; a trusted sink's DSN)."""
        env = dict(task.slot_env)
        if task.operator in TRUSTED_OPERATORS and task.runtime == "ecs_platform":
            env.update(self.trusted_env)
            return self.trusted_host, env
        return self.host, env

    def _scoped(self, task: TaskPayload, host: OperatorHost, dirs: TaskDirs) -> ScopedStore:
        return ScopedStore(self.store, task, dirs.work, dirs.inbox, host.policy.uid)
