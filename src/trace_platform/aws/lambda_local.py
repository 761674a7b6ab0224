"""The local invoker's child program (`python -m trace_platform.aws.lambda_local`, started by
`aws/invokers.LocalInvoker` in the sandbox an operator host gets): one invocation of the Lambda
handler's own code (`lambda_handler.run_event`), then it exits, as a cold Lambda would.

It speaks JSON lines with the invoker, as an operator host does with its wrapper: the
invocation in (`{"type": "invoke", "workdir", "event"}`), store calls out and their replies in
(the invoker's `ScopedStore` answers them: the sandbox holds no store credential), and the
handler's result out last (`{"type": "result", "result"}`). Operator prints and logs go to
stderr, a log file the invoker opened."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import IO

from trace_platform.aws.lambda_handler import run_event
from trace_platform.worker.host_main import Channel, _die_with_parent
from trace_platform.worker.store_proxy import RemoteStore


def main() -> None:
    _die_with_parent()
    proto: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the operator prints goes to the log, not the protocol
    sys.stdout = os.fdopen(1, "w", buffering=1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    inp: IO[bytes] = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    chan = Channel(proto, inp)
    msg = json.loads(inp.readline() or b"null")
    if not isinstance(msg, dict) or msg.get("type") != "invoke":
        raise SystemExit("lambda_local: the first line is not an invocation")
    workdir = Path(msg["workdir"])
    result = run_event(msg["event"], lambda _task, wd: RemoteStore(chan.call, wd), workdir)
    chan.send({"type": "result", "result": result})


if __name__ == "__main__":
    main()
