"""cli/safe_text: every control character a terminal would act on is spelled out."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
from rich.console import Console

from trace_platform.cli.query import result_table
from trace_platform.cli.safe_text import printable, safe
from trace_platform.query.service import Result


def test_every_c0_c1_del_and_bidi_control_is_spelled_out() -> None:
    controls = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]
    controls += ["\u200e", "\u200f", "\u202a", "\u202e", "\u2066", "\u2069"]
    for c in controls:
        kept = c in "\n\t"
        assert (printable(c) == c) is kept, repr(c)
        assert printable(c, one_line=True) != c, repr(c)
    assert printable("\x1b[31m") == "\\x1b[31m"
    assert printable("\x9b") == "\\x9b" and printable("\u202e") == "\\u202e"
    # Ordinary text, including non-ASCII and emoji joiners, is left as it is.
    assert printable("zoë 👩\u200d💻 ±1") == "zoë 👩\u200d💻 ±1"
    assert printable(None) == "None"


def test_safe_also_shows_markup_as_typed() -> None:
    hostile = "[bold]y[/bold] \x1b]8;;u\x07 z\\"  # a trailing backslash would eat a tag
    out = io.StringIO()
    Console(file=out, width=200).print(f"[red]{safe(hostile)}[/red] x")
    assert out.getvalue() == "[bold]y[/bold] \\x1b]8;;u\\x07 z\\ x\n"


def test_query_results_are_shown_with_their_controls_spelled_out() -> None:
    table = pa.table({"n\x1b[2Jame": ["\x1b]8;;https://evil/\x1b\\a\x1b]8;;\x1b\\", "\x9b2J"]})
    plan: Any = type("P", (), {"versions": {}})()
    out = io.StringIO()
    # A terminal that takes colour: only rich's own styles may be escape sequences.
    Console(file=out, width=200, force_terminal=True, color_system=None).print(
        result_table(Result(table, plan, 1.0))
    )
    text = out.getvalue()
    assert "\x1b" not in text and "\x9b" not in text and "\x07" not in text
    assert "\\x1b]8;;https://evil/" in text and "\\x9b2J" in text and "n\\x1b[2Jame" in text
