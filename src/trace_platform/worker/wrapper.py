"""The worker wrapper: the platform contract around operator code, and its security boundary.

wake-up -> claim lease (Postgres, via the Dispatcher) -> task-fetch -> run the operator in the
host process while heartbeating and extending queue visibility -> forward events -> report
completion (attempt-fenced) -> ack the wake-up. Wake-ups are only hints: anything not claimable
is acknowledged and dropped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue as stdqueue
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import ValidationError

from trace_platform.config import Settings, get_settings
from trace_platform.contract import (
    MAX_ERROR_CHARS,
    MAX_PROGRESS_BYTES,
    Claim,
    CompleteResponse,
    EventIn,
    OutputCommit,
    TaskPayload,
    progress_size,
)
from trace_platform.objectstore import ObjectStore
from trace_platform.operators import CLUSTER_OPERATORS, TRUSTED_OPERATORS
from trace_platform.queue import payloads
from trace_platform.queue.driver import Message, QueueDriver
from trace_platform.sandbox import Policy
from trace_platform.sandbox.gateway import (
    Allow,
    EgressRefused,
    Gateways,
    check_all,
    check_upstream,
    host_port,
    is_url,
    parse_allow,
)
from trace_platform.sandbox.hostdir import TaskDirs, resource_limits
from trace_platform.sandbox.tcp_forward import TcpForward, connect_address
from trace_platform.worker.client import ApiError, DispatcherClient, transient
from trace_platform.worker.host_link import HostLink
from trace_platform.worker.operator_host import HostUnresponsive, OperatorHost, write_msg
from trace_platform.worker.store_proxy import ScopedStore

log = logging.getLogger(__name__)
T = TypeVar("T")
# How long a host running for its tenant may take to read a task's start (`start_ready`): an
# idle host reads at once, and one that does not is restarted.
START_SEND_SECONDS = 5.0


class LeaseClock:
    """Where this worker's lease ends, on its own monotonic clock: each accepted heartbeat
    moves it to the `lease_until` the Dispatcher answered (taken as a span from now, so a skew
    between the worker's and the database's clocks shifts it by no more than the skew)."""

    def __init__(self, lease_until: datetime) -> None:
        self.deadline = 0.0
        self.renew(lease_until)

    def renew(self, lease_until: datetime) -> None:
        span = (lease_until - datetime.now(UTC)).total_seconds()
        self.deadline = time.monotonic() + max(0.0, span)

    def left(self) -> float:
        return self.deadline - time.monotonic()


class HeldAcks:
    """Acks of one worker's wrappers, held for the next queue receive to carry: its statement
    deletes them and leases the next wake-ups in one commit (as Oban flushes acks with its next
    fetch). Each is added only after its attempt's completion committed. What no receive takes
    within `linger` seconds (every wrapper busy), and whatever is held at exit (`flush`), goes
    out alone with one `ack_many`. A message acked late is only invisible a while longer: if
    its lease ran out first, the redelivered wake-up is refused by the claim and dropped."""

    def __init__(self, driver: QueueDriver, queue_name: str, linger: float = 0.5) -> None:
        self.driver = driver
        self.queue_name = queue_name
        self.linger = linger
        self._lock = threading.Lock()
        self._held: list[str] = []
        self._since = 0.0  # when the oldest held receipt came
        self._thread: threading.Thread | None = None

    def submit(self, receipt: str) -> None:
        with self._lock:
            if not self._held:
                self._since = time.monotonic()
            self._held.append(receipt)
            if self._thread is None:
                self._thread = threading.Thread(target=self._linger, name="acks", daemon=True)
                self._thread.start()

    def take(self, limit: int = 1000) -> list[str]:
        """The held receipts (up to `limit`), for a receive to carry; `give_back` if it fails."""
        with self._lock:
            taken, self._held = self._held[:limit], self._held[limit:]
            if self._held:
                self._since = time.monotonic()
            return taken

    def receive(self, max_messages: int, visibility: float, wait_seconds: float) -> list[Message]:
        """Up to `max_messages` wake-ups, leased by the statement that acks what is held."""
        settled = self.take()
        try:
            return self.driver.receive(
                self.queue_name, max_messages, visibility, wait_seconds, ack=settled
            )
        except Exception as e:
            self.failed(settled, e)
            raise

    def give_back(self, receipts: list[str]) -> None:
        with self._lock:
            if receipts and not self._held:
                self._since = time.monotonic()
            self._held = receipts + self._held

    def failed(self, receipts: list[str], error: Exception) -> None:
        """Receipts a statement carrying them failed on: kept for the next one, unless the
        queue refused them as malformed (ValueError), which they would fail again forever."""
        if isinstance(error, ValueError):
            log.warning("dropping %d held acks the queue refused: %s", len(receipts), error)
        else:
            self.give_back(receipts)

    def flush(self) -> None:
        """Every held receipt, now, in one statement per thousand."""
        while taken := self.take():
            try:
                self.driver.ack_many(self.queue_name, taken)
            except Exception as e:
                self.failed(taken, e)
                raise

    def _linger(self) -> None:
        while True:
            with self._lock:
                if not self._held:  # nothing to wait for: the next submit starts another
                    self._thread = None
                    return
                wait = self._since + self.linger - time.monotonic()
            if wait > 0:
                time.sleep(wait)
                continue
            try:
                self.flush()
            except Exception as e:  # the database away: kept, tried again after `linger`
                log.warning("could not ack %s's finished wake-ups: %s", self.queue_name, e)
                with self._lock:
                    self._since = time.monotonic()


class _Janitor:
    """Removes finished tasks' directories off the wrappers' path: each is a fresh name under
    its host's directory, never reused, so the next task need not wait for the last one's
    rmtree (a host's kill removes whatever is left with its whole directory)."""

    def __init__(self) -> None:
        self._todo: stdqueue.Queue[TaskDirs] = stdqueue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def remove(self, dirs: TaskDirs) -> None:
        self._todo.put(dirs)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="task-dirs", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._todo.get().remove()


_janitor = _Janitor()


def platform_ports(settings: Settings, api_urls: list[str | None], dsns: list[str]) -> set[int]:
    """Loopback ports of the platform's own services (the API's, its exchange listener's, the
    object store's, Postgres'): no operator egress may reach them."""
    ports = {settings.api_port}
    if settings.exchange_port is not None:
        ports.add(settings.exchange_port)
    urls = (*api_urls, settings.exchange_url, settings.s3_endpoint_url)
    ports.update(host_port(url)[1] for url in urls if url)
    for dsn in dsns:
        with contextlib.suppress(psycopg.Error, ValueError):
            spec = str(conninfo_to_dict(dsn).get("port") or "")  # "5432,5433": one per host
            ports.update(int(p) if p else 5432 for p in spec.split(","))
    return ports


class Wrapper:
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
    ) -> None:
        """`host_env`: added to every host's allowlisted environment (Spark settings, the
        operator registry); `trusted_env`: in the task env of trusted platform operators only
        (a sink's data DSN); `platform_ports`: loopback ports no operator may reach (API,
        Postgres, object store endpoint); `acks`: the worker's shared `HeldAcks`; `settings`:
        egress and resource limits (default: the process's)."""
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
        safe_id = self.worker_id.replace(":", "_").replace("/", "_")
        self.host = OperatorHost(
            home,
            safe_id,
            self.policy,
            extra_env=host_env,
            extra_binds=extra_binds,
            limits=limits,
        )
        # Trusted sinks (platform code that writes Postgres data) run in a host of their own,
        # sandboxed like any other with the same limits, and only they get the data DSN, with a
        # forward to its server for the task's run (`_sink_forward`). A DSN with no TCP address
        # (a Unix socket) cannot be forwarded: that host then runs outside the sandbox.
        sink = self.trusted_env.get("TRACE_SINK_DSN")
        trusted_policy = self.policy if sink is None or _tcp_address(sink) else Policy("off")
        if self.policy.isolated and not trusted_policy.isolated:
            log.warning(
                "the hot_window sink runs OUTSIDE the sandbox: its DSN has no TCP address to "
                "forward into it (a Unix socket); give TRACE_DATA_DSN a host and port"
            )
        self.trusted_host = OperatorHost(
            home, safe_id + "-trusted", trusted_policy, extra_env=host_env, limits=limits
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

    @staticmethod
    def _within_lease(clock: LeaseClock | None, what: str, call: Callable[[], T]) -> T:
        """`call`, tried again while the API is away and `clock` still runs: the lease (an
        outage shorter than the lease costs the attempt nothing), or a claim's retry budget."""
        while True:
            try:
                return call()
            except Exception as e:
                if clock is None or not transient(e) or clock.left() <= 1.0:
                    raise
                log.warning("%s failed (%s); retrying, %.0fs left", what, e, clock.left())
                time.sleep(min(1.0, clock.left() / 4))

    def _report(
        self, claim: Claim, outcome: str, clock: LeaseClock | None = None, **kw: Any
    ) -> None:
        kw = clean_report(kw)
        try:
            res = self._within_lease(
                clock, "completion", lambda: self.client.complete(claim, outcome, **kw)
            )
        except (ApiError, ValueError) as e:
            follow = refused_report(claim, outcome, e)
            if follow is not None:
                self._report(claim, "failed", **follow)
            return
        reported(claim, res)

    def run_claimed(self, claim: Claim, msg: Message, stop: threading.Event) -> None:
        # The claim carries the payload (read under the lease it took); an older API's does
        # not, and then it is fetched.
        task = claim.task if claim.task is not None else self.client.fetch(claim)
        if task.status == "canceled":
            self._report(claim, "canceled")
            return
        if task.status != "running":  # reaped between claim and fetch: not ours to run
            return
        host, env = self._host_for(task)
        gateways: list[Gateways | TcpForward] = []
        dirs: TaskDirs | None = None
        # Heartbeats go on while the attempt is set up (a host's start, its secrets, its
        # egress: names a hostile DNS server answers slowly), so a slow set-up keeps its lease.
        with _SetupBeats(self, claim, msg) as beats:
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
            host.send(_run_message(run, env, spark_remote))
        except Exception as e:  # the host could not take it
            self._close(gateways, dirs)
            host.kill()
            self._report(
                claim, "failed", clock=run.clock, error=f"operator host failed to start: {e}"
            )
            return
        self.supervised(run, stop)

    def start_ready(self, claim: Claim, msg: Message) -> Running | None:
        """The claimed attempt started at once, when nothing in its start can wait: its
        payload came with the claim, it is to run, and it needs no secret, no network egress,
        no sink forward and no Spark forward from a host that already runs for its tenant. None:
        nothing was done, and `run_claimed` starts it (it may wait on the API, or on a host's
        start)."""
        task = claim.task
        if task is None or task.status != "running" or task.slot_secret_names:
            return None
        host, env = self._host_for(task)
        if (
            not host.runs_for((task.org_id, task.dag_id))
            or _task_urls(task, env)
            or self._spark_forwarded(task)
            or (host is self.trusted_host and host.policy.isolated)  # its sink's forward
        ):
            return None
        dirs = host.new_task(task)
        run = Running(
            claim, msg, task, host, dirs, [], self._scoped(task, host, dirs), self.visibility
        )
        try:
            host.send(_run_message(run, env, None), timeout=START_SEND_SECONDS)
        except Exception as e:  # a host gone, or not reading: `run_claimed` starts another
            log.warning("task %s: operator host did not take it (%s); restarting", task.task_id, e)
            host.kill(grace=0)  # wedged: no grace (the caller waits on it)
            self._close([], dirs)
            return None
        return run

    def supervised(
        self, run: Running, stop: threading.Event, first: dict[str, Any] | None = None
    ) -> None:
        """`run` supervised to its end and reported (`first`: a message already read)."""
        try:
            self._supervise(run, stop, first)
        finally:
            self.finish(run)

    def finish(self, run: Running) -> None:
        # A run that never asked the store anything (a late answer could still write into
        # its inbox) and left its directories as made: they serve the host's next run.
        kept = not run.scoped.used and run.host.recycle(run.dirs)
        self._close(run.gateways, None if kept else run.dirs)

    def _host_for(self, task: TaskPayload) -> tuple[OperatorHost, dict[str, str]]:
        """The host the task runs in, and its environment (slot env; a trusted sink's DSN)."""
        env = dict(task.slot_env)
        if task.operator in TRUSTED_OPERATORS and task.runtime == "ecs_platform":
            env.update(self.trusted_env)
            return self.trusted_host, env
        return self.host, env

    def _scoped(self, task: TaskPayload, host: OperatorHost, dirs: TaskDirs) -> ScopedStore:
        return ScopedStore(self.store, task, dirs.work, dirs.inbox, host.policy.uid)

    def egress_allowed(self) -> Allow:
        """TRACE_EGRESS_ALLOW's upstreams; `devnet` in it (the Lite stack's): this Trace home's
        devnet node, at its address while it runs (it may start after the worker)."""
        allow = parse_allow(self.egress_allow)
        if self.egress_devnet and (node := _devnet_node(self.home)) is not None:
            allow |= {node}
        return allow

    def _egress(
        self,
        host: OperatorHost,
        task: TaskPayload,
        env: dict[str, str],
        gateways: list[Gateways | TcpForward],
    ) -> tuple[TaskPayload, dict[str, str]]:
        """Every RPC URL the task may use (slot env and secrets, config.rpc_url) is checked,
        at most `egress_max_urls` of them; in the sandbox they become gateways on the host's
        own loopback, to the addresses checked."""
        urls = _task_urls(task, env)
        rpc = task.config.get("rpc_url")
        if len(urls) > self.egress_max_urls:
            # Before any name is resolved: each is a DNS query, and each a gateway.
            raise EgressRefused(
                f"the task has {len(urls):,} RPC URLs (http(s) values in its worker pool slot's "
                f"env and secrets, and config.rpc_url); at most {self.egress_max_urls} per task "
                "(TRACE_EGRESS_MAX_URLS)"
            )
        if not urls:
            return task, env
        allow = self.egress_allowed()
        checked = check_all(urls, self.platform_ports, allow)
        if not host.policy.isolated:
            return task, env
        group = Gateways(self.platform_ports, allow)
        gateways.append(group)
        local = {url: group.add(host.listen(), up) for url, up in sorted(checked.items())}
        env = {k: local.get(v, v) for k, v in env.items()}
        if isinstance(rpc, str) and rpc in local:
            task = task.model_copy(update={"config": {**task.config, "rpc_url": local[rpc]}})
        return task, env

    def _sink_forward(
        self,
        host: OperatorHost,
        task: TaskPayload,
        env: dict[str, str],
        forwards: list[Gateways | TcpForward],
    ) -> dict[str, str]:
        """A trusted sink's env in the sandbox: its DSN pointed at a forward, on the host's own
        loopback for this run only, to the server's address (the DSN keeps its host name, for
        TLS verification)."""
        dsn = env.get("TRACE_SINK_DSN")
        if dsn is None or host is not self.trusted_host or not host.policy.isolated:
            return env
        address = _tcp_address(dsn)
        if address is None:
            raise RuntimeError("the sink DSN has no TCP address to forward into the sandbox")
        fwd = TcpForward(host.listen(), *address)
        forwards.append(fwd)
        params = conninfo_to_dict(dsn)
        name = str(params.get("host") or "").split(",")[0] or "127.0.0.1"
        params.update(host=name, hostaddr="127.0.0.1", port=str(fwd.port))
        return {**env, "TRACE_SINK_DSN": make_conninfo(**params)}

    def _spark_remote(
        self, host: OperatorHost, task: TaskPayload, forwards: list[Gateways | TcpForward]
    ) -> str | None:
        """The Spark Connect URL the task's operator uses, when the configured master is one
        (`sc://`) and the operator may run on the cluster (CLUSTER_OPERATORS): in the sandbox,
        a forward from the host's own loopback to that endpoint."""
        if not self._spark_forwarded(task):
            return None
        name, port, rest = connect_address(self.spark_master)
        # The worker's own setting, not a task's: allowed wherever it is, but never a platform port.
        check_upstream(
            f"http://{name}:{port}/", self.platform_ports, parse_allow([f"{name}:{port}"])
        )
        if not host.policy.isolated:
            return self.spark_master
        fwd = TcpForward(host.listen(), name, port)
        forwards.append(fwd)
        return f"sc://127.0.0.1:{fwd.port}{rest}"

    def _spark_forwarded(self, task: TaskPayload) -> bool:
        return self.spark_master.startswith("sc://") and task.operator in CLUSTER_OPERATORS

    @staticmethod
    def _serve_store(
        proc: subprocess.Popen[bytes],
        link: HostLink,
        scoped: ScopedStore,
        req: dict[str, Any],
    ) -> None:
        """Answers `proc`, the host that asked (never a restarted one), via its own link."""
        reply = {"type": "store_reply", **scoped.handle(req)}
        # Posted before the reply is written: the host's next request can only follow the
        # reply, so the supervisor always reads it after this.
        link.post({"type": "store_done"})
        try:
            write_msg(proc, reply)
        except HostUnresponsive as e:
            link.post({"type": "protocol_error", "error": str(e)})
        except OSError:  # the host is gone (killed: BrokenPipeError): nothing to answer
            return

    @staticmethod
    def _close(gateways: list[Gateways | TcpForward], dirs: TaskDirs | None) -> None:
        for gw in gateways:
            gw.close()
        if dirs is not None:
            _janitor.remove(dirs)

    def _broken(self, run: Running, why: str, retryable: bool = False) -> None:
        """The host said what the protocol does not allow: it is stopped and the attempt fails
        now, not when its lease runs out; for good (a host that broke the protocol once would
        again) unless `retryable` (the fault was an earlier task's: the retry gets a fresh
        host)."""
        why = _one_line(str(why), 300)  # the host's own words, maybe: bounded, one line
        log.warning("task %s: host protocol violation: %s", run.claim.task_id, why)
        run.host.kill()
        self._report(
            run.claim,
            "failed",
            clock=run.clock,
            error=f"operator host broke the protocol: {why}",
            retryable=retryable,
        )

    def _supervise(
        self, run: Running, stop: threading.Event, first: dict[str, Any] | None = None
    ) -> None:
        claim, msg, task, host, scoped = run.claim, run.msg, run.task, run.host, run.scoped
        every = beat_every(claim, self.visibility)
        next_beat = run.beat_at
        progress = run.progress
        store_busy = False
        clock = run.clock
        link = host.link
        assert link is not None  # the host runs: `ensure` made it
        while True:
            if first is not None:
                out, first = first, None
            else:
                out = link.get(timeout=max(0.0, next_beat - time.monotonic()))
            if out is None or time.monotonic() >= next_beat:
                next_beat = time.monotonic() + every
                try:
                    hb = self.client.heartbeat(
                        claim, progress, timeout=min(5.0, max(1.0, 2 * every))
                    )
                except Exception as e:
                    if not transient(e):  # lease lost (reaped) or superseded: stop at once
                        log.warning(
                            "task %s attempt %s: %s; stopping operator",
                            claim.task_id,
                            claim.attempt,
                            e,
                        )
                        host.kill()
                        return
                    if clock.left() <= every:  # lost before the next try: the reaper's now
                        log.warning(
                            "task %s attempt %s: no heartbeat accepted before the lease ran out "
                            "(%s); stopping operator",
                            claim.task_id,
                            claim.attempt,
                            e,
                        )
                        host.kill()
                        return
                    # The API is away (restarting, unreachable): the lease still holds, so the
                    # operator goes on and the heartbeat is tried again soon.
                    log.warning(
                        "task %s attempt %s: heartbeat failed (%s); lease holds %.0fs more",
                        claim.task_id,
                        claim.attempt,
                        e,
                        clock.left(),
                    )
                    next_beat = time.monotonic() + min(every, 1.0)
                    hb = None
                if hb is not None:
                    clock.renew(hb.lease_until)
                    self._extend(msg)
                    if hb.cancel_requested or stop.is_set():
                        host.kill()
                        if hb.cancel_requested:
                            self._report(claim, "canceled", clock=clock)
                        else:  # shutting down, its drain grace over: not the task's failure
                            self._report(
                                claim,
                                "released",
                                clock=clock,
                                error="handed back unfinished: its worker shut down",
                            )
                        return
            if out is None:
                continue
            kind = out.get("type")
            if (why := foreign(out, run)) is not None:
                # Retryable, but a failure: code in the host can name any run, and a
                # hand-back (`released`, no try used, queued at once) could be replayed forever.
                self._broken(run, why, retryable=True)
                return
            if kind == "store" and not store_busy:
                # Served off this loop (heartbeats go on during an upload), one at a time.
                store_busy = True
                scoped.used = True
                threading.Thread(
                    target=self._serve_store,
                    args=(host.proc, link, scoped, out),
                    daemon=True,
                ).start()
            elif kind == "store_done":
                store_busy = False
            elif kind in ("store", "protocol_error"):
                why = out.get("error") or "a second store request before the first was answered"
                self._broken(run, why)
                return
            elif kind == "progress":
                progress = bounded_progress(out.get("progress"), claim)
            elif kind == "event":
                try:
                    event = EventIn.model_validate(out.get("event"))
                    event.model_dump_json()  # the events call's body (its serializer's depth)
                except ValueError as e:
                    self._broken(run, f"a malformed event: {_gist(e)}")
                    return
                try:
                    self._within_lease(
                        clock, "events", lambda ev=event: self.client.events(claim, [ev])
                    )
                except ApiError as e:
                    log.warning("event refused for %s: %s; stopping operator", claim.task_id, e)
                    host.kill()
                    retryable = e.status not in (403, 422)
                    self._report(
                        claim,
                        "failed",
                        clock=clock,
                        error=f"event refused: {e.message}",
                        retryable=retryable,
                    )
                    return
            elif kind in ("done", "failed"):
                try:
                    outcome, kw = final_report(out, task)
                except Exception as e:  # as the loop's `_heard`: any fault of the message
                    self._broken(run, f"a malformed {kind!r} message: {_gist(e)}")
                    return
                self._report(claim, outcome, clock=clock, **kw)
                if store_busy:
                    # It ended with a store call of its own still open (a thread left
                    # running): that call's reply, or its note, must not reach the host's
                    # next task, nor the call read that task's run line. No reuse.
                    host.kill()
                return
            elif kind == "exit":
                host.kill()  # one that closed its output may still run
                why, tail = _exit_reason(out["returncode"]), host.log_tail()
                self._report(
                    claim,
                    "failed",
                    clock=clock,
                    error=f"operator process died ({why})\n{tail}".strip(),
                )
                return
            else:  # `ready`, `store_reply` or any other: not what a running task may say
                why = f"a message of unknown type {_one_line(kind, 40)!r}"
                # Naming another run, it is what an earlier task left running (as `foreign`).
                self._broken(run, why, retryable=out.get("run") not in (None, run.label))
                return


def _gist(e: Exception) -> str:
    """An error's gist: its type, and the first line of what it says (a validation error's
    next lines repeat the operator's input)."""
    if isinstance(e, ValidationError) and e.errors():
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or e.title
        return _one_line(f"{where}: {first['msg']}", 200)
    said = str(e).strip().splitlines()
    return _one_line(f"{type(e).__name__}: {said[0]}", 200) if said else type(e).__name__


def _one_line(text: str, limit: int) -> str:
    """`text` on one line (no newline or control character an operator put in it), cut to
    `limit` characters."""
    return " ".join("".join(c if c.isprintable() else " " for c in text[: 4 * limit]).split())[
        :limit
    ]


def beat_every(claim: Claim, visibility: float) -> float:
    """Seconds between an attempt's heartbeats (each also extends its wake-up's visibility)."""
    return max(0.2, min(claim.heartbeat_seconds, visibility / 3))


class Running:
    """An attempt its host runs, and what supervising it needs."""

    __slots__ = (
        "beat_at",
        "claim",
        "clock",
        "dirs",
        "gateways",
        "host",
        "label",
        "msg",
        "progress",
        "scoped",
        "task",
    )

    def __init__(
        self,
        claim: Claim,
        msg: Message,
        task: TaskPayload,
        host: OperatorHost,
        dirs: TaskDirs,
        gateways: list[Gateways | TcpForward],
        scoped: ScopedStore,
        visibility: float = 60.0,
    ) -> None:
        self.claim, self.msg, self.task, self.host = claim, msg, task, host
        self.dirs, self.gateways, self.scoped = dirs, gateways, scoped
        self.label = f"{claim.task_id}/{claim.attempt}"  # the host's messages name it
        self.clock = LeaseClock(claim.lease_until)
        self.beat_at = time.monotonic() + beat_every(claim, visibility)  # the next heartbeat
        self.progress: dict[str, Any] | None = None  # the operator's last report of it


def _run_message(run: Running, env: dict[str, str], spark_remote: str | None) -> bytes:
    """The host's "run" line. The payload goes in as pydantic writes it, in one pass (a dict
    first, then json, took 26 us a task against 16, in the loop every attempt waits on)."""
    head = json.dumps(
        {
            "type": "run",
            "run": run.label,
            "env": env,
            "workdir": str(run.dirs.work),
            "spark_remote": spark_remote,
        }
    )
    return f'{head[:-1]}, "task": {run.task.model_dump_json()}}}\n'.encode()


# What a host says of its run, each tagged with the run (`Running.label`) it belongs to.
_RUN_MESSAGES = frozenset({"done", "failed", "event", "progress", "store"})


def foreign(out: dict[str, Any], run: Running) -> str | None:
    """Why a host's message is not `run`'s (None: it is, or is not a run's message). One
    tagged with another run comes from what an earlier task left running in the host: it
    must not end, or speak for, the attempt that runs now."""
    kind = out.get("type")
    if kind not in _RUN_MESSAGES or out.get("run") == run.label:
        return None
    said = out.get("run")
    if said is None:
        whose = "no run"
    elif isinstance(said, str):
        whose = f"run {_one_line(said, 80)!r}"
    else:  # never str() of whatever the host sent (nested deep, it would recurse)
        whose = f"a run named by a JSON {type(said).__name__}"
    return f"a {kind!r} message for {whose} during run {run.label!r}"


DEVNET = "devnet"  # in TRACE_EGRESS_ALLOW: this Trace home's devnet node (see egress_allowed)


def _devnet_node(home: Path) -> tuple[str, int] | None:
    """The devnet node's (host, port), from `trace devnet`'s node file, while its process runs."""
    try:
        raw = json.loads((home / "devnet" / "node.json").read_text())
        pid, port = int(raw["pid"]), int(raw["port"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return "127.0.0.1", port


def _tcp_address(dsn: str) -> tuple[str, int] | None:
    """Where a DSN's (first) server listens over TCP; None: a Unix socket, or no host at all."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return None
    host = str(params.get("hostaddr") or params.get("host") or "").split(",")[0]
    if not host or host.startswith("/") or host.startswith("@"):
        return None
    port = str(params.get("port") or "").split(",")[0]
    return host, int(port) if port else 5432


class _SetupBeats:
    """An attempt's heartbeats, on a thread of their own, while the attempt is set up (before
    its supervisor beats): `lost` says why the lease is gone, `canceled` that a cancel came;
    `clock` and `next_at` carry on into the supervision."""

    def __init__(self, wrapper: Wrapper, claim: Claim, msg: Message) -> None:
        self.wrapper, self.claim, self.msg = wrapper, claim, msg
        self.clock = LeaseClock(claim.lease_until)
        self.every = beat_every(claim, wrapper.visibility)
        self.next_at = time.monotonic() + self.every
        self.lost: str | None = None
        self.canceled = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="setup-beats", daemon=True)

    def __enter__(self) -> _SetupBeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()  # at most one heartbeat call in flight

    def _run(self) -> None:
        while not self._done.wait(max(0.0, self.next_at - time.monotonic())):
            self.next_at = time.monotonic() + self.every
            try:
                hb = self.wrapper.client.heartbeat(
                    self.claim, None, timeout=min(5.0, max(1.0, 2 * self.every))
                )
            except Exception as e:
                if not transient(e) or self.clock.left() <= self.every:
                    self.lost = str(e)
                    return
                self.next_at = time.monotonic() + min(self.every, 1.0)  # the API away: soon
                continue
            self.clock.renew(hb.lease_until)
            self.wrapper._extend(self.msg)
            if hb.cancel_requested:
                self.canceled = True
                return


def _task_urls(task: TaskPayload, env: dict[str, str]) -> set[str]:
    """Every RPC URL the task may use: its env's (slot env, secrets) and config.rpc_url."""
    urls = {v for v in env.values() if is_url(v)}
    rpc = task.config.get("rpc_url")
    if isinstance(rpc, str) and is_url(rpc):
        urls.add(rpc)
    return urls


def clean_report(kw: dict[str, Any]) -> dict[str, Any]:
    """A report's arguments as the API takes them: operator text has no NULs (Postgres
    refuses them)."""
    if isinstance(kw.get("error"), str):
        error = kw["error"].replace("\x00", "\\0")
        if len(error) > MAX_ERROR_CHARS:
            cut = f"\n... ({len(error) - MAX_ERROR_CHARS + 100:,} more characters cut)"
            error = error[: MAX_ERROR_CHARS - 100] + cut
        return {**kw, "error": error}
    return kw


def reported(claim: Claim, res: CompleteResponse) -> None:
    # A success at debug: the Dispatcher records every outcome, and a log line per task was
    # about a tenth of the worker's CPU on short tasks.
    level = logging.DEBUG if res.status == "succeeded" else logging.INFO
    log.log(level, "task %s attempt %s -> %s", claim.task_id, claim.attempt, res.status)


def refused_report(claim: Claim, outcome: str, e: ApiError | ValueError) -> dict[str, Any] | None:
    """A completion refused, by the API (ApiError) or the client's own validation
    (ValueError: too many events): what the attempt reports instead, if anything. What a
    success produced was refused (not its own dataset, malformed): the attempt fails now,
    naming why, instead of waiting for its lease to expire."""
    if isinstance(e, ApiError):
        log.warning("completion of %s attempt %s refused: %s", claim.task_id, claim.attempt, e)
        if outcome == "succeeded" and e.status in (403, 413, 422):
            return {"error": f"completion refused: {e.message}", "retryable": False}
        return None
    log.warning("completion of %s attempt %s invalid: %s", claim.task_id, claim.attempt, e)
    if outcome == "succeeded":
        return {"error": f"completion invalid: {e}", "retryable": False}
    return None


def final_report(out: dict[str, Any], task: TaskPayload) -> tuple[str, dict[str, Any]]:
    """The outcome and report of a host's `done` or `failed` message."""
    if out["type"] == "done":
        if not isinstance(out["final_events"], list) or not isinstance(
            out.get("outputs", []), list
        ):
            raise TypeError("final_events and outputs are lists")
        if not isinstance(out.get("state"), dict | None):
            raise TypeError("state is an object or null")
        return "succeeded", {
            "final_events": [EventIn.model_validate(e) for e in out["final_events"]],
            "outputs": [OutputCommit.model_validate(o) for o in out.get("outputs", [])],
            "operator_state": out.get("state"),
            "operator_state_revision": task.operator_state_revision,
        }
    error, retryable = out["error"], out["retryable"]
    if not isinstance(error, str) or not isinstance(retryable, bool):
        raise TypeError("a failure's error is text and its retryable a boolean")
    return "failed", {"error": error, "retryable": retryable}


def _exit_reason(code: int | None) -> str:
    """How a host ended, from its `exit` message (no code: it closed its output, ran on)."""
    if code is None:
        return "it closed its output and was killed"
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def bounded_progress(reported: Any, claim: Claim) -> dict[str, Any] | None:
    """An operator's progress report as the heartbeat may carry it: a JSON object within
    MAX_PROGRESS_BYTES (a heartbeat refused for it would cost the task its lease): a larger one
    is replaced by a note saying so, anything but an object is ignored."""
    if not isinstance(reported, dict):
        return None
    try:
        size = progress_size(reported)
    except (TypeError, ValueError, RecursionError):
        size = MAX_PROGRESS_BYTES + 1
    if size > MAX_PROGRESS_BYTES:
        log.warning(
            "task %s attempt %s: progress report dropped (over %d bytes of JSON)",
            claim.task_id,
            claim.attempt,
            MAX_PROGRESS_BYTES,
        )
        return {"dropped": f"report over {MAX_PROGRESS_BYTES} bytes"}
    return reported
