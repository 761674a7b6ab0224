"""The operator host's resource limits as `sandbox/enter.py` applies them: a cgroup v2 of its
own where the worker may make one (here a stand-in directory: this machine's cgroup v2 mount has
no controllers), else rlimits on the process that becomes the host."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import pytest

from trace_platform.config import Settings
from trace_platform.sandbox import enter
from trace_platform.sandbox.hostdir import resource_limits


def test_settings_become_the_hosts_limits() -> None:
    limits = resource_limits(
        Settings(sandbox_memory_mb=512, sandbox_pids=64, sandbox_cpus=1.5, sandbox_nofile=256)
    )
    assert limits == {
        "memory_mb": 512,
        "pids": 64,
        "cpus_milli": 1500,
        "nofile": 256,
        "cgroup_parent": None,
    }


def test_a_delegated_cgroup_v2_gets_a_child_per_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = tmp_path / "trace.slice"
    parent.mkdir()
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (parent / "cgroup.controllers").write_text("cpu memory pids\n")
    (parent / "cgroup.subtree_control").write_text("cpu\n")
    monkeypatch.setattr(enter, "CGROUP_ROOT", tmp_path)
    limits = {"memory_mb": 512, "pids": 64, "cpus_milli": 1500, "cgroup_parent": "/trace.slice"}
    cg = enter.make_cgroup({**limits, "name": "w-1"})
    assert cg == parent / "trace-sandbox-w-1"
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids"  # cpu was on
    assert (cg / "memory.max").read_text() == str(512 << 20)
    assert (cg / "memory.swap.max").read_text() == "0"
    assert (cg / "pids.max").read_text() == "64"
    assert (cg / "cpu.max").read_text() == "150000 100000"


def test_without_cgroup_v2_controllers_rlimits_are_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(enter, "CGROUP_ROOT", tmp_path)  # no cgroup.controllers: not v2
    assert enter.make_cgroup({"memory_mb": 512, "cgroup_parent": "/x"}) is None
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "cgroup.controllers").write_text("cpu\n")  # no memory, no pids
    assert enter.make_cgroup({"memory_mb": 512, "cgroup_parent": "/x"}) is None


def test_rlimits_bind_the_host_process() -> None:
    """In a child (as the host is): hard limits, which the host cannot raise again."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the host to be
        try:
            os.close(read)
            enter.limit({"memory_mb": 256, "pids": 4000, "nofile": 128}, None)
            got = {
                name: resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))
                for name in ("DATA", "NPROC", "NOFILE", "AS")
            }
            try:
                bytearray(512 << 20)
                got["allocated"] = True
            except MemoryError:
                got["allocated"] = False
            os.write(write, json.dumps(got).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        got = json.loads(f.read())
    os.waitpid(pid, 0)
    assert got["DATA"] == [256 << 20, 256 << 20]
    assert got["NOFILE"] == [128, 128]
    assert got["AS"][0] == resource.RLIM_INFINITY  # not the address space: a JVM needs it
    assert got["NPROC"] == [4000, 4000]
    assert got["allocated"] is False
