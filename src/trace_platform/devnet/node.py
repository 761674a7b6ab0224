"""The devnet's EVM node: a real anvil on 127.0.0.1, started and stopped like the embedded
Postgres (state recorded under the Lite home)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from trace_platform.db.embedded import port_free

ANVIL_PACKAGE = "@foundry-rs/anvil@1.7.1"
DEFAULT_PORT = 8545


class DevnetError(RuntimeError):
    pass


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def find_anvil(home: Path, *, install: bool = True) -> Path:
    """TRACE_ANVIL_BIN, `anvil` on PATH, the copy under the Lite home, else npm-install it there."""
    if os.environ.get("TRACE_ANVIL_BIN"):
        return Path(os.environ["TRACE_ANVIL_BIN"])
    on_path = shutil.which("anvil")
    if on_path:
        return Path(on_path)
    # `make` installs it next to the virtualenv; else a copy under the Lite home.
    for prefix in (Path(sys.prefix) / "node", home / "node"):
        local = prefix / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
        if local.exists():
            return local
    if not install:
        raise DevnetError("anvil is not installed (trace devnet up installs it)")
    npm = shutil.which("npm")
    if npm is None:
        raise DevnetError(
            "anvil is needed for the devnet: install Node.js with npm (apt-get install nodejs npm), "
            f"or put anvil on PATH, or set TRACE_ANVIL_BIN. Then: npm install {ANVIL_PACKAGE}"
        )
    prefix = home / "node"
    local = prefix / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
    prefix.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            npm,
            "install",
            "--silent",
            "--no-audit",
            "--no-fund",
            "--prefix",
            str(prefix),
            ANVIL_PACKAGE,
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or not local.exists():
        raise DevnetError(f"npm install {ANVIL_PACKAGE} failed: {proc.stderr.strip()[-500:]}")
    return local


@dataclass
class NodeInfo:
    pid: int
    port: int
    chain_id: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class AnvilNode:
    def __init__(self, root: Path, home: Path) -> None:
        self.root = Path(root)
        self.home = Path(home)
        self._proc: subprocess.Popen[bytes] | None = None  # the anvil this object started

    @property
    def info_file(self) -> Path:
        return self.root / "node.json"

    def info(self) -> NodeInfo | None:
        if not self.info_file.exists():
            return None
        raw = json.loads(self.info_file.read_text())
        return NodeInfo(raw["pid"], raw["port"], raw["chain_id"])

    def running(self) -> bool:
        info = self.info()
        if info is None:
            return False
        if not _alive(info.pid):
            return False
        try:
            httpx.post(
                info.url,
                json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
                timeout=2,
            )
        except httpx.HTTPError:
            return False
        return True

    def start(self, chain_id: int = 31337, genesis_time: int = 1_750_000_000) -> NodeInfo:
        """A fixed genesis timestamp (and explicit block timestamps) keep the chain deterministic."""
        if self.running():
            info = self.info()
            assert info is not None
            return info
        anvil = find_anvil(self.home)
        self.root.mkdir(parents=True, exist_ok=True)
        # The conventional 8545 when it is free (example DAGs point there), else a port anvil
        # binds itself (0). Another node started at the same moment may take 8545 first: ours
        # then fails to bind, and is started again on a port of its own.
        ports = ([DEFAULT_PORT] if port_free(DEFAULT_PORT) else []) + [0]
        for port in ports:
            log_path = self._new_log()
            info = self._launch(anvil, port, chain_id, genesis_time, log_path)
            if info is None and port != ports[-1]:
                log_path.unlink()  # it only says the port was taken
            if info is not None:
                self.info_file.write_text(
                    json.dumps(
                        {
                            "pid": info.pid,
                            "port": info.port,
                            "chain_id": chain_id,
                            "log": str(log_path),
                        }
                    )
                )
                return info
        raise DevnetError(f"anvil did not start; see {log_path}")

    def _new_log(self) -> Path:
        """A log file of this launch's own: another launch under the same root at the same
        moment must not have its "Listening on" line read as ours."""
        fd, name = tempfile.mkstemp(prefix="anvil-", suffix=".log", dir=self.root)
        os.close(fd)
        return Path(name)

    def _launch(
        self, anvil: Path, port: int, chain_id: int, genesis_time: int, log_path: Path
    ) -> NodeInfo | None:
        """Starts anvil on `port` (0: its own choice) and waits until it says where it listens
        and answers there; None if it exited first (its port was taken). The port is read from
        this launch's own log: a node that answers on a port could be another's (two nodes
        racing for 8545: ours exits, theirs answers, and a chain would be generated onto theirs)."""
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [
                    str(anvil),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--chain-id",
                    str(chain_id),
                    "--no-mining",
                    "--timestamp",
                    str(genesis_time),
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while True:
            bound = _listening(log_path)
            if bound is not None:
                info = NodeInfo(proc.pid, bound, chain_id)
                try:
                    httpx.post(
                        info.url,
                        json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
                        timeout=1,
                    )
                    if proc.poll() is None:
                        self._proc = proc
                        return info
                except httpx.HTTPError:
                    pass
            if proc.poll() is not None:
                return None
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait(timeout=10)  # reaped: no zombie left behind
                raise DevnetError(f"anvil did not start; see {log_path}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stops the node recorded under the root, and the one this object started if it is
        another (two starts under one root: each object stops its own)."""
        info = self.info()
        pids = {info.pid} if info is not None else set()
        if self._proc is not None and self._proc.poll() is None:
            pids.add(self._proc.pid)
        for pid in pids:
            self._end(pid)
        self._proc = None
        self.info_file.unlink(missing_ok=True)

    def _end(self, pid: int) -> None:
        """SIGTERM, then SIGKILL after 5 s; our own child is waited for (reaped), another
        process's watched until it is gone."""
        own = self._proc if self._proc is not None and self._proc.pid == pid else None
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            try:
                os.kill(pid, sig)
            except OSError:
                break
            if own is not None:
                try:
                    own.wait(timeout=wait)
                    return
                except subprocess.TimeoutExpired:
                    continue
            deadline = time.monotonic() + wait
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not _alive(pid):
                return


def _listening(log: Path) -> int | None:
    """The port in the "Listening on 127.0.0.1:PORT" line of anvil's log."""
    m = re.search(rb"Listening on 127\.0\.0\.1:(\d+)", log.read_bytes())
    return int(m.group(1)) if m else None
