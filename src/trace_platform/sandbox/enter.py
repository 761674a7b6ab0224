"""Inside the operator sandbox, before the operator host starts (stdlib only: it runs as root).

`unshare --net --pid --mount --mount-proc --fork` has already given this process (PID 1 of the
new PID namespace) its own network, PID and mount namespaces and a /proc that shows only the
sandbox. Here, still as root: loopback up, private /tmp, /var/tmp and /dev/shm, the Trace home
hidden, the directories the host needs (Python, the virtualenv, Java, the host's own directory)
made reachable at their real paths through any ancestor the sandbox user cannot enter. Then one
child drops to the sandbox user (no groups, no capabilities, no_new_privs) and execs the host;
PID 1 stays only to forward SIGTERM and reap, so the host's death ends the namespace.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import socket
import stat
import struct
import sys
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


def drop_and_exec(cfg: dict[str, Any]) -> None:
    uid, gid = int(cfg["uid"]), int(cfg["gid"])
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
    try:
        prepare(cfg)
    except OSError as e:
        print(f"trace sandbox: setup failed: {e}", file=sys.stderr)
        sys.exit(70)
    child = os.fork()
    if child == 0:
        try:
            drop_and_exec(cfg)
        except BaseException as e:
            print(f"trace sandbox: could not start the host: {e!r}", file=sys.stderr)
        finally:
            os._exit(71)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGTERM))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:  # PID 1: reap everything; leave with the host
        try:
            pid, status = os.wait()
        except ChildProcessError:
            sys.exit(0)
        except InterruptedError:
            continue
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            sys.exit(128 - code if code < 0 else code)


if __name__ == "__main__":
    main()
