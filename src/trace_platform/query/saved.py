"""Saved queries: `query/saved/<name>.sql`, a leading `--` description and `$name` parameters
with `-- param: name = default` lines. A saved query is the platform's: it reads only what its
producer DAG publishes (`-- producer: dag`, default the platform's DAG; query/pinned.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trace_platform.errors import Invalid, NotFound
from trace_platform.registry.reserved import PLATFORM_DAG

SAVED_DIR = Path(__file__).with_name("saved")
_PARAM = re.compile(r"^--\s*param:\s*([a-z_][a-z0-9_]*)\s*=\s*(.*?)\s*$")
_PRODUCER = re.compile(r"^--\s*producer:\s*([a-z][a-z0-9_]*)\s*$")
_USED = re.compile(r"\$([a-z_][a-z0-9_]*)")


@dataclass(frozen=True)
class SavedQuery:
    name: str
    description: str
    sql: str
    defaults: dict[str, str]
    producer: str = PLATFORM_DAG  # the DAG that must publish every dataset it reads

    def params(self, given: dict[str, Any]) -> dict[str, Any]:
        unknown = set(given) - set(self.defaults)
        if unknown:
            raise Invalid(
                f"saved query '{self.name}' has no parameter {', '.join(sorted(unknown))} "
                f"(parameters: {', '.join(self.defaults) or 'none'})"
            )
        merged = {**self.defaults, **{k: str(v) for k, v in given.items()}}
        missing = [k for k, v in merged.items() if v == ""]
        if missing:
            raise Invalid(f"saved query '{self.name}' needs --param {missing[0]}=…")
        used = set(_USED.findall(self.sql))
        return {k: _typed(v) for k, v in merged.items() if k in used}


def _typed(v: str) -> Any:
    return int(v) if re.fullmatch(r"-?\d{1,18}", v) else v


def load(name: str) -> SavedQuery:
    path = SAVED_DIR / f"{name}.sql"
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or not path.is_file():
        raise NotFound(f"no saved query '{name}' (saved queries: {', '.join(names())})")
    text = path.read_text()
    desc: list[str] = []
    defaults: dict[str, str] = {}
    producer = PLATFORM_DAG
    for line in text.splitlines():
        m = _PARAM.match(line)
        p = _PRODUCER.match(line)
        if m:
            defaults[m.group(1)] = m.group(2)
        elif p:
            producer = p.group(1)
        elif line.startswith("--"):
            desc.append(line.lstrip("- ").rstrip())
        else:
            break
    return SavedQuery(name, " ".join(d for d in desc if d), text, defaults, producer)


def names() -> list[str]:
    return sorted(p.stem for p in SAVED_DIR.glob("*.sql"))
