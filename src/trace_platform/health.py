"""`python -m trace_platform.health ROLE`: a service's health check (deploy/docker-compose.yml).

Each role's check asks, from where the service runs and with its own settings, whether what it
needs answers: the API its /healthz and the workers' exchange listener; a worker the state store,
the API, the exchange listener and the object store; a sink the state store, its data login and
the object store; a Delivery Service and a scheduler the state store. Exit 0 when all answer,
else 1 with one line per failure on stderr. It is not a liveness probe of the service's loop:
the service is its container's PID 1, so a crash ends the container.

It imports neither the CLI nor the services (nor psycopg or boto3 where a role needs neither): a
check runs every few seconds in every container, so it should cost little CPU.
"""

from __future__ import annotations

import socket
import ssl
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pydantic import SecretStr

from trace_platform.config import _DSN_PASSWORD, Settings, url_host
from trace_platform.tls import client_context

TIMEOUT = 5.0
ROLES = ("api", "worker", "sink", "delivery", "scheduler")

Check = Callable[[], None]


def _http_ok(url: str, ca_bundle: Path | None = None, *, verify: bool = True) -> Check:
    """An https `url` is verified as a worker verifies the API (`ca_bundle`, else certifi's
    CAs); without `verify`, only whether it answers."""

    def check() -> None:
        tls = None
        if url.startswith("https:") and verify:
            tls = client_context(ca_bundle)
        elif url.startswith("https:"):
            # A context of its own: client_context(None) is the process's shared verifying
            # one (every worker client and gateway), which must never be loosened.
            tls = ssl.create_default_context()
            tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
        # urlopen raises HTTPError for any status >= 400.
        healthz = f"{url.rstrip('/')}/healthz"
        with urllib.request.urlopen(healthz, timeout=TIMEOUT, context=tls) as r:
            if r.status != 200:
                raise RuntimeError(f"{url}/healthz answered {r.status}")

    return check


def _tcp(host: str, port: int) -> Check:
    def check() -> None:
        socket.create_connection((host, port), timeout=TIMEOUT).close()

    return check


def _url_tcp(url: str) -> Check:
    parts = urlsplit(url)
    return _tcp(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))


def _postgres(dsn: str) -> Check:
    def check() -> None:
        import psycopg

        # A connection is a full login: the server is up, accepts it, and the database exists.
        psycopg.connect(dsn, connect_timeout=int(TIMEOUT)).close()

    return check


def _object_store(settings: Settings) -> Check:
    def check() -> None:
        from trace_platform.objectstore import make_store

        make_store(settings).list_page("health/", limit=1)  # the bucket is there and readable

    return check


def _state(settings: Settings) -> Check:
    if settings.state_dsn is None:  # the embedded cluster: the service itself starts it
        return lambda: None
    return _postgres(settings.state_dsn.get_secret_value())


def checks(role: str, settings: Settings) -> dict[str, Check]:
    """The named checks of `role`."""
    if role == "api":
        host = url_host(settings.api_host)
        # Its own listener, on this host: whether it answers, not who it is (a certificate
        # names the host workers use, which need not be this address).
        scheme = "https" if settings.api_tls_cert is not None else "http"
        out = {"api": _http_ok(f"{scheme}://{host}:{settings.api_port}", verify=False)}
        if settings.exchange_port is not None:
            out["exchange listener"] = _tcp(host.strip("[]"), settings.exchange_port)
        return out
    out = {"state store": _state(settings)}
    if role == "worker":
        out["api"] = _http_ok(settings.resolved_api_url, settings.api_ca_bundle)
        if settings.exchange_url:
            out["exchange listener"] = _url_tcp(settings.exchange_url)
        out["object store"] = _object_store(settings)
    elif role == "sink":
        if settings.data_dsn is not None:
            out["data login"] = _postgres(settings.data_dsn.get_secret_value())
        out["object store"] = _object_store(settings)
    elif role not in ("delivery", "scheduler"):
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    return out


def _hidden(settings: Settings) -> list[str]:
    """What no check's answer may show (it is kept in the container's health log): every
    secret setting, and each DSN's password as written and decoded (libpq quotes a malformed
    one back: 'invalid percent-encoded token: "..."'). Longest first."""
    out: set[str] = set()
    for value in settings.model_dump().values():
        if isinstance(value, SecretStr):
            raw = value.get_secret_value()
            out.add(raw)
            for m in _DSN_PASSWORD.finditer(raw):
                token = m.group(2).strip("'")
                out.update((token, unquote(token)))
    return sorted((s for s in out if s), key=len, reverse=True)


def run(role: str, settings: Settings | None = None) -> list[str]:
    """Every failed check of `role`, as "name: reason" (empty: healthy), no secret in it."""
    settings = settings or Settings()
    failed = []
    for name, check in checks(role, settings).items():
        try:
            check()
        except Exception as e:  # any failure is the answer, never a traceback
            failed.append(f"{name}: {type(e).__name__}: {e}")
    if failed:
        hidden = _hidden(settings)
        for i, line in enumerate(failed):
            for secret in hidden:
                line = line.replace(secret, "****")
            failed[i] = line
    return failed


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ROLES:
        print(f"usage: python -m trace_platform.health {{{','.join(ROLES)}}}", file=sys.stderr)
        return 2
    failed = run(argv[0])
    for line in failed:
        print(f"unhealthy: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
