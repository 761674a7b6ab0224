"""The operator host's directories and launch command (trusted side).

    {home}/sandbox/                  root 0711: not listable
      {worker}-{random}/             root 0755: one per host process, removed with it
        home/  tmp/                  sandbox user 0700: HOME and TMPDIR (Spark's local dirs)
        task/{task}-{attempt}-{r}/   root 0755: one per task run, removed after it (or, left
                                     empty, reused by the host's next run: see `recycle`)
          work/                      sandbox user 0700: the operator's empty scratch (its cwd)
          in/                        root 0755: inputs the wrapper staged (read-only to it)

Everything the sandbox user owns sits in directories it cannot rename, so the wrapper (root)
never follows a path the operator planted.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trace_platform
from trace_platform.config import Settings
from trace_platform.sandbox import Policy


def _chown(path: Path, policy: Policy) -> None:
    if policy.isolated:
        assert policy.uid is not None and policy.gid is not None
        os.chown(path, policy.uid, policy.gid)


def _identity(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    return st.st_ino, st.st_mode, st.st_uid


@dataclass(frozen=True)
class TaskDirs:
    root: Path
    work: Path
    inbox: Path
    # (inode, mode, owner) of work and inbox as made: `unchanged` compares against it.
    made: tuple[tuple[int, int, int], ...] = ()

    def unchanged(self) -> bool:
        """Both empty, with the inode, mode and owner they were made with: a run left nothing
        in them and changed nothing about them (it cannot replace them: their parent is
        root's)."""
        try:
            if not self.made or tuple(_identity(p) for p in (self.work, self.inbox)) != self.made:
                return False
            for path in (self.work, self.inbox):
                with os.scandir(path) as entries:
                    if next(entries, None) is not None:
                        return False
        except OSError:
            return False
        return True

    def remove(self) -> None:
        # Most tasks leave both empty: three rmdirs (which never follow a symlink, and fail on
        # anything not empty) instead of rmtree's walk; anything left takes the walk.
        try:
            for path in (self.work, self.inbox, self.root):
                os.rmdir(path)
        except OSError:
            shutil.rmtree(self.root, ignore_errors=True)  # fd-based: never follows a symlink


@dataclass(frozen=True)
class HostDir:
    root: Path
    policy: Policy
    # One run's directories, left empty, kept for the next run of this host (see `recycle`).
    spare: list[TaskDirs] = field(default_factory=list, compare=False)

    @classmethod
    def create(cls, base: Path, name: str, policy: Policy) -> HostDir:
        base = base.resolve()  # the sandbox plan and the host's cwd need absolute paths
        base.mkdir(parents=True, exist_ok=True)
        base.chmod(0o711)
        root = base / f"{name}-{uuid.uuid4().hex[:12]}"
        root.mkdir(mode=0o755)
        for sub in ("home", "tmp"):
            (root / sub).mkdir(mode=0o700)
            _chown(root / sub, policy)
        (root / "task").mkdir(mode=0o755)
        return cls(root, policy)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def new_task(self, label: str) -> TaskDirs:
        if self.spare:
            return self.spare.pop()
        root = self.root / "task" / f"{label}-{uuid.uuid4().hex[:8]}"
        root.mkdir(mode=0o755)
        work, inbox = root / "work", root / "in"
        work.mkdir(mode=0o700)
        _chown(work, self.policy)
        inbox.mkdir(mode=0o755)
        return TaskDirs(root, work, inbox, (_identity(work), _identity(inbox)))

    def recycle(self, dirs: TaskDirs) -> bool:
        """Keeps a finished run's directories for this host's next run when the run left them
        as they were made (empty, same inodes, modes and owners); False: the caller removes
        them. Making and removing three directories per run churned ext4's inodes: each new
        one is looked for past the recently deleted ones, and at a few hundred runs a second
        that cost up to about 1 ms of kernel time per run. The host runs one task at a time
        and its runs are one tenant's (a host serves one DAG), so its next run sees nothing
        this one could not have left in the host's HOME or TMPDIR anyway."""
        if self.spare or dirs.root.parent != self.root / "task" or not dirs.unchanged():
            return False
        self.spare.append(dirs)
        return True

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def host_env(hd: HostDir, extra: dict[str, str]) -> dict[str, str]:
    """The host's whole environment: an allowlist, never the worker's own variables."""
    venv_bin = Path(sys.executable).parent
    env = {
        "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(hd.home),
        "TMPDIR": str(hd.tmp),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(hd.tmp),
    }
    for key in ("JAVA_HOME", "TZ", "TRACE_SPARK_SHUFFLE_PARTITIONS", "TRACE_SPARK_DRIVER_MEMORY"):
        if key in os.environ:
            env[key] = os.environ[key]
    return {**env, **extra}


def operator_host_env(settings: Settings) -> dict[str, str]:
    """What a worker's operator hosts (and the local Lambda invoker's sandboxes) learn of its
    settings: their environment is otherwise an allowlist (`host_env`)."""
    return {
        "TRACE_SPARK_MASTER": settings.spark_master,
        "TRACE_SPARK_CONF": json.dumps(settings.spark_conf),
        "TRACE_SPARK_JIT": settings.spark_jit,
        "TRACE_OPERATOR_REGISTRY": settings.operator_registry,
    }


def _java_home() -> Path | None:
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"]).resolve()
    java = shutil.which("java")
    return Path(java).resolve().parents[1] if java else None


def exposures(hd: HostDir, extra_binds: list[Path]) -> list[tuple[str, bool]]:
    """What the sandbox sees of the machine besides its system dirs: (path, writable)."""
    ro = {
        Path(sys.base_prefix).resolve(),
        Path(sys.prefix).resolve(),
        Path(trace_platform.__file__).resolve().parents[1],
    }
    if (java := _java_home()) is not None:
        ro.add(java)
    out = [(str(p), False) for p in sorted(ro)]
    out.append((str(hd.root), True))
    out.extend((str(Path(p).resolve()), True) for p in extra_binds)
    return out


def resource_limits(settings: Settings) -> dict[str, Any]:
    """A sandboxed host's limits as `enter.py` applies them (0: none)."""
    return {
        "memory_mb": settings.sandbox_memory_mb,
        "pids": settings.sandbox_pids,
        "cpus_milli": round(settings.sandbox_cpus * 1000),
        "nofile": settings.sandbox_nofile,
        "cgroup_parent": settings.sandbox_cgroup,
    }


def _project_root() -> Path | None:
    """The source checkout of an editable install (`src/` layout): hidden in the sandbox
    except for what it needs (its `src/` and virtualenv come back as read-only exposures)."""
    src = Path(trace_platform.__file__).resolve().parents[1]
    return src.parent if src.name == "src" else None


def host_command(
    hd: HostDir,
    trace_home: Path,
    extra_binds: list[Path],
    limits: dict[str, Any] | None = None,
    module: str = "trace_platform.worker.host_main",
) -> tuple[list[str], dict[str, str]]:
    """The host's argv and the extra env that carries the sandbox plan to `enter.py` (in the
    environment of its root-owned PID 1, which the sandbox cannot read; not on argv, which
    /proc shows to anyone). `limits`: see `resource_limits`; `module`: the program the
    sandbox runs (the Lambda invoker's runs `trace_platform.aws.lambda_local`)."""
    host = [sys.executable, "-m", module]
    if not hd.policy.isolated:
        return host, {}
    hide = [str(p) for p in (_project_root(), trace_home.resolve()) if p is not None]
    cfg = {
        "uid": hd.policy.uid,
        "gid": hd.policy.gid,
        "cwd": str(hd.home),
        "expose": exposures(hd, extra_binds),
        "hide": hide,
        "argv": host,
        "limits": {**(limits or {}), "name": hd.root.name},
    }
    enter = Path(__file__).with_name("enter.py")
    argv = [
        "setpriv",
        "--pdeathsig",
        "KILL",
        "unshare",
        "--net",
        "--pid",
        "--ipc",
        "--uts",
        "--mount-proc",
        "--fork",
        "--kill-child",
        "--propagation",
        "private",
        sys.executable,
        "-I",
        str(enter),
    ]
    return argv, {"TRACE_SANDBOX_CONFIG": json.dumps(cfg)}
