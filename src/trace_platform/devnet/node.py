"""The devnet's EVM node: a real anvil on 127.0.0.1, started and stopped like the embedded
Postgres (state recorded under the Lite home)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from trace_platform.db.embedded import free_port, port_free

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
        # The conventional 8545 when it is free (example DAGs point there), else any port.
        port = DEFAULT_PORT if port_free(DEFAULT_PORT) else free_port()
        log = (self.root / "anvil.log").open("ab")
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
        info = NodeInfo(proc.pid, port, chain_id)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.post(
                    info.url,
                    json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []},
                    timeout=1,
                )
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise DevnetError(
                        f"anvil did not start; see {self.root / 'anvil.log'}"
                    ) from None
                time.sleep(0.05)
        self.info_file.write_text(
            json.dumps({"pid": info.pid, "port": info.port, "chain_id": chain_id})
        )
        return info

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
