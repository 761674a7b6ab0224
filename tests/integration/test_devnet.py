"""The devnet: a real anvil, deterministic for a seed, whose state the logs reproduce."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from trace_platform.chain import Rpc, calldata, topic0
from trace_platform.devnet import ChainSpec, Devnet, node
from trace_platform.devnet.big_token import MAX, SCRIPT, replay
from trace_platform.devnet.chain import STAKING_ADDRESS
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
