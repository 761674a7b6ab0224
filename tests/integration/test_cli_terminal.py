"""What operators and other users write reaches the CLI's terminal only as visible text."""

from __future__ import annotations

import re
from uuid import UUID

from tests.support.cli import trace as run
from tests.support.dags import admin
from trace_platform.contract import ClaimRequest, CompleteRequest, HeartbeatRequest
from trace_platform.services import Services

# What a hostile operator puts in its error and progress: a screen clear and cursor home, a
# colour change hiding text, an OSC-8 link, an OSC title change ended by a bell, a bare bell,
# a C1 CSI (0x9b), a carriage return to overwrite the line and a bidi override.
HOSTILE = (
    "boom\x1b[2J\x1b[H\x1b[8mhidden\x1b[0m "
    "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\ "
    "\x1b]0;owned\x07 ding\x07 c1\x9b31mred \rfake ok \u202eevil [red]markup[/red]"
)
FORBIDDEN = ["\x1b", "\x07", "\x9b", "\x9d", "\r", "\u202e"]


def _failed_run(services: Services) -> tuple[UUID, UUID]:
    """A one-job DAG's run whose task reported HOSTILE as progress, then failed with it."""
    me = admin(services)
    services.control.deploy(me, "name: ansi\njobs:\n  j:\n    operator: noop\n")
    (task_id,) = services.control.trigger(me, "ansi")["tasks"]
    task_id = UUID(str(task_id))
    c = services.dispatcher.claim(ClaimRequest(task_id=task_id, worker_id="w"))
    lease = {"task_id": task_id, "attempt": c.attempt, "lease_token": c.lease_token}
    services.dispatcher.heartbeat(HeartbeatRequest(**lease, progress={"step": HOSTILE}))
    services.dispatcher.complete(
        CompleteRequest(**lease, outcome="failed", error=HOSTILE, retryable=False)
    )
    run_id = services.control.list_runs(me, "ansi", 1)[0]["run_id"]
    return task_id, run_id


def test_operator_text_never_reaches_the_terminal_raw(services: Services, dsn: str) -> None:
    task_id, run_id = _failed_run(services)
    # The CLI acts as the Lite admin, whose key the services wrote into their home.
    env = {"TRACE_STATE_DSN": dsn, "TRACE_HOME": str(services.settings.home)}
    for args in (
        ["task", "show", str(task_id)],
        ["task", "list"],
        ["runs", "show", str(run_id)],
    ):
        out = run(args, env)
        assert out.returncode == 0, out.stdout + out.stderr
        for c in FORBIDDEN:
            assert c not in out.stdout, (args, repr(c), out.stdout)
        # The text is still shown, its controls spelled out (and markup shown as typed).
        assert re.search(r"boom\\x1b\[2J", out.stdout), (args, out.stdout)
    shown = run(["task", "show", str(task_id)], env).stdout
    assert "\\x07 ding" in shown and "\\x9b31mred" in shown and "[red]markup[/red]" in shown
