"""The tutorial's runnable blocks, read from the markdown they are written in.

A fenced block runs in the tutorial's test when an HTML comment right before it says how:

    <!-- test: file squares.yaml -->            the block is that file's whole text
    <!-- test: run; expect: 385 -->             run it with bash; it exits 0 and prints `385`
    <!-- test: run; until: version 2 live -->   run it again (1 s apart) until it prints that
    <!-- test: background -->                   start it and leave it running (`trace up`)

The comments do not render, so the reader sees the commands exactly as they run."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TUTORIAL_HEADING = "## Tutorial"

MARKER = re.compile(r"^<!--\s*test:\s*(?P<spec>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)(?P<info>.*)$")


@dataclass
class Block:
    """One fenced block: its language, text, the line it starts on and its marker (if any)."""

    lang: str
    text: str
    line: int
    mode: str | None = None  # file | run | background
    path: str | None = None  # mode file: where it goes
    expect: list[str] = field(default_factory=list)
    until: str | None = None


def parse_marker(spec: str, block: Block) -> None:
    head, *options = [p.strip() for p in spec.split(";")]
    mode, _, arg = head.partition(" ")
    if mode not in ("file", "run", "background"):
        raise ValueError(f"line {block.line}: unknown test mode {mode!r}")
    block.mode = mode
    if mode == "file":
        if not arg.strip():
            raise ValueError(f"line {block.line}: `test: file` needs a path")
        block.path = arg.strip()
    for option in options:
        key, _, value = option.partition(":")
        if key.strip() == "expect":
            block.expect.append(value.strip())
        elif key.strip() == "until":
            block.until = value.strip()
        else:
            raise ValueError(f"line {block.line}: unknown option {key.strip()!r}")


def blocks(text: str, first_line: int = 1) -> list[Block]:
    """Every fenced block of `text`, with the marker right before it (blank lines allowed);
    line numbers count from `first_line`."""
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    marker: str | None = None
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            marker = m.group("spec")
            i += 1
            continue
        f = FENCE.match(line)
        if f:
            fence, start = f.group("fence"), i
            body: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].startswith(fence):
                body.append(lines[i])
                i += 1
            lang = f.group("info").strip().split(" ")[0] if f.group("info").strip() else ""
            block = Block(lang=lang, text="\n".join(body) + "\n", line=start + first_line)
            if marker is not None:
                parse_marker(marker, block)
            out.append(block)
            marker = None
        elif line.strip():
            marker = None  # a marker belongs to the block right after it
        i += 1
    return out


def tutorial_section(text: str) -> str:
    """The README's tutorial: from its heading to the next second-level heading."""
    start = text.index(TUTORIAL_HEADING)
    end = text.find("\n## ", start + len(TUTORIAL_HEADING))
    return text[start : end if end != -1 else len(text)]


def tutorial_blocks() -> list[Block]:
    """The tutorial's blocks, numbered by their README lines."""
    text = README.read_text()
    section = tutorial_section(text)
    return blocks(section, text[: text.index(section)].count("\n") + 1)
