"""Operator isolation: where and as whom the operator host runs.

As root on Linux (the default for a shared install) the host runs in the sandbox: its own
unprivileged OS user, its own network, PID and mount namespaces (`sandbox/enter.py`), a fresh
directory per host and an empty scratch directory per task, an allowlisted environment, no
inherited file descriptors, and no view of the Trace home. Without root the host runs as the
worker's own user: a warning says isolation is reduced, and `TRACE_SANDBOX=required` refuses.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass

from trace_platform.config import Settings

log = logging.getLogger(__name__)


class SandboxUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Policy:
    """`uid`/`gid` None: the host runs as the worker's own user, with no namespaces."""

    mode: str
    uid: int | None = None
    gid: int | None = None
    user: str | None = None

    @property
    def isolated(self) -> bool:
        return self.uid is not None


def ensure_user(name: str) -> tuple[int, int]:
    """The sandbox's OS user (a system user with no home and no shell), created if missing."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        proc = subprocess.run(
            [
                useradd,
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode not in (0, 9):  # 9: created meanwhile by another worker
            raise SandboxUnavailable(
                f"cannot create the sandbox user '{name}': {proc.stderr}"
            ) from None
        pw = pwd.getpwnam(name)
    if pw.pw_uid == 0:
        raise SandboxUnavailable(f"the sandbox user '{name}' must not be root")
    return pw.pw_uid, pw.pw_gid


def resolve(settings: Settings) -> Policy:
    """What this worker can enforce, decided once at start."""
    mode = settings.sandbox
    if mode == "off":
        log.warning("operator sandbox is off (TRACE_SANDBOX=off): operators run as this user")
        return Policy(mode)
    why = None
    if not sys.platform.startswith("linux"):
        why = "the sandbox needs Linux namespaces"
    elif os.geteuid() != 0:
        why = "the worker is not root, so it cannot switch users or create namespaces"
    elif shutil.which("unshare") is None:
        why = "util-linux's `unshare` is missing (apt-get install util-linux)"
    if why is not None:
        if mode == "required":
            raise SandboxUnavailable(f"TRACE_SANDBOX=required but {why}")
        log.warning(
            "operator isolation is REDUCED: %s. Operators run as this worker's user, with its "
            "network and files (the wrapper still scopes the object store and the internal "
            "API credential). Run workers as root for the sandbox, or set TRACE_SANDBOX=required "
            "to refuse to start without it.",
            why,
        )
        return Policy(mode)
    uid, gid = ensure_user(settings.sandbox_user)
    return Policy(mode, uid, gid, settings.sandbox_user)
