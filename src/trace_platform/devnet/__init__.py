"""The embedded chain: a real anvil node with Monad-like contracts and deterministic activity.

`trace devnet up` starts the node (installing anvil on first use if it is not there), deploys
the token and the staking contract at Monad's staking address, and generates the seeded
activity; a second `up` reuses a running devnet whose head matches.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trace_platform.chain import Rpc
from trace_platform.devnet.chain import ChainInfo, ChainSpec, Generator
from trace_platform.devnet.node import AnvilNode, DevnetError, NodeInfo

__all__ = ["ChainInfo", "ChainSpec", "Devnet", "DevnetError"]


class Devnet:
    def __init__(self, home: Path) -> None:
        self.root = Path(home) / "devnet"
        self.node = AnvilNode(self.root, Path(home))

    @property
    def chain_file(self) -> Path:
        return self.root / "chain.json"

    def chain(self) -> ChainInfo | None:
        return (
            ChainInfo.from_json(self.chain_file.read_text()) if self.chain_file.exists() else None
        )

    def up(
        self, spec: ChainSpec, progress: Callable[[int], None] | None = None
    ) -> tuple[NodeInfo, ChainInfo]:
        info = self.node.start()
        rpc = Rpc(info.url)
        try:
            known = self.chain()
            if (
                known is not None
                and known.spec == spec
                and known.big_token  # a chain.json from before the large-amount token
                and rpc.block_number() == known.head
            ):
                return info, known
            if rpc.block_number() != 0:  # a different chain is running: start it over
                self.node.stop()
                info = self.node.start()
                rpc = Rpc(info.url)
            try:
                chain = Generator(rpc, spec).run(progress)
            except BaseException:
                self.node.stop()  # a half-made chain is no devnet: nothing left listening
                raise
            self.chain_file.write_text(chain.to_json())
            return info, chain
        finally:
            rpc.close()

    def down(self) -> None:
        self.node.stop()
        self.chain_file.unlink(missing_ok=True)

    def status(self) -> dict[str, object]:
        info = self.node.info()
        running = self.node.running()
        chain = self.chain()
        out: dict[str, object] = {
            "running": running,
            "rpc_url": info.url if info and running else None,
        }
        if running and info is not None:
            rpc = Rpc(info.url)
            out["head"] = rpc.block_number()
            rpc.close()
        if chain is not None:
            out.update(
                {
                    "seed": chain.spec.seed,
                    "token": chain.token,
                    "staking": chain.staking,
                    "generated_head": chain.head,
                }
            )
        return out
