"""The lambda runtime's two invokers, behind one narrow protocol (`Invoker.invoke`): an event
in, the function's raw answer or why there is none out. What the answer claims is judged by the
Lambda invoker's loop (aws/lambda_runner.py), the same way for both.

- `AwsInvoker`: Lambda's Invoke (boto3), synchronous (RequestResponse), tried once (botocore's
  retries off: a retry is the Dispatcher's, a new attempt), its read timeout above the
  function's own timeout. A function error ("Unhandled": a crash, a timeout, "Task timed out
  after ...") is the answer's failure.
- `LocalInvoker` (Lite): the same handler code in a subprocess, sandboxed as an operator host is
  (its own uid and namespaces when the worker may make them, an allowlisted environment, a
  fresh directory), one process per invocation, killed at the function's timeout."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trace_platform.aws.lambda_handler import MAX_PAYLOAD_BYTES
from trace_platform.config import Settings
from trace_platform.contract import TaskPayload
from trace_platform.objectstore import ObjectStore
from trace_platform.sandbox import Policy
from trace_platform.sandbox.hostdir import HostDir, TaskDirs, host_command, host_env
from trace_platform.worker.host_link import HostLink
from trace_platform.worker.operator_host import write_msg
from trace_platform.worker.reports import exit_reason, one_line
from trace_platform.worker.store_proxy import ScopedStore

log = logging.getLogger(__name__)
# Above the function's timeout, the Invoke's read timeout: Lambda answers a timed-out
# invocation itself ("Task timed out"), which the invoker should hear rather than cut off.
READ_TIMEOUT_MARGIN = 30.0
MAX_LOG_BYTES = 1024 * 1024  # of one local invocation's log kept in the invoker's


@dataclass(frozen=True)
class Reply:
    """An invocation's end: the function's answer (`body`, its raw bytes), or why it has none
    (`failure`: a timeout, a crash, the Invoke refused)."""

    body: bytes | None = None
    failure: str | None = None


class Invoker(Protocol):
    def invoke(self, task: TaskPayload, event: bytes) -> Reply:
        """`event` (a LambdaEvent's JSON) given to the function for `task`, synchronously."""

    def close(self) -> None: ...


class AwsInvoker:
    def __init__(
        self,
        function: str,
        timeout_seconds: float,
        region: str,
        endpoint_url: str | None = None,
    ) -> None:
        import boto3
        from botocore.config import Config

        self.function = function
        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            read_timeout=timeout_seconds + READ_TIMEOUT_MARGIN,
            connect_timeout=10,
            tcp_keepalive=True,
        )
        self.client = boto3.client(
            "lambda", region_name=region, endpoint_url=endpoint_url, config=config
        )

    def invoke(self, task: TaskPayload, event: bytes) -> Reply:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            got = self.client.invoke(
                FunctionName=self.function, InvocationType="RequestResponse", Payload=event
            )
            body = got["Payload"].read(MAX_PAYLOAD_BYTES + 1)
        except (BotoCoreError, ClientError) as e:
            return Reply(failure=f"Invoke of {self.function} failed: {one_line(str(e), 500)}")
        return answered(got, body)

    def close(self) -> None:
        self.client.close()


def answered(response: dict[str, Any], body: bytes) -> Reply:
    """An Invoke's response as a Reply: a function error (FunctionError "Unhandled": the handler
    raised, crashed or ran out of time; "Handled") is a failure naming Lambda's error."""
    kind = response.get("FunctionError")
    if kind is None:
        return Reply(body=body)
    try:
        said = json.loads(body)
    except ValueError:
        said = None
    if isinstance(said, dict):
        what = f"{said.get('errorType') or 'error'}: {said.get('errorMessage') or ''}"
    else:
        what = body[:500].decode(errors="replace")
    return Reply(failure=f"function error ({kind}): {one_line(what, 500)}")


class LocalInvoker:
    def __init__(
        self,
        store: ObjectStore,
        home: Path,
        policy: Policy,
        timeout_seconds: float,
        *,
        extra_env: dict[str, str] | None = None,
        limits: dict[str, Any] | None = None,
    ) -> None:
        """`store`: the one the invoker's store proxy serves each invocation from (scoped to
        its task); `extra_env`: added to the sandbox's allowlisted environment (the operator
        registry, Spark settings), as a worker's operator hosts get."""
        self.store, self.home, self.policy = store, home.resolve(), policy
        self.timeout = timeout_seconds
        self.extra_env = extra_env or {}
        self.limits = limits or {}
        self.log_path = self.home / "logs" / "lambda-local.log"

    def invoke(self, task: TaskPayload, event: bytes) -> Reply:
        hd = HostDir.create(self.home / "sandbox", f"lambda-{uuid.uuid4().hex[:8]}", self.policy)
        try:
            dirs = hd.new_task(f"{task.task_id}-{task.attempt}")
            scoped = ScopedStore(self.store, task, dirs.work, dirs.inbox, self.policy.uid)
            argv, plan = host_command(
                hd, self.home, [], self.limits, module="trace_platform.aws.lambda_local"
            )
            own_log = hd.root / "invocation.log"  # this one's alone: its tail names its end
            fd = os.open(own_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=fd,
                    env={**host_env(hd, self.extra_env), **plan},
                    cwd=hd.home,
                    start_new_session=True,
                    close_fds=True,
                )
            finally:
                os.close(fd)
            link = HostLink(proc)
            try:
                reply = self._converse(proc, link, dirs, scoped, event, own_log)
            finally:
                _kill(proc)
                link.close()
                self._keep_log(task, own_log)
            return reply
        finally:
            hd.remove()

    def _keep_log(self, task: TaskPayload, own_log: Path) -> None:
        """The invocation's log, appended to the invoker's (the sandbox's directory goes)."""
        with contextlib.suppress(OSError):
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as f, own_log.open("rb") as src:
                f.write(f"--- task {task.task_id} attempt {task.attempt}\n".encode())
                f.write(src.read(MAX_LOG_BYTES))

    def _converse(
        self,
        proc: subprocess.Popen[bytes],
        link: HostLink,
        dirs: TaskDirs,
        scoped: ScopedStore,
        event: bytes,
        own_log: Path,
    ) -> Reply:
        """The invocation to its end: its store calls answered, its result taken, or its
        timeout or death said."""
        deadline = time.monotonic() + self.timeout
        assert proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)  # writes have a deadline (write_msg)
        head = json.dumps({"type": "invoke", "workdir": str(dirs.work)})
        try:
            write_msg(proc, f'{head[:-1]}, "event": {event.decode()}}}\n'.encode())
        except OSError as e:
            return Reply(failure=f"the handler's process did not take the event: {e}")
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return Reply(failure=f"Task timed out after {self.timeout:.2f} seconds")
            out = link.get(timeout=left)
            if out is None:
                continue
            kind = out.get("type")
            if kind == "result":
                # As Lambda answers it: the handler's value as JSON, however it looks.
                return Reply(body=json.dumps(out.get("result")).encode())
            if kind == "store":
                scoped.used = True
                try:
                    write_msg(proc, {"type": "store_reply", **scoped.handle(out)})
                except OSError:
                    continue  # it died meanwhile: its exit comes next
                continue
            if kind == "exit":
                tail = _tail(own_log)
                return Reply(
                    failure=f"the handler's process died ({exit_reason(out['returncode'])})"
                    + (f"\n{tail}" if tail else "")
                )
            if kind == "protocol_error":
                return Reply(failure=f"the handler broke the protocol: {out.get('error')}")
            # Anything else: progress has no one to go to; a stray message is ignored.
            log.debug("lambda_local said %s", one_line(str(kind), 40))

    def close(self) -> None:
        return None


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """The invocation's whole process group, at once (its result is in, or it is over)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()


def _tail(path: Path, lines: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def make_invoker(
    settings: Settings,
    store: ObjectStore,
    policy: Policy,
    extra_env: dict[str, str] | None = None,
    limits: dict[str, Any] | None = None,
) -> Invoker:
    """The invoker `settings.lambda_invoker` names."""
    if settings.lambda_invoker == "aws":
        return AwsInvoker(
            settings.lambda_function,
            settings.lambda_timeout_seconds,
            settings.lambda_region,
            settings.lambda_endpoint_url,
        )
    return LocalInvoker(
        store,
        settings.home,
        policy,
        settings.lambda_timeout_seconds,
        extra_env=extra_env,
        limits=limits,
    )
