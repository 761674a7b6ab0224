"""Live partials over server-sent events, shared by the run tree and a DAG's rebuild: a stream
re-reads what a page shows (the control plane's call, as the logged-in user, the key checked
again at each poll), re-renders its partial, sends it when it changed, and ends with a `done`
event once there is nothing left to follow. The streams one user and one process hold are
capped."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from uuid import UUID

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from trace_platform.console.web import attempt
from trace_platform.errors import TraceError
from trace_platform.identity import Actor

POLL_SECONDS = 0.5
# Live streams held open at once, by one user and by everyone: each polls Postgres on the
# request thread pool the API's routes and its workers' heartbeats share, so streams opened
# by the hundred would starve them. Past either, 429 (a browser's EventSource then stops).
STREAMS_PER_USER = 4
STREAMS_TOTAL = 32
# A stream ends after this long; the browser's EventSource reconnects by itself, so no
# connection outlives a server's graceful shutdown by much.
STREAM_SECONDS = 120.0

# What a poll reads: the partial's HTML, and why the stream ends now (None: it goes on).
Snapshot = tuple[str, str | None]


class TooManyStreams(TraceError):
    status_code = 429
    code = "too_many_streams"


def sse_event(name: str, text: str) -> str:
    """One server-sent event: a data line per line of `text`. A line ends at CR, LF or CR LF
    for the browser, so each is split here: a CR in a task's error (any text its code raised)
    must not end the data and start a field of its own (a forged `done` or `tree`)."""
    return f"event: {name}\n" + "".join(f"data: {ln}\n" for ln in _LINES.split(text)) + "\n"


_LINES = re.compile(r"\r\n|\r|\n")


class _Slots:
    """Who holds live streams in this process, whatever page they follow. Locked: two apps
    in one process (tests) run on two event loops."""

    def __init__(self) -> None:
        self.held: dict[UUID, int] = {}
        self.lock = threading.Lock()

    def take(self, me: Actor) -> Callable[[], None]:
        with self.lock:
            mine = self.held.get(me.user_id, 0)
            if mine >= STREAMS_PER_USER:
                raise TooManyStreams(
                    f"you have {mine} live streams open (at most {STREAMS_PER_USER}): close a "
                    "live page, or reload this one later"
                )
            if sum(self.held.values()) >= STREAMS_TOTAL:
                raise TooManyStreams("the console has as many live streams open as it serves")
            self.held[me.user_id] = mine + 1

        def give_back() -> None:
            with self.lock:
                left = self.held[me.user_id] - 1
                if left:
                    self.held[me.user_id] = left
                else:
                    del self.held[me.user_id]

        return give_back


_slots = _Slots()


class _Stream(StreamingResponse):
    """A stream that gives its slot back however it ends (finished, the client gone, an
    error)."""

    def __init__(self, events: AsyncIterator[str], give_back: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        self.give_back = give_back

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.give_back()


async def stream(
    request: Request,
    me: Actor,
    user: Callable[[Request], Actor],
    read: Callable[[Actor], Snapshot],
    event: str,
) -> StreamingResponse:
    """`read`'s partial as `event` events while it changes, then `done` with its reason.

    `read` runs on a pool thread, never the event loop (a tree of 10,000 tasks takes ~0.4 s
    to render, which on the loop would stall every request of the process). The slot is taken
    before anything is read. The first read is as `me`, before the stream starts: what the user may not see is the API's 404 page. Each
    later read checks the key again (`user`: the API's cached check, so a revocation, an
    expiry or a changed role announced by the database ends the stream at once)."""

    def timed(who: Actor | None) -> tuple[str, str | None, float]:
        t0 = time.monotonic()
        html, done = read(who or user(request))
        return html, done, time.monotonic() - t0

    # The slot first: a burst of requests past the caps is refused before any of them reads
    # (and holds a pool thread), not after every one has.
    give_back = _slots.take(me)
    try:
        first = await run_in_threadpool(timed, me)
    except BaseException:  # e.g. the API's 404: no stream, so its slot is free again
        give_back()
        raise

    async def events() -> AsyncIterator[str]:
        (html, done, took), last = first, ""
        until = time.monotonic() + STREAM_SECONDS
        while time.monotonic() < until and not await request.is_disconnected():
            if html != last:
                last = html
                yield sse_event(event, html)
            if done is not None:
                yield sse_event("done", done)
                return
            # A big partial is polled less often: at most a fifth of a thread's time each.
            await asyncio.sleep(max(POLL_SECONDS, 4 * took))
            got, error = await run_in_threadpool(attempt, lambda: timed(None))
            if got is None:  # e.g. its key revoked meanwhile: the stream ends
                yield sse_event("done", error or "")
                return
            html, done, took = got

    return _Stream(events(), give_back)
