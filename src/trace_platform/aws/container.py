"""One Services per Lambda container: built on the first invocation from the environment
(TRACE_PROFILE=aws, TRACE_STATE_DSN, TRACE_INTERNAL_TOKEN, ...), then kept for every later
invocation the container serves, as Lambda's guide advises for connections (init once, reuse)."""

from __future__ import annotations

import threading

from trace_platform.config import get_settings
from trace_platform.services import Services

_lock = threading.Lock()
_services: Services | None = None


def services() -> Services:
    global _services
    with _lock:  # Lambda runs one invocation at a time, but a test or a server may not
        if _services is None:
            _services = Services.build(get_settings())
        return _services


def install(given: Services | None) -> None:
    """Serve invocations with `given` (a process that has its Services already, a test), or
    with None build them again on the next invocation. The caller owns what it installs."""
    global _services
    with _lock:
        _services = given
