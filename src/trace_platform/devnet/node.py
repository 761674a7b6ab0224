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
        for port in ([DEFAULT_PORT] if port_free(DEFAULT_PORT) else []) + [0]:
            info = self._launch(anvil, port, chain_id, genesis_time)
            if info is not None:
                self.info_file.write_text(
                    json.dumps({"pid": info.pid, "port": info.port, "chain_id": chain_id})
                )
                return info
        raise DevnetError(f"anvil did not start; see {self.root / 'anvil.log'}")

    def _launch(self, anvil: Path, port: int, chain_id: int, genesis_time: int) -> NodeInfo | None:
        """Starts anvil on `port` (0: its own choice) and waits until it says where it listens
        and answers there; None if it exited first (its port was taken). The port is read from
        this node's own log: a node that answers on a port could be another's (two nodes racing
        for 8545: ours exits, theirs answers, and a chain would be generated onto theirs)."""
        log_path = self.root / "anvil.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
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
            bound = _listening(log_path, offset)
            if bound is not None:
                info = NodeInfo(proc.pid, bound, chain_id)
                try:
                    httpx.post(
                        info.url,
                        json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
                        timeout=1,
                    )
                    if proc.poll() is None:
                        return info
                except httpx.HTTPError:
                    pass
            if proc.poll() is not None:
                return None
            if time.monotonic() > deadline:
                proc.kill()
                raise DevnetError(f"anvil did not start; see {log_path}")
            time.sleep(0.05)

    def stop(self) -> None:
        info = self.info()
        if info is not None:
            try:
                os.kill(info.pid, signal.SIGTERM)
                for _ in range(100):
                    if not _alive(info.pid):
                        break
                    time.sleep(0.05)
                else:
                    os.kill(info.pid, signal.SIGKILL)
            except OSError:
                pass
        self.info_file.unlink(missing_ok=True)


def _listening(log: Path, offset: int) -> int | None:
    """The port in the "Listening on 127.0.0.1:PORT" line anvil wrote after `offset`."""
    with log.open("rb") as f:
        f.seek(offset)
        m = re.search(rb"Listening on 127\.0\.0\.1:(\d+)", f.read())
    return int(m.group(1)) if m else None
