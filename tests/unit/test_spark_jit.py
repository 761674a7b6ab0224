"""The JVM compiler profile (TRACE_SPARK_JIT): validated in the worker's settings, handed to its
operator hosts, and turned into the JVM's options there."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from trace_platform import spark as tspark
from trace_platform.cli.main import operator_host_env
from trace_platform.config import Settings


def test_the_workers_profile_reaches_its_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRACE_SPARK_JIT")  # the suite runs on quick (tests/conftest.py)
    assert operator_host_env(Settings(home=tmp_path))["TRACE_SPARK_JIT"] == "full"
    quick = Settings(home=tmp_path, spark_jit="quick")
    assert operator_host_env(quick)["TRACE_SPARK_JIT"] == "quick"
    with pytest.raises(ValidationError, match="spark_jit"):
        Settings(home=tmp_path, spark_jit="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("profile", "c2"),
    [({}, True), ({"TRACE_SPARK_JIT": "full"}, True), ({"TRACE_SPARK_JIT": "quick"}, False)],
)
def test_the_profile_becomes_the_jvms_options(profile: dict[str, str], c2: bool) -> None:
    opts = tspark.jit_options(profile)
    assert opts.startswith(tspark.JIT_OPTIONS)  # huge stages compiled either way
    assert ("-XX:TieredStopAtLevel=1" not in opts) is c2


def test_an_unknown_profile_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="TRACE_SPARK_JIT: 'fast'"):
        tspark.jit_options({"TRACE_SPARK_JIT": "fast"})


def test_the_host_starts_its_jvm_with_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACE_SPARK_JIT", "quick")
    opts = tspark._conf_options(tmp_path)
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        assert "-XX:TieredStopAtLevel=1" in opts[key], key
