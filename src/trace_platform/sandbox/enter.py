"""Inside the operator sandbox, before the operator host starts (stdlib only: it runs as root).

`unshare --net --pid --mount --mount-proc --fork` has already given this process (PID 1 of the
new PID namespace) its own network, PID and mount namespaces and a /proc that shows only the
sandbox. Here, still as root: loopback up, private /tmp, /var/tmp and /dev/shm, the Trace home
hidden, the directories the host needs (Python, the virtualenv, Java, the host's own directory)
made reachable at their real paths through any ancestor the sandbox user cannot enter. Then one
child takes the host's resource limits (`limit`), drops to the sandbox user (no groups, no
capabilities, no_new_privs) and execs the host; PID 1 stays only to forward SIGTERM and reap, so
the host's death ends the namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import resource
import signal
import socket
import stat
import struct
import sys
import time
from pathlib import Path
from typing import Any

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC = 4096, 16384
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG = 38, 1
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    if (
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        )
        != 0
    ):
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def tmpfs(target: str, mode: str, size: str) -> None:
    _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode},size={size}")


def traversable(path: Path, uid: int, gid: int) -> bool:
    st = path.stat()
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def expose(path: Path, fd: int, writable: bool, uid: int, gid: int) -> None:
    """Makes `path` (opened as `fd` before anything was covered) visible at the same path."""
    node = Path("/")
    for part in path.parts[1:-1]:
        node = node / part
        if not node.exists():
            node.mkdir(mode=0o755)
        elif not traversable(node, uid, gid):
            tmpfs(str(node), "0755", "1m")  # hides the rest of it; exposures come back below
    if not path.exists():
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            path.mkdir(mode=0o755)
        else:
            path.touch(mode=0o644)
    _mount(f"/proc/self/fd/{fd}", str(path), None, MS_BIND | MS_REC, None)
    # A bind copies its source's flags, and every source is read-only by now.
    ro = MS_RDONLY if not writable else 0
    _mount("none", str(path), None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | ro, None)


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def read_only_everything() -> None:
    """Every mount of the machine read-only in this namespace (so no world-writable place,
    like /run/lock, is shared between sandboxes); /proc, /sys and /dev keep their own rules."""
    keep = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point, options = _unescape(fields[4]), fields[5].split(",")
        if point.startswith(("/proc", "/sys", "/dev")):
            continue
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        for opt in options:
            flags |= keep.get(opt, 0)
        try:
            _mount("none", point, None, flags, None)
        except OSError as e:
            print(f"trace sandbox: could not make {point} read-only: {e}", file=sys.stderr)


def prepare(cfg: dict[str, Any]) -> None:
    uid, gid = int(cfg["uid"]), int(cfg["gid"])
    loopback_up()
    exposures = sorted(
        ((Path(p), bool(rw)) for p, rw in cfg["expose"]), key=lambda e: len(e[0].parts)
    )
    fds = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC), rw) for p, rw in exposures if p.exists()]
    read_only_everything()
    for target in ("/tmp", "/var/tmp"):
        tmpfs(target, "1777", cfg.get("tmp_size", "256m"))
    if Path("/dev/shm").is_dir():
        tmpfs("/dev/shm", "1777", "64m")
    if Path("/dev/mqueue").is_dir():  # the machine's POSIX queues, not this IPC namespace's
        tmpfs("/dev/mqueue", "0755", "1m")
    for hidden in sorted(cfg.get("hide", []), key=len):
        if Path(hidden).is_dir():
            tmpfs(hidden, "0755", "1m")
    for path, fd, rw in fds:
        expose(path, fd, rw, uid, gid)
        os.close(fd)


CGROUP_ROOT = Path("/sys/fs/cgroup")


def make_cgroup(limits: dict[str, Any]) -> Path | None:
    """The host's own cgroup v2, under `limits["cgroup_parent"]` (a cgroup delegated to the
    worker, with no process of its own) or else the worker's own cgroup, with memory.max,
    pids.max and cpu.max set; None where the machine has no cgroup v2 with those controllers for
    it (cgroup v1, a hybrid mount, a container without delegation): rlimits then."""
    if not (CGROUP_ROOT / "cgroup.controllers").is_file():  # not a pure cgroup v2 mount
        return None
    own = next(
        (ln[3:] for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln[:3] == "0::"),
        None,
    )
    parent_path = limits.get("cgroup_parent") or own
    if not parent_path:
        return None
    parent = CGROUP_ROOT / str(parent_path).lstrip("/")
    try:
        available = (parent / "cgroup.controllers").read_text().split()
        want = [c for c in ("memory", "pids", "cpu") if c in available]
        if "memory" not in want or "pids" not in want:
            return None
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        missing = " ".join(f"+{c}" for c in want if c not in enabled)
        if missing:  # refused (EBUSY) while the parent holds processes: rlimits then
            (parent / "cgroup.subtree_control").write_text(missing)
        cg = parent / f"trace-sandbox-{limits.get('name', os.getpid())}"
        cg.mkdir(exist_ok=True)
        memory, pids, cpus = (int(limits.get(k) or 0) for k in ("memory_mb", "pids", "cpus_milli"))
        if memory:
            (cg / "memory.max").write_text(str(memory << 20))
            with contextlib.suppress(OSError):  # no swap to spill into past the limit
                (cg / "memory.swap.max").write_text("0")
        if pids:
            (cg / "pids.max").write_text(str(pids))
        if cpus and "cpu" in want:
            (cg / "cpu.max").write_text(f"{cpus * 100} 100000")  # milli-CPUs per 100 ms
        return cg
    except OSError as e:
        print(f"trace sandbox: no cgroup v2 limits ({e}); using rlimits", file=sys.stderr)
        return None


def remove_cgroup(cg: Path) -> None:
    """Kills what is left in the host's cgroup and removes it (the host has exited)."""
    with contextlib.suppress(OSError):
        (cg / "cgroup.kill").write_text("1")
    for _ in range(100):  # its processes die asynchronously: up to about a second
        try:
            cg.rmdir()
            return
        except OSError:
            time.sleep(0.01)


def limit(limits: dict[str, Any], cgroup: Path | None) -> None:
    """This process (the host to be) into its cgroup, else its rlimits: RLIMIT_DATA (not
    RLIMIT_AS: a local Spark JVM reserves far more address space than it uses, and failed to
    start under 4 GB of it, while 1 GB of RLIMIT_DATA ran a shuffle), RLIMIT_NPROC (per OS user:
    every sandbox shares it) and RLIMIT_NOFILE either way. Hard limits: the host cannot raise
    them."""
    memory, pids, nofile = (int(limits.get(k) or 0) for k in ("memory_mb", "pids", "nofile"))
    if cgroup is not None:
        (cgroup / "cgroup.procs").write_text("0")  # "0": the writing process
    else:
        if memory:
            resource.setrlimit(resource.RLIMIT_DATA, (memory << 20, memory << 20))
        if pids:
            resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))
    if nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))


def drop_and_exec(cfg: dict[str, Any], cgroup: Path | None = None) -> None:
    uid, gid = int(cfg["uid"]), int(cfg["gid"])
    limit(cfg.get("limits") or {}, cgroup)
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # cleared by setuid: set again
    os.chdir(cfg["cwd"])
    os.umask(0o077)
    os.execv(cfg["argv"][0], cfg["argv"])  # the plan left the environment in main()


def main() -> None:
    cfg = json.loads(os.environ.pop("TRACE_SANDBOX_CONFIG"))
    # Before the mounts: /sys stays writable in this namespace, but a cgroup found first is
    # one less thing that can go wrong.
    cgroup = make_cgroup(cfg.get("limits") or {})
    try:
        prepare(cfg)
    except OSError as e:
        print(f"trace sandbox: setup failed: {e}", file=sys.stderr)
        sys.exit(70)
    child = os.fork()
    if child == 0:
        try:
            drop_and_exec(cfg, cgroup)
        except BaseException as e:
            print(f"trace sandbox: could not start the host: {e!r}", file=sys.stderr)
        finally:
            os._exit(71)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGTERM))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 0
    while True:  # PID 1 (outside the host's cgroup): reap everything; leave with the host
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            break
    if cgroup is not None:
        remove_cgroup(cgroup)
    sys.exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main()
