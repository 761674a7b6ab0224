"""Text from operators and users, made safe to print on a terminal.

Operator code and other users choose what lands in error texts, progress reports, names and
query results. Printed raw, an ESC or C1 sequence in them can recolour, rewrite or hide what
the CLI shows, plant OSC-8 links, set the window title or ring the bell; rich's `escape()`
only guards its own markup, not the terminal. Every such text goes through `safe` (printed
with rich) or `printable` (written raw), which spell each control character out (`\\x1b`),
so the reader sees that it was there and the terminal never acts on it.
"""

from __future__ import annotations

from rich.markup import escape

# Bidi embeddings, overrides and isolates reorder what follows them on screen ("Trojan
# Source"): as misleading as a cursor move, though not C0/C1.
_BIDI = [0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]


def _table(keep: str) -> dict[int, str]:
    controls = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
    out = {c: f"\\x{c:02x}" for c in controls if chr(c) not in keep}
    out.update({c: f"\\u{c:04x}" for c in _BIDI})
    return out


# Newline and tab lay text out (a multi-line error, a table cell) and move no cursor back.
_MULTI_LINE = _table("\n\t")
_ONE_LINE = _table("")


def printable(text: object, *, one_line: bool = False) -> str:
    """`text` (any value, as `str()` shows it) with every C0 control but newline and tab (none
    when `one_line`), DEL, every C1 control (CSI 0x9b, OSC 0x9d …), ESC and the bidi controls
    spelled out as `\\xNN` / `\\uNNNN`. A carriage return is spelled out too: it would let the
    rest of a line overwrite what came before it."""
    return str(text).translate(_ONE_LINE if one_line else _MULTI_LINE)


def safe(text: object, *, one_line: bool = False) -> str:
    """`printable(text)` for rich: also escaped as markup, so `[red]` or a closing tag in
    someone's text is shown as typed instead of styling (or hiding) what follows."""
    return escape(printable(text, one_line=one_line))
