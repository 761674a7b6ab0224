"""Settings an AWS deployment must not start with: each is refused at start, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from trace_platform.config import Settings

DSN = "postgresql://trace@127.0.0.1:5432/trace"


def test_the_aws_profile_refuses_keyless_calls(tmp_path: Path) -> None:
    """TRACE_AUTH=permissive (a call without a key acts as Lite's admin, made on the spot) is
    Lite's alone: behind API Gateway it would let anyone on the internet fire any webhook."""
    with pytest.raises(ValidationError, match="TRACE_AUTH=permissive is Lite's"):
        Settings(
            profile="aws",
            state_dsn=DSN,
            auth="permissive",
            home=tmp_path,
            operator_registry="production",
        )
    Settings(profile="lite", auth="permissive", home=tmp_path)  # Lite's default


def test_the_lambda_queue_is_not_the_workers(tmp_path: Path) -> None:
    """A lambda task's wake-ups on the platform workers' queue would be claimed and handed back
    by every worker in turn, forever."""
    with pytest.raises(ValidationError, match="TRACE_LAMBDA_QUEUE must differ"):
        Settings(home=tmp_path, lambda_queue="jobs", task_queue="jobs")
