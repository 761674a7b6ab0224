"""What a sandboxed operator host's CPU per no-op task is when many hosts take tasks in turn.

The end-to-end dispatch bench at 2 workers x 32 wrappers runs 64 hosts (a wrapper's host is
its own process), each taking about one task in 64: every task then starts on a cold CPU cache
(the host's own copy of the interpreter's objects, its code objects included, evicted by the
63 others). This bench sends the same no-op run messages, in series, straight to real hosts
(`OperatorHost`, in the sandbox when this machine can enforce it): to one host, then round-
robin over K, in interleaved pairs, and prints each row's host CPU per task (the host's whole
process tree, from /proc) and the ratio. Every row counts only its own answers and refuses to
print unless each of them was a `done`.
Run: `.venv/bin/python bench/host_bench.py [--hosts 64] [--tasks 6400] [--pairs 3]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import smoke  # this folder's: run as a script
from dispatch_bench import _ancestor_in, processes  # this folder's: run as a script
from trace_platform.config import Settings
from trace_platform.contract import TaskPayload
from trace_platform.sandbox import resolve
from trace_platform.worker.operator_host import OperatorHost

TENANT = ("bench-org", "bench-dag")


def noop_task() -> TaskPayload:
    task_id = uuid.uuid4()
    return TaskPayload.model_validate(
        {
            "task_id": task_id,
            "attempt": 1,
            "start_day": 1,
            "status": "running",
            "cancel_requested": False,
            "org_id": uuid.uuid4(),
            "dag_id": uuid.uuid4(),
            "dag_version": 1,
            "job": "bench",
            "operator": "noop",
            "runtime": "python",
            "config": {},
            "parent_task_id": None,
            "input_event": None,
            "worker_pool": None,
            "slot_index": None,
            "slot_env": {},
            "slot_secret_names": [],
            "inputs": [],
            "outputs": [],
            "run_id": uuid.uuid4(),
            "timeout_seconds": 60,
            "deadline_at": "2030-01-01T00:00:00Z",
            "lease_until": "2030-01-01T00:00:00Z",
            "heartbeat_seconds": 10,
            "idempotency": {"producer_task_id": task_id, "attempt": 1},
        }
    )


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of `root` and every process under it."""
    procs = processes()
    return sum(p.cpu for pid, p in procs.items() if _ancestor_in(pid, procs, {str(root)}))


def run_tasks(hosts: list[OperatorHost], task: TaskPayload, n: int) -> float:
    """`n` no-op tasks, one at a time, host after host; the hosts' CPU per task (seconds)."""
    body: dict[str, Any] = task.model_dump(mode="json")
    roots = [h.proc.pid for h in hosts if h.proc is not None]
    before = sum(tree_cpu(pid) for pid in roots)
    done = 0
    for i in range(n):
        host = hosts[i % len(hosts)]
        dirs = host.new_task(task)
        run = f"{task.task_id}/{i}"
        host.send({"type": "run", "run": run, "task": body, "env": {}, "workdir": str(dirs.work)})
        assert host.link is not None
        answer = host.link.get(timeout=30)
        if answer is not None and answer.get("type") == "done" and answer.get("run") == run:
            done += 1
        if not host.recycle(dirs):
            dirs.remove()
    after = sum(tree_cpu(pid) for pid in roots)
    if done != n:
        raise SystemExit(f"refusing to print: {done} of {n} tasks answered done")
    return (after - before) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--tasks", type=int, default=6400)
    ap.add_argument("--pairs", type=int, default=3)
    args = smoke.parse_args(ap, hosts=2, tasks=200, pairs=1)
    home = Path(tempfile.mkdtemp(prefix="trace-host-bench-", dir="/tmp"))
    home.chmod(0o755)
    settings = Settings(home=home, state_dsn="postgresql://unused/db")
    policy = resolve(settings)
    env = {"TRACE_OPERATOR_REGISTRY": "testing"}
    hosts = [OperatorHost(home, f"h{i}", policy, extra_env=env) for i in range(args.hosts)]
    task = noop_task()
    try:
        for host in hosts:
            host.ensure(TENANT)
        print(
            f"machine: {os.cpu_count()} cores; sandbox {policy.mode}"
            f" ({'isolated' if policy.isolated else 'not isolated'}); {args.hosts} hosts;"
            f" {args.tasks} no-op tasks a row, one at a time"
        )
        run_tasks(hosts, task, 4 * args.hosts)  # every host warm: its first tasks not timed
        one, many = [], []
        for _ in range(args.pairs):
            one.append(run_tasks(hosts[:1], task, args.tasks))
            many.append(run_tasks(hosts, task, args.tasks))
            print(
                f"host CPU per task: one host {one[-1] * 1e6:5.0f} us;"
                f" {args.hosts} hosts in turn {many[-1] * 1e6:5.0f} us"
            )
        if min(one) <= 0:  # the CPU clock ticks in 10 ms: too few tasks to measure
            raise SystemExit(f"refusing to print: one host's CPU per task measured {min(one)} s")
        ratio = statistics.median(m / o for m, o in zip(many, one, strict=True))
        print(f"median of the pairs' ratios ({args.hosts} hosts / one): {ratio:.2f}x")
    finally:
        for host in hosts:
            host.kill(grace=0)
            if host.dir is not None:
                host.dir.remove()
        time.sleep(0.1)


if __name__ == "__main__":
    smoke.main(main)
