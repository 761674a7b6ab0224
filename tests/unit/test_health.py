"""`python -m trace_platform.health ROLE` (the compose services' health checks): a check whose
dependency does not answer fails, naming it; and what it prints goes into the container's
health log, so no secret of the settings is in it, not even a DSN's password that libpq quotes
back when it cannot parse it."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator

import pytest

from trace_platform import health
from trace_platform.config import Settings


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port bound but not listening: a connection to it is refused at once."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    yield holder.getsockname()[1]
    holder.close()


def test_a_state_store_that_does_not_answer_fails_the_check(refused_port: int) -> None:
    dsn = f"postgresql://trace:pw@127.0.0.1:{refused_port}/trace"
    (failed,) = health.run("delivery", Settings(state_dsn=dsn))
    assert failed.startswith("state store: OperationalError")
    assert health.main(["nope"]) == 2


def test_no_secret_is_in_a_failed_checks_answer(refused_port: int) -> None:
    settings = Settings(
        # A password libpq cannot decode: its error quotes it back.
        state_dsn=f"postgresql://trace:S3CRET%zz@127.0.0.1:{refused_port}/trace",
        data_dsn=f"postgresql://sink:S3CRET-SINK@127.0.0.1:{refused_port}/trace",
    )
    failed = health.run("sink", settings)
    assert [f.split(":")[0] for f in failed][:2] == ["state store", "data login"]
    assert not any("S3CRET" in f for f in failed), failed


def test_an_unverified_check_leaves_the_shared_verifying_context_alone(refused_port: int) -> None:
    """The api check only asks whether https answers; it once switched verification off on the
    process's shared context, after which every worker client in the process trusted any
    certificate (found as a flaky TLS test)."""
    from trace_platform.sandbox.gateway import verified_tls

    check = health._http_ok(f"https://127.0.0.1:{refused_port}", verify=False)
    with pytest.raises(OSError):
        check()
    shared = verified_tls()
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname
