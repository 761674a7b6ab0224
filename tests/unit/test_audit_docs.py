"""docs/audit.md names every action of the audit log's vocabulary (audit.ACTIONS)."""

from __future__ import annotations

from pathlib import Path

from trace_platform import audit

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"


def test_the_audit_page_names_every_action() -> None:
    text = DOC.read_text()
    missing = [a for a in audit.ACTIONS if f"`{a}`" not in text]
    assert missing == [], f"docs/audit.md does not name {missing}"
