"""Listening sockets inside another process's network namespace, held by the trusted side.

A socket keeps the namespace it was created in, so a short-lived thread joins the sandbox's
namespace (setns affects only the calling thread), binds a loopback listener there, and goes
back. The sandbox then reaches 127.0.0.1:port and nothing else; the trusted side accepts those
connections and decides where they may go.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def listen_in(pid: int, port: int = 0) -> socket.socket:
    """A TCP listener on 127.0.0.1:`port` (0: any free port) in `pid`'s network namespace."""
    result: list[socket.socket | BaseException] = []

    def run() -> None:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(target)
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
                sock.listen(64)
                result.append(sock)
            finally:
                _setns(home)
        except BaseException as e:
            result.append(e)
        finally:
            os.close(home)
            os.close(target)

    t = threading.Thread(target=run, name="netns-listen")
    t.start()
    t.join()
    out = result[0]
    if isinstance(out, BaseException):
        raise out
    return out
