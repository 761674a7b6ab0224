"""Driving the web console over HTTP as a browser would (cookies, its forms' CSRF token), and
checking a page holds nothing a `default-src 'self'` Content-Security-Policy would block."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser

import httpx

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


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
