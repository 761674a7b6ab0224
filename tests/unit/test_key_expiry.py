"""A key's expiry as `trace keys` and /v1/keys take it (control/identity.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from trace_platform.control.identity import expiry, parse_duration
from trace_platform.errors import Invalid

NOW = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15m", 900), ("12h", 43200), ("30d", 2592000), ("2w", 1209600)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["soon", "0", "-5m", "3y", "", "1.5.2h"])
def test_bad_durations_are_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(Invalid, match="is not a positive duration like 3600, 90s"):
        parse_duration(text)


def test_expiry() -> None:
    assert expiry(None, None, NOW) is None
    assert expiry(timedelta(hours=1), None, NOW) == NOW + timedelta(hours=1)
    at = NOW + timedelta(days=1)
    assert expiry(None, at, NOW) == at
    with pytest.raises(Invalid, match="not both"):
        expiry(timedelta(hours=1), at, NOW)
    with pytest.raises(Invalid, match="needs a time zone"):
        expiry(None, at.replace(tzinfo=None), NOW)
    with pytest.raises(Invalid, match="is not in the future"):
        expiry(None, NOW, NOW)
