"""The devnet: a real anvil, deterministic for a seed, whose state the logs reproduce."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trace_platform.chain import Rpc, RpcError, calldata, topic0
from trace_platform.devnet import ChainSpec, Devnet, node
from trace_platform.devnet.big_token import MAX, SCRIPT, replay
from trace_platform.devnet.chain import DEPLOYER, STAKING_ADDRESS, Generator, account
from trace_platform.devnet.node import AnvilNode

pytestmark = pytest.mark.slow
SPEC = ChainSpec(seed=11, blocks=240, accounts=40, validators=4, epoch_blocks=50)
TRANSFER = topic0("Transfer(address,address,uint256)")
DELEGATE = topic0("Delegate(uint64,address,uint256,uint64)")
UNDELEGATE = topic0("Undelegate(uint64,address,uint8,uint256,uint64)")
ZERO = "0x" + "0" * 40


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Devnet, Rpc]]:
    d = Devnet(tmp_path_factory.mktemp("devnet-home"))
    info, _ = d.up(SPEC)
    rpc = Rpc(info.url)
    yield d, rpc
    rpc.close()
    d.down()


def addr(topic: str) -> str:
    return "0x" + topic[-40:]


def test_same_seed_same_chain(devnet: tuple[Devnet, Rpc], tmp_path: Path) -> None:
    d, rpc = devnet
    other = Devnet(tmp_path)
    try:
        info, chain = other.up(SPEC)
        theirs = Rpc(info.url)
        for b in (1, 100, SPEC.blocks):
            ours = rpc.call("eth_getBlockByNumber", hex(b), False)["hash"]
            assert theirs.call("eth_getBlockByNumber", hex(b), False)["hash"] == ours
        assert chain.token == d.chain().token  # type: ignore[union-attr]
        theirs.close()
    finally:
        other.down()


def test_reuse_when_already_up(devnet: tuple[Devnet, Rpc]) -> None:
    d, rpc = devnet
    _, chain = d.up(SPEC)
    assert chain.head == SPEC.blocks == rpc.block_number()
    assert d.status()["running"] is True


def test_token_supply_and_balances_follow_from_the_logs(devnet: tuple[Devnet, Rpc]) -> None:
    d, rpc = devnet
    chain = d.chain()
    assert chain is not None
    logs = rpc.call(
        "eth_getLogs",
        {
            "fromBlock": "0x0",
            "toBlock": hex(SPEC.blocks),
            "address": chain.token,
            "topics": [TRANSFER],
        },
    )
    assert len(logs) > 100
    for at in (60, 150, SPEC.blocks):
        supply = 0
        balances: dict[str, int] = {}
        for log in logs:
            if int(log["blockNumber"], 16) > at:
                continue
            src, dst, value = addr(log["topics"][1]), addr(log["topics"][2]), int(log["data"], 16)
            supply += value if src == ZERO else 0
            supply -= value if dst == ZERO else 0
            balances[src] = balances.get(src, 0) - value
            balances[dst] = balances.get(dst, 0) + value
        assert rpc.eth_call(chain.token, calldata("totalSupply()"), at) == supply
        for holder in sorted(h for h in balances if h != ZERO)[:5]:
            assert (
                rpc.eth_call(chain.token, calldata("balanceOf(address)", holder), at)
                == balances[holder]
            )


def test_staking_events_reproduce_delegations(devnet: tuple[Devnet, Rpc]) -> None:
    _, rpc = devnet
    logs = rpc.call(
        "eth_getLogs",
        {
            "fromBlock": "0x0",
            "toBlock": hex(SPEC.blocks),
            "address": STAKING_ADDRESS,
            "topics": [[DELEGATE, UNDELEGATE]],
        },
    )
    stake: dict[tuple[int, str], int] = {}
    for log in logs:
        key = (int(log["topics"][1], 16), addr(log["topics"][2]))
        data = log["data"][2:]
        words = [int(data[i : i + 64], 16) for i in range(0, len(data), 64)]
        amount = words[0] if log["topics"][0] == DELEGATE else words[1]
        stake[key] = stake.get(key, 0) + (amount if log["topics"][0] == DELEGATE else -amount)
    assert any(log["topics"][0] == UNDELEGATE for log in logs)
    for (validator, delegator), amount in list(stake.items())[:10]:
        view = rpc.eth_call(
            STAKING_ADDRESS, calldata("delegation(uint64,address)", validator, delegator)
        )
        assert view == amount
    total = rpc.eth_call(STAKING_ADDRESS, calldata("totalStake()"))
    assert total == sum(stake.values())


def test_the_large_amount_token_follows_its_script(devnet: tuple[Devnet, Rpc]) -> None:
    """2^200, 2^255, 2^256-1 and amounts across 10^38: the node agrees with the script, step by
    step (and so with what the analytics must compute)."""
    d, rpc = devnet
    chain = d.chain()
    assert chain is not None and chain.big_token and chain.big_token != chain.token
    logs = rpc.call(
        "eth_getLogs",
        {"fromBlock": "0x0", "toBlock": hex(SPEC.blocks), "address": chain.big_token},
    )
    assert [int(log["data"], 16) for log in logs] == [s.amount for s in SCRIPT]

    def who(i: int | None) -> str:
        return ZERO if i is None else chain.big_holders[i]

    for log, step in zip(logs, SCRIPT, strict=True):
        assert (addr(log["topics"][1]), addr(log["topics"][2])) == (who(step.src), who(step.dst))
    for log, supply in zip(logs, replay()[1], strict=True):
        block = int(log["blockNumber"], 16)
        assert rpc.eth_call(chain.big_token, calldata("totalSupply()"), block) == supply
    assert max(replay()[1]) == MAX
    for holder, balance in zip(chain.big_holders, replay()[0], strict=True):
        assert rpc.eth_call(chain.big_token, calldata("balanceOf(address)", holder)) == balance


def test_a_node_that_lost_its_port_to_another_starts_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two devnets starting at once both saw 8545 free: the second's anvil could not bind it,
    the first's answered there, and the second chain was generated onto the first node ("nonce
    too low", "already imported" in a full run). A node is ready only on the port its own log
    says it listens on; one that lost its port starts again on a port of its own."""
    first = AnvilNode(tmp_path / "first", tmp_path)
    taken = first.start()
    try:
        monkeypatch.setattr(node, "DEFAULT_PORT", taken.port)
        monkeypatch.setattr(node, "port_free", lambda port: True)  # it looked free a moment ago
        second = AnvilNode(tmp_path / "second", tmp_path)
        got = second.start()
        try:
            assert got.pid != taken.pid and got.port != taken.port
            assert second.running() and first.running()
        finally:
            second.stop()
    finally:
        first.stop()


def test_two_starts_under_one_root_each_read_their_own_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two starts under one root (two `trace devnet up` at once) shared one anvil.log: a launch
    whose anvil had not yet said where it listens read the other's "Listening on" line, took
    that node for its own and generated its chain onto it. Here the second launch's anvil is
    held back until the first node is up and the held launch has read its log since."""
    gate, lock = tmp_path / "gate", tmp_path / "held"
    wrapper = tmp_path / "anvil"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if mkdir "{lock}" 2>/dev/null; then\n'  # the first launch only: held at the gate
        f'  while [ ! -e "{gate}" ]; do sleep 0.02; done\n'
        "fi\n"
        f'exec "{node.find_anvil(tmp_path)}" "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("TRACE_ANVIL_BIN", str(wrapper))
    # Settled: the held launch read its log after the first node was up, or returned already.
    first_up, settled = threading.Event(), threading.Event()
    listening = node._listening

    def spied(*args: Any) -> int | None:
        up = first_up.is_set()
        port = listening(*args)
        if up and threading.current_thread() is not threading.main_thread():
            settled.set()
        return port

    monkeypatch.setattr(node, "_listening", spied)
    root = tmp_path / "devnet"
    held, other = AnvilNode(root, tmp_path), AnvilNode(root, tmp_path)
    got: list[node.NodeInfo] = []

    def start_held() -> None:
        try:
            got.append(held.start())
        finally:
            settled.set()

    starting = threading.Thread(target=start_held)
    starting.start()
    try:
        while not lock.exists():  # the held launch's anvil is waiting at the gate
            assert starting.is_alive()
            time.sleep(0.02)
        theirs = other.start()
        first_up.set()
        assert settled.wait(60)
        gate.touch()
        starting.join(60)
        assert got and got[0].port != theirs.port and got[0].pid != theirs.pid
        for info in (got[0], theirs):
            with Rpc(info.url) as rpc:
                assert rpc.call("eth_chainId") == hex(31337)
    finally:
        gate.touch()
        starting.join(60)
        other.stop()
        held.stop()
    for info in (*got, theirs):
        assert not Path(f"/proc/{info.pid}").exists()  # stopped and reaped: no zombie


def test_a_rejected_send_leaves_no_nonce_gap(tmp_path: Path) -> None:
    """The generator counts each sender's nonces; a send the node rejected took none, and
    with the count left ahead every later transaction of that sender waited in anvil's queue
    behind the gap, never mined."""
    n = AnvilNode(tmp_path / "devnet", tmp_path)
    info = n.start()
    try:
        with Rpc(info.url) as rpc:
            rpc.call("anvil_autoImpersonateAccount", True)
            sender = account(99, 0)
            rpc.call("anvil_setBalance", sender, hex(10**18))
            gen = Generator(rpc, ChainSpec(blocks=10))
            with pytest.raises(RpcError, match="eth_sendTransaction"):  # more than it has
                gen._mine([gen._tx(sender, DEPLOYER, "0x", value=10**19)])
            gen._mine([gen._tx(sender, DEPLOYER, "0x", value=1)])
            assert int(rpc.call("eth_getTransactionCount", sender, "latest"), 16) == 1
            assert rpc.block_number() == gen.block
    finally:
        n.stop()
