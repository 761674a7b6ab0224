"""moto's real AWS server (ThreadedMotoServer: S3, SQS and the rest on one port, in memory) on
127.0.0.1 in a child process of its own, for the benches that run the aws profile's adapters
(queue_bench's sqs column, profile_bench's aws runs). Its own process, so the emulator's
request handling does not share this process's interpreter lock with the clients it serves;
it is still an emulator on the same 2 cores, and no figure measured against it says anything
about AWS's latency or throughput.

    with moto_server() as endpoint:  # "http://127.0.0.1:<free port>"
        ...
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from trace_platform.db.embedded import free_port

ACCESS = {"aws_access_key_id": "test", "aws_secret_access_key": "test", "region_name": "us-east-1"}

_SERVE = """
import logging
import sys
from moto.server import ThreadedMotoServer

logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request

if sys.argv[2] == "1":
    import threading

    from moto.core.utils import unix_time
    from moto.sqs.models import Queue, SQSBackend

    # moto checks each message a receive returns against the queue's retention period by
    # computing every queue attribute, counts of all its messages among them: a receive then
    # costs O(queue length) per message. The same rule, read from the one attribute it needs
    # (tests/integration/test_sqs_queue.py does the same).
    def valid(self, queue_name, message):
        period = int(self.get_queue(queue_name).message_retention_period)
        return period + message.sent_timestamp / 1000 > unix_time()

    SQSBackend.is_message_valid_based_on_retention_period = valid

    # moto deletes a message by rebuilding the queue's list unlocked: two deletes at once (two
    # consumers) each write back a list holding the other's message, which SQS answered as
    # deleted and which then comes back when its visibility runs out. One delete at a time.
    unlocked_delete = Queue.delete_message
    deleting = threading.Lock()

    def delete_message(self, receipt_handle):
        with deleting:
            return unlocked_delete(self, receipt_handle)

    Queue.delete_message = delete_message

server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
print("ready", flush=True)
sys.stdin.read()  # serves until the parent closes its end (or dies)
server.stop()
"""


@contextmanager
def moto_server(queue_fixes: bool = False) -> Iterator[str]:
    """moto's server on a free port of 127.0.0.1, stopped on exit; yields its endpoint URL.
    `queue_fixes`: moto's SQS with its per-message retention check made O(1) and its deletes
    made one at a time (see _SERVE): what a bench that drains with several consumers needs."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(port), "1" if queue_fixes else "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"moto's server did not start (exit {proc.wait(10)})")
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
