"""The console's accessibility, checked without a browser or a database (issue 43's "Must
hold"): every page template rendered through the console's own Jinja2 environment with
representative data, its markup parsed (html.parser) for names of fields, links, buttons,
charts and tables, the page's language, landmark, title and heading order, and tab order; the
script for pointer handlers on elements a keyboard cannot reach; and the stylesheet's colours
for WCAG 2.x contrast. Each check is also shown to catch its defect on a small bad sample."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from importlib.resources import files
from itertools import pairwise
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import pytest

from trace_platform.console.analytics import Panel
from trace_platform.console.runs import summary, tree, tree_html
from trace_platform.console.svg import chart_svg, dag_graph, graph_svg
from trace_platform.console.web import PREFIX, templates

STATIC = files("trace_platform.console") / "static"
TEMPLATES = files("trace_platform.console") / "templates"

# --- the markup -----------------------------------------------------------------------------

VOID = {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "source",
    "track",
    "wbr",
}
UNNAMED_INPUTS = {"hidden", "submit", "button", "reset", "image"}  # named by value, or unseen
FOCUSABLE = {"a", "button", "input", "select", "textarea", "summary"}
POINTER = {"click", "dblclick", "mousedown", "mouseup", "pointerdown", "pointerup"}
KEYS = {"keydown", "keyup", "keypress"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    parent: Node | None = None
    children: list[Node | str] = field(default_factory=list)

    def walk(self) -> Iterator[Node]:
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.walk()

    def text(self) -> str:
        """The text a screen reader reads for it: its text, an image's alt, an SVG's title."""
        parts: list[str] = []
        for c in self.children:
            if isinstance(c, str):
                parts.append(c)
            elif c.attrs.get("aria-hidden") != "true":
                parts.append(c.attrs.get("aria-label") or c.attrs.get("alt") or c.text())
        return " ".join(" ".join(parts).split())

    def ancestors(self) -> Iterator[Node]:
        n = self.parent
        while n is not None:
            yield n
            n = n.parent


class _Tree(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.at = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs}, self.at)
        self.at.children.append(node)
        if tag not in VOID:
            self.at = node

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.at.children.append(Node(tag, {k: v or "" for k, v in attrs}, self.at))

    def handle_endtag(self, tag: str) -> None:
        # Close up to the matching open element (an unclosed <p> or <li> closes with it).
        for n in [self.at, *self.at.ancestors()]:
            if n.tag == tag:
                self.at = n.parent or self.root
                return

    def handle_data(self, data: str) -> None:
        self.at.children.append(data)


def parse(html: str) -> Node:
    p = _Tree()
    p.feed(html)
    p.close()
    return p.root


def _named_by_ids(doc: Node, ids: str) -> bool:
    by_id = {n.attrs["id"]: n for n in doc.walk() if "id" in n.attrs}
    return any(i in by_id and by_id[i].text() for i in ids.split())


def _has_name(doc: Node, n: Node) -> bool:
    if n.attrs.get("aria-label", "").strip():
        return True
    if n.attrs.get("aria-labelledby") and _named_by_ids(doc, n.attrs["aria-labelledby"]):
        return True
    if "id" in n.attrs and any(
        m.tag == "label" and m.attrs.get("for") == n.attrs["id"] and m.text() for m in doc.walk()
    ):
        return True
    return any(a.tag == "label" and a.text() for a in n.ancestors())


def markup_problems(html: str, page: bool = True) -> list[str]:
    """What keeps a page (or, page=False, a partial) from a screen reader or a keyboard."""
    doc = parse(html)
    nodes = list(doc.walk())
    out: list[str] = []
    ids = [n.attrs["id"] for n in nodes if "id" in n.attrs]
    out += [f"id {i!r} is not unique" for i in sorted({i for i in ids if ids.count(i) > 1})]
    for n in nodes:
        where = f"<{n.tag} {n.attrs}>"
        control = n.tag in ("select", "textarea") or (
            n.tag == "input" and n.attrs.get("type", "text") not in UNNAMED_INPUTS
        )
        if control and not _has_name(doc, n):
            out.append(f"{where}: a field without a label")
        if n.tag == "label" and "for" in n.attrs and n.attrs["for"] not in ids:
            out.append(f"{where}: labels no element")
        if n.tag == "img" and "alt" not in n.attrs:
            out.append(f"{where}: an image without alt")
        if n.tag == "svg" and n.attrs.get("aria-hidden") != "true":
            title = next((c for c in n.children if isinstance(c, Node) and c.tag == "title"), None)
            named = n.attrs.get("aria-label", "").strip() or (
                "aria-labelledby" in n.attrs and _named_by_ids(doc, n.attrs["aria-labelledby"])
            )
            if n.attrs.get("role") != "img" or not (named or (title and title.text())):
                out.append(f"{where}: a picture without role=img and a name")
        if n.tag == "table":
            caption = next(
                (c for c in n.children if isinstance(c, Node) and c.tag == "caption"), None
            )
            if not ((caption and caption.text()) or _has_name(doc, n)):
                out.append(f"{where}: a table without a caption")
        if n.tag in ("a", "button") and not (n.text() or n.attrs.get("aria-label", "").strip()):
            out.append(f"{where}: a {n.tag} without text")
        if int(n.attrs.get("tabindex", "0") or "0") > 0:
            out.append(f"{where}: a positive tabindex reorders the keyboard's path")
        out += [f"{where}: inline handler {a}" for a in n.attrs if a.startswith("on")]
    if not page:
        return out
    html_el = [n for n in nodes if n.tag == "html"]
    if not (html_el and html_el[0].attrs.get("lang")):
        out.append("no <html lang>")
    if sum(n.tag == "main" for n in nodes) != 1:
        out.append("not exactly one <main>")
    if not any(
        n.tag == "title" and n.parent and n.parent.tag == "head" and n.text() for n in nodes
    ):
        out.append("no <title>")
    levels = [int(n.tag[1]) for n in nodes if re.fullmatch(r"h[1-6]", n.tag)]
    if not levels or levels[0] != 1:
        out.append(f"headings do not start at h1: {levels}")
    out += [f"heading h{b} follows h{a}" for a, b in pairwise(levels) if b > a + 1]
    return out


# --- the pages ------------------------------------------------------------------------------

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
RUN_ID = UUID("00000000-0000-4000-8000-000000000001")
SPEC = {
    "jobs": {"source": {"outputs": [{}]}, "sink": {"inputs": [{"job": "source", "output": 0}]}},
    "publish": [{"job": "source", "output_index": 0, "dataset": "raw"}],
}
RESULT = {
    "columns": [{"name": "k"}, {"name": "n"}],
    "rows": [["a", 1], ["b", 2]],
    "row_count": 2,
    "elapsed_ms": 3,
}
ROWS = [{"k": "a", "n": 1}, {"k": "b", "n": 2}]


def _task(n: int, parent: int | None, status: str) -> dict[str, Any]:
    return {
        "task_id": UUID(int=n),
        "parent_task_id": UUID(int=parent) if parent else None,
        "job": f"job{n}",
        "status": status,
        "attempt": 1,
        "created_at": T0 + timedelta(n),
        "started_at": T0,
        "finished_at": T0 + timedelta(seconds=3),
        "progress": {"rows": n},
        "last_error": "boom" if status == "failed" else None,
    }


def _pages() -> dict[str, list[dict[str, Any]]]:
    """Each page template and the contexts it is rendered with: every optional part shown."""
    admin = SimpleNamespace(name="ada", is_admin=True)
    run_row = {
        "run_id": RUN_ID,
        "dag": "hello",
        "dag_version": 2,
        "kind": "manual",
        "trigger": "now",
        "status": "running",
        "succeeded": 1,
        "tasks": 3,
        "created_at": T0,
    }
    dag = {"name": "hello", "active_version": 2, "paused": False, "can_deploy": True}
    versions = [
        {
            "version": v,
            "state": "active",
            "deployed_at": T0,
            "activated_at": T0,
            "manual_cutover": False,
        }
        for v in (1, 2)
    ]
    rebuild = {
        "version": 3,
        "blocked_by": "a job is running",
        "manual_cutover": True,
        "jobs": [{"job": "source", "state": "done"}],
        "datasets": [
            {
                "dataset_name": "raw",
                "state": "building",
                "commits": 1,
                "row_count": 5,
                "current": False,
            }
        ],
    }
    ds = {
        "dataset_name": "raw",
        "producer_dag": "hello",
        "producer_job": "source",
        "producer_output_index": 0,
        "backend": "parquet",
        "update_strategy": "append",
        "row_count": 5,
        "commits": 1,
        "read_roles": ["readers"],
    }
    ds_version = {
        "dataset_version": UUID(int=7),
        "dag_version": 2,
        "state": "committed",
        "current": True,
        "row_count": 5,
        "commits": 1,
        "created_at": T0,
        "rollback_versions": [1],
    }
    delivery = {
        "delivery_id": UUID(int=9),
        "destination": "ops",
        "rule": "late",
        "severity": "high",
        "status": "failed",
        "attempts": 2,
        "reason": "refused",
        "created_at": T0,
        "idempotency_key": "k",
        "attempt_log": [{"at": "t"}],
        "body": "{}",
    }
    chart = chart_svg(ROWS, "k", "n", "bar")
    panel = Panel(RESULT, [("n by k", chart), ("n by k", chart_svg(ROWS, "k", "n", "line"))])
    run = {
        "run_id": RUN_ID,
        "dag": "hello",
        "dag_version": 2,
        "kind": "manual",
        "trigger": "now",
        "created_at": T0,
        "tasks": [_task(1, None, "succeeded"), _task(2, 1, "failed"), _task(3, 1, "running")],
    }
    return {
        "login.html": [{"me": None, "error": None}, {"me": None, "error": "no such key"}],
        "error.html": [{"me": admin, "error": "no", "code": "forbidden"}],
        "dags.html": [
            {"me": admin, "dags": [dag], "runs": [run_row], "flash": "deployed version 2"},
            {"me": admin, "dags": [], "runs": []},
        ],
        "dag.html": [
            {
                "me": admin,
                "dag": dag,
                "name": "hello",
                "shown": {"version": 2},
                "status": {"versions": versions, "rebuild": rebuild},
                "graph": graph_svg(*dag_graph(SPEC), "DAG hello"),
                "runs": [run_row],
                "diff": ["--- a", "+x", "-y", " z"],
                "a": 1,
                "b": 2,
                "datasets": [ds],
            },
            {
                "me": admin,
                "dag": {**dag, "paused": True, "can_deploy": False},
                "name": "hello",
                "datasets": [],
            },
        ],
        "deploy.html": [
            {"me": admin, "text": "name: hello", "error": "bad yaml", "plan": None},
            {
                "me": admin,
                "text": "name: hello",
                "plan": {
                    "name": "hello",
                    "changes": [{"job": "source", "change": "changed"}],
                    "rebuilt_jobs": ["source"],
                    "replays": {"source": {"tasks": 2, "scopes": [1]}},
                },
            },
        ],
        "runs.html": [{"me": admin, "runs": [run_row], "dag": "hello"}],
        "run.html": [{"me": admin, "run": run, "tree": tree_html(run)}],
        "datasets.html": [{"me": admin, "datasets": [ds]}, {"me": admin, "datasets": []}],
        "dataset.html": [
            {
                "me": admin,
                "ds": ds,
                "versions": [ds_version],
                "lineage": {"upstream": ["a"], "downstream": []},
                "history": [{"at": T0, "action": "cutover", "actor": "ada", "details": {}}],
            },
        ],
        "query.html": [
            {
                "me": admin,
                "sql": "select 1",
                "result": RESULT,
                "error": None,
                "chart": chart,
                "form": {"x": "k", "y": "n", "kind": "bar"},
            },
            {
                "me": admin,
                "sql": "bad",
                "result": None,
                "error": "syntax",
                "chart": None,
                "form": {},
            },
        ],
        "alerts.html": [
            {"me": admin, "alerts": RESULT, "alerts_error": None, "deliveries": [delivery]},
            {"me": admin, "alerts_error": "no", "deliveries_error": "admins only"},
        ],
        "delivery.html": [{"me": admin, "d": delivery}],
        "analytics.html": [
            {
                "me": admin,
                "token": "0x" + "a" * 40,
                "tokens": ["0x" + "a" * 40],
                "n": 10,
                "max_n": 50,
                "every": 1,
                "supply": panel,
                "holders": panel,
                "history": panel,
                "staking": Panel(error="not readable"),
            },
        ],
    }


def render(template: str, context: dict[str, Any]) -> str:
    base = {"csrf": "t", "flash": "", "prefix": PREFIX, "request": None}
    return templates.get_template(template).render(**(base | context))


PAGES = [(t, i, c) for t, cs in _pages().items() for i, c in enumerate(cs)]


def _partials() -> dict[str, list[dict[str, Any]]]:
    """Partials a live stream re-renders (also shown inside their pages), with their contexts."""
    dag = _pages()["dag.html"][0]
    return {
        "run_tree.html": [{"run": (run := _pages()["run.html"][0]["run"])} | _tree(run)],
        "dag_rebuild.html": [
            {"name": "hello", "status": dag["status"], "ended": None},
            {"name": "hello", "status": dag["status"], "ended": "Cut over to version 3."},
        ],
    }


def _tree(run: dict[str, Any]) -> dict[str, Any]:
    return {"roots": tree(run["tasks"]), "summary": summary(run)}


PARTIALS = [(t, i, c) for t, cs in _partials().items() for i, c in enumerate(cs)]


def test_every_template_is_rendered_here() -> None:
    """A new page or partial gets a context above (or this fails): none escapes the checks."""
    on_disk = {p.name for p in TEMPLATES.iterdir() if p.name.endswith(".html")}
    pages = {t for t, _, _ in PAGES}
    assert pages <= on_disk
    # base and macros are in every page; a partial listed before its file lands is skipped.
    assert on_disk - {"base.html", "macros.html"} <= pages | {t for t, _, _ in PARTIALS}


@pytest.mark.parametrize(("template", "variant", "context"), PAGES, ids=lambda v: str(v)[:20])
def test_pages_name_their_fields_pictures_tables_and_headings(
    template: str, variant: int, context: dict[str, Any]
) -> None:
    assert markup_problems(render(template, context)) == []


@pytest.mark.parametrize(("template", "variant", "context"), PARTIALS, ids=lambda v: str(v)[:20])
def test_live_partials_name_theirs_too(
    template: str, variant: int, context: dict[str, Any]
) -> None:
    if not (TEMPLATES / template).is_file():
        pytest.skip(f"{template} is not there yet")
    assert markup_problems(render(template, context), page=False) == []


# --- the script -----------------------------------------------------------------------------


def script_problems(js: str, pages: list[str]) -> list[str]:
    """Pointer handlers the keyboard cannot reach: the elements a query in the script finds
    (in the rendered pages) for each pointer event it wires must be focusable, and unless
    they are links or buttons (a key press clicks those) the same wiring must handle a key.
    A handler on the document (delegation) is taken to reach anything: it needs a key too."""
    out: list[str] = []
    js = re.sub(r"//[^\n]*|/\*.*?\*/", "", js, flags=re.S)
    query = re.compile(r"""(querySelector(?:All)?|getElementById)\(\s*["'`]([^"'`]+)["'`]""")
    calls = list(query.finditer(js))
    units = [
        (m.group(2) if m.group(1) != "getElementById" else "#" + m.group(2), m.end()) for m in calls
    ]
    ends = [m.start() for m in calls[1:]] + [len(js)] if calls else []
    wired = [(sel, js[start:end]) for (sel, start), end in zip(units, ends, strict=True)]
    wired.append(("document", js[: calls[0].start()] if calls else js))
    if re.search(r"\.on(click|dblclick|mouse\w+)\s*=", js):
        out.append("an on<pointer> property handler: use addEventListener, with a key handler")
    docs = [parse(p) for p in pages]
    for selector, code in wired:
        events = set(re.findall(r"""addEventListener\(\s*["'](\w+)["']""", code))
        if not events & POINTER:
            continue
        if selector == "document":
            if not events & KEYS:
                out.append(f"pointer events {events & POINTER} delegated without a key handler")
            continue
        for doc in docs:
            for n in doc.walk():
                if not _matches(n, selector):
                    continue
                native = n.tag in FOCUSABLE and (n.tag != "a" or "href" in n.attrs)
                focusable = native or int(n.attrs.get("tabindex", "-1") or "-1") >= 0
                if not focusable:
                    out.append(f"{selector} finds <{n.tag}>, which takes no focus, for a click")
                elif n.tag not in ("a", "button") and not events & KEYS:
                    out.append(f"{selector} reacts to the pointer and not to a key")
    return out


def _matches(n: Node, selector: str) -> bool:
    """A compound selector (tag, #id, .class, [attr], [attr=value]) against one element: the
    script's own queries are of this shape (a descendant selector is matched on its last part)."""
    last = selector.split()[-1]
    tag = re.match(r"[a-z][a-z0-9]*", last)
    if tag and n.tag != tag.group(0):
        return False
    for kind, name, _, value in re.findall(r"([#.]|\[)([\w-]+)(=[\"']?([^\"'\]]*)[\"']?)?", last):
        if kind == "#" and n.attrs.get("id") != name:
            return False
        if kind == "." and name not in n.attrs.get("class", "").split():
            return False
        if kind == "[" and (name not in n.attrs or (value and n.attrs[name] != value)):
            return False
    return True


def test_the_script_wires_nothing_a_keyboard_cannot_reach() -> None:
    js = (STATIC / "console.js").read_text()
    assert script_problems(js, [render(t, c) for t, _, c in PAGES]) == []


# --- the colours ----------------------------------------------------------------------------

NAMED = {"white": "#ffffff", "black": "#000000"}
TEXT_RATIO, UI_RATIO = 4.5, 3.0
CONTROLS = {"button", "input", "select", "textarea"}


def luminance(colour: str) -> float:
    h = colour.lstrip("#")
    h = "".join(c * 2 for c in h) if len(h) == 3 else h
    channels = [int(h[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def ratio(a: str, b: str) -> float:
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


@dataclass
class Rule:
    selector: str  # one selector of a rule's list
    decls: dict[str, str]

    @property
    def context(self) -> str:
        """Where it paints: the header's dark band, or the light page under it."""
        return "header" if self.selector.split()[0] == "header" else "page"

    @property
    def last_tag(self) -> str:
        m = re.match(r"[a-z]+", self.selector.split()[-1])
        return m.group(0) if m else ""


def css_rules(css: str) -> list[Rule]:
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    blocks = re.findall(r"([^{}]+)\{([^{}]*)\}", css)
    variables: dict[str, str] = {}
    rules: list[Rule] = []
    for selectors, body in blocks:
        decls = {
            k.strip(): v.strip() for k, v in (d.split(":", 1) for d in body.split(";") if ":" in d)
        }
        if selectors.strip() == ":root":
            variables |= {k: v for k, v in decls.items() if k.startswith("--")}
            continue
        rules += [Rule(s.strip(), decls) for s in selectors.split(",")]

    def resolve(v: str) -> str:
        return re.sub(r"var\((--[\w-]+)\)", lambda m: variables[m.group(1)], v)

    for r in rules:
        r.decls = {k: resolve(v) for k, v in r.decls.items()}
    return rules


def colour_of(value: str | None) -> str | None:
    """The colour in a declaration's value (a shorthand's colour part), if any."""
    if not value:
        return None
    m = re.search(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b|\b(white|black)\b", value)
    return None if m is None else NAMED.get(m.group(0), m.group(0)).lower()


def contrast_problems(css: str) -> list[str]:
    """Every text colour against every background of the same context (the header's band, or
    the page with its tinted cells, rows, blocks and SVG boxes: a conservative cross product,
    as the stylesheet alone cannot say what nests in what) at 4.5:1, large text included; focus
    outlines, control boundaries and chart strokes and fills at 3:1 (WCAG 1.4.11). Table,
    fieldset and tree borders only decorate (the text carries the structure): not checked."""
    rules = css_rules(css)
    body = next(r for r in rules if r.selector == "body")
    texts: dict[str, set[tuple[str, str]]] = {"page": set(), "header": set()}
    backs: dict[str, set[tuple[str, str]]] = {"page": set(), "header": set()}
    graphics: set[tuple[str, str]] = set()
    texts["page"].add(("body", colour_of(body.decls.get("color")) or "#000000"))
    backs["page"].add(("body", colour_of(body.decls.get("background")) or "#ffffff"))
    for r in rules:
        text = colour_of(r.decls.get("color"))
        back = colour_of(r.decls.get("background") or r.decls.get("background-color"))
        fill = colour_of(r.decls.get("fill"))
        if r.last_tag == "text":
            text = text or fill
        elif r.last_tag == "rect" and fill:  # a box SVG text is drawn on
            back = fill
        elif fill:
            graphics.add((r.selector, fill))
        if stroke := colour_of(r.decls.get("stroke")):
            graphics.add((r.selector, stroke))
        if text:
            texts[r.context].add((r.selector, text))
        if back:
            backs[r.context].add((r.selector, back))
    out = [
        f"{ts} {t} on {bs} {b}: {ratio(t, b):.2f}:1"
        for ctx in texts
        for ts, t in sorted(texts[ctx])
        for bs, b in sorted(backs[ctx])
        if ratio(t, b) < TEXT_RATIO
    ]
    header_outline = any(r.context == "header" and "outline" in " ".join(r.decls) for r in rules)
    every_back = backs["page"] | backs["header"]
    for r in rules:
        outline = colour_of(r.decls.get("outline") or r.decls.get("outline-color"))
        if outline:
            # A page rule's outline shows in the header too unless a header rule sets its own.
            under = backs[r.context] if r.context == "header" or header_outline else every_back
            out += [
                f"{r.selector} focus outline {outline} on {bs} {b}: {ratio(outline, b):.2f}:1"
                for bs, b in sorted(under)
                if ratio(outline, b) < UI_RATIO
            ]
        border = colour_of(r.decls.get("border"))
        if border and (r.last_tag in CONTROLS or ".button" in r.selector):
            own = colour_of(r.decls.get("background"))
            # Its edge shows by its border or by its own fill, wherever it sits.
            out += [
                f"{r.selector} edge {border} on {bs} {b}: {ratio(border, b):.2f}:1"
                for bs, b in sorted(every_back)
                if max(ratio(border, b), ratio(own, b) if own else 0.0) < UI_RATIO
            ]
    out += [
        f"{gs} {g} on {bs} {b}: {ratio(g, b):.2f}:1"
        for gs, g in sorted(graphics)
        for bs, b in sorted(backs["page"])
        if ratio(g, b) < UI_RATIO
    ]
    return out


def test_the_stylesheet_keeps_its_colours_readable() -> None:
    assert contrast_problems((STATIC / "console.css").read_text()) == []


def test_the_contrast_formula_matches_wcag() -> None:
    assert ratio("#000000", "#ffffff") == pytest.approx(21.0)
    assert ratio("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)  # WebAIM's example


# --- each check catches its defect ----------------------------------------------------------

PAGE = (
    '<!doctype html><html lang="en"><head><title>T</title></head><body><main>'
    "<h1>A</h1>{}</main></body></html>"
)
BAD_MARKUP = {
    "field": '<input id="q" name="q">',
    "dangling label": '<label for="nope">R</label><input id="r" aria-label="r">',
    "select": "<select><option>a</option></select>",
    "textarea": "<textarea></textarea>",
    "image": '<img src="x.png">',
    "svg": '<svg role="img"><rect/></svg>',
    "svg role": "<svg><title>chart</title></svg>",
    "table": "<table><tr><td>1</td></tr></table>",
    "link": '<a href="/x"></a>',
    "button": "<button><span></span></button>",
    "tabindex": '<div tabindex="2">x</div>',
    "id": '<p id="a">x</p><p id="a">y</p>',
    "skipped heading": "<h4>C</h4>",
    "inline handler": '<button onclick="go()">Go</button>',
}
GOOD_MARKUP = (
    '<label for="q">Q</label><input id="q"><label>W <input></label>'
    '<input aria-label="e"><input type="hidden"><img alt="" src="x.png">'
    '<svg role="img"><title>chart</title></svg><table><caption>T</caption></table>'
    '<a href="/x"><img alt="home" src="h.png"></a><button>Go</button><h2>B</h2>'
)


@pytest.mark.parametrize("bad", sorted(BAD_MARKUP))
def test_the_markup_checks_catch_their_defect(bad: str) -> None:
    assert markup_problems(PAGE.format(GOOD_MARKUP)) == []
    assert len(markup_problems(PAGE.format(GOOD_MARKUP + BAD_MARKUP[bad]))) == 1


@pytest.mark.parametrize(
    "broken",
    [
        lambda p: p.replace(' lang="en"', ""),
        lambda p: p.replace("<title>T</title>", ""),
        lambda p: p.replace("<main>", "<div>").replace("</main>", "</div>"),
        lambda p: p.replace("</main>", "</main><main></main>"),
        lambda p: p.replace("<h1>A</h1>", "<h2>A</h2>"),
    ],
    ids=["lang", "title", "no main", "two mains", "no h1"],
)
def test_the_page_checks_catch_their_defect(broken: Callable[[str], str]) -> None:
    assert markup_problems(broken(PAGE.format(""))) != []


def test_the_script_check_catches_a_click_on_a_div() -> None:
    page = PAGE.format('<div id="tree" data-sse="/s">x</div><button class="b">B</button>')
    on = 'document.querySelectorAll("{}").forEach((e) => e.addEventListener("{}", f));'
    assert script_problems(on.format("[data-sse]", "click"), [page]) != []
    assert (
        script_problems(
            on.format("[data-sse]", "click") + 'x.addEventListener("keydown", g)',
            [page.replace('id="tree"', 'id="tree" tabindex="0"')],
        )
        == []
    )
    assert script_problems(on.format("#tree", "click"), [page]) != []
    assert script_problems(on.format("button.b", "click"), [page]) == []
    assert script_problems('document.addEventListener("click", f);', [page]) != []
    assert script_problems("el.onclick = f;", [page]) != []


@pytest.mark.parametrize(
    ("css", "defect"),
    [
        ("body { color: #777; background: #fff; }", "grey text on white"),
        ("body { color: #111; } .m { color: #888888; }", "a class's text on the page"),
        ("body { color: #111; } th { background: #333; }", "a dark cell"),
        ("body { color: #111; } header { background: #1f4e79; color: #6a8ab0; }", "header"),
        ("body { color: #111; } a:focus { outline: 3px solid #f0a500; }", "amber focus"),
        ("body { color: #111; } button { border: 1px solid #ddd; }", "a faint button"),
        ("body { color: #111; } svg .bar { fill: #cccccc; }", "a faint bar"),
    ],
    ids=lambda v: v if " " in v and "{" not in v else "",
)
def test_the_contrast_check_catches_its_defect(css: str, defect: str) -> None:
    assert contrast_problems(":root { --x: #000; } " + css) != [], defect
