"""Driving the web console over HTTP as a browser would (cookies, its forms' CSRF token), and
checking a page holds nothing a `default-src 'self'` Content-Security-Policy would block."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from html.parser import HTMLParser

import httpx
import pytest

from tests.support.wait import wait_for
from trace_platform.console import live

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
SSE_LINE = re.compile(r"\r\n|\r|\n")


def csrf_of(page: httpx.Response) -> str:
    found = CSRF.search(page.text)
    assert found, f"no CSRF field in {page.url}"
    return found.group(1)


@contextmanager
def console(url: str, key: str) -> Iterator[httpx.Client]:
    """A client logged in to the console with `key` (its cookies kept)."""
    with httpx.Client(base_url=url, timeout=30) as c:
        page = c.get("/console/login")
        r = c.post("/console/login", data={"key": key, "csrf": csrf_of(page)})
        assert r.status_code == 303, r.text
        yield c


def post(c: httpx.Client, path: str, data: dict[str, str] | None = None) -> httpx.Response:
    """A console form posted with the token a page gave."""
    token = c.cookies.get("trace_console_csrf", path="/console") or csrf_of(c.get("/console/login"))
    return c.post(path, data={**(data or {}), "csrf": token})


class InlineFinder(HTMLParser):
    """What a strict CSP would need `unsafe-inline` (or a foreign origin) for."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self.in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "script":
            self.in_script = True
            if not named.get("src"):
                self.problems.append("a <script> without src")
        if tag == "style":
            self.problems.append("a <style> element")
        for k, v in attrs:
            if k == "style" or k.startswith("on"):
                self.problems.append(f"<{tag} {k}=...>")
            if k in ("src", "href", "action") and v and re.match(r"^(https?:)?//|^javascript:", v):
                self.problems.append(f"<{tag} {k}={v}> leaves the origin")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self.in_script = False

    def handle_data(self, data: str) -> None:
        if self.in_script and data.strip():
            self.problems.append("an inline script body")


def inline_problems(html: str) -> list[str]:
    finder = InlineFinder()
    finder.feed(html)
    return finder.problems


def sse(r: httpx.Response) -> Iterator[tuple[str, str]]:
    """(event, data) as a browser's EventSource parses the stream: a line ends at CR LF, CR or
    LF (not only LF)."""
    buf, event, data = "", "", []
    for chunk in r.iter_text():
        buf += chunk
        while (m := SSE_LINE.search(buf)) and not (m.group() == "\r" and m.end() == len(buf)):
            line, buf = buf[: m.start()], buf[m.end() :]
            if line == "":
                if data:
                    yield event or "message", "\n".join(data)
                event, data = "", []
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)


def check_stream_caps(
    url: str,
    key: str,
    other_key: str,
    path: str,
    monkeypatch: pytest.MonkeyPatch,
    counted_with: tuple[str, ...] = (),
) -> None:
    """The live-stream caps as users meet them on `path`: `key`'s user holds as many streams as
    a user may, the next is refused (and on each of `counted_with`, other live pages counted
    together with it); `other_key`'s user is not starved by them, but is held to the
    process-wide cap when that binds; a closed stream gives its place back."""
    with console(url, key) as c, ExitStack() as held:
        streams = [held.enter_context(c.stream("GET", path)) for _ in range(live.STREAMS_PER_USER)]
        assert all(s.status_code == 200 for s in streams)
        refused = c.get(path)
        assert refused.status_code == 429 and "streams" in refused.text
        for other_path in counted_with:
            assert c.get(other_path).status_code == 429, other_path
        with console(url, other_key) as other:
            with other.stream("GET", path) as theirs:
                assert theirs.status_code == 200
            monkeypatch.setattr(live, "STREAMS_TOTAL", live.STREAMS_PER_USER)
            assert other.get(path).status_code == 429
            monkeypatch.undo()
        streams[0].close()
        with ExitStack() as again:

            def admitted() -> bool:
                r = again.enter_context(c.stream("GET", path))
                return r.status_code == 200

            wait_for(admitted, what="the closed stream's place to be given back")
