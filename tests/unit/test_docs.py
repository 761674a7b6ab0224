"""The manual cannot drift: its generated pages are what the code generates now, the site
builds with `mkdocs build --strict` (a broken link or anchor fails), and every block of the
README's tutorial is marked to run in `tests/integration/test_tutorial.py`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tutorial import ROOT, blocks, tutorial_blocks, tutorial_section
from trace_platform import docs_gen


def test_the_committed_generated_pages_are_current(tmp_path: Path) -> None:
    written = docs_gen.write(ROOT, tmp_path)
    assert written, "the generator wrote nothing"
    stale = [
        rel
        for rel in written
        if not (ROOT / "docs" / rel).exists()
        or (ROOT / "docs" / rel).read_text() != (tmp_path / rel).read_text()
    ]
    assert not stale, f"stale generated pages (run `make docs`): {', '.join(stale)}"


def test_the_site_builds_strict_and_offline(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        cwd=ROOT,  # benchmarks.md includes bench/results.md from the root
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    html = "".join(p.read_text() for p in (tmp_path / "site").rglob("*.html"))
    assert "fonts.googleapis" not in html and "fonts.gstatic" not in html  # nothing fetched


def test_every_tutorial_block_runs_in_the_tutorial_test() -> None:
    steps = tutorial_blocks()
    unmarked = [b.line for b in steps if b.mode is None]
    assert not unmarked, f"tutorial blocks without a `<!-- test: … -->` marker: {unmarked}"
    modes = [b.mode for b in steps]
    assert modes[0] == "background" and modes.count("background") == 1  # `trace up` first
    assert {"file", "run"} <= set(modes)
    commands = " ".join(b.text for b in steps if b.mode == "run")
    for step in ("dag deploy", "dag trigger", "runs list", "query", "dag diff", "dag rollback"):
        assert f"trace {step}" in commands, step


def test_the_markers_are_read_as_written() -> None:
    text = """## Tutorial
<!-- test: file a.yaml -->
```yaml
x: 1
```

<!-- test: run; expect: one; expect: two; until: three -->

```bash
echo one two three
```

```text
not marked
```
## Next
"""
    got = blocks(tutorial_section(text))
    assert [(b.mode, b.path, b.expect, b.until) for b in got] == [
        ("file", "a.yaml", [], None),
        ("run", None, ["one", "two"], "three"),
        (None, None, [], None),
    ]
    assert got[0].text == "x: 1\n"
    with pytest.raises(ValueError, match="unknown test mode"):
        blocks("<!-- test: walk -->\n```\nx\n```\n")
