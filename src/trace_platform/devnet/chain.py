"""Deterministic chain activity on the devnet: a token (mint, burn, transfer), a large-amount
token (big_token.py: 2^200, 2^255, 2^256-1 and amounts across 10^38) and Monad-style staking
(validators, delegate, undelegate, withdraw, epochs). Same seed, same chain.

Within a block every account takes part in at most one action, so the outcome never depends
on how the node orders transactions inside the block; every action is valid against the
state tracked here, so no transaction reverts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from trace_platform.chain import Rpc, calldata
from trace_platform.devnet import big_token

STAKING_ADDRESS = "0x0000000000000000000000000000000000001000"
DEPLOYER = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266"  # anvil's first unlocked account
GENESIS_TIME = 1_750_000_000
ETHER = 10**18


@dataclass
class ChainSpec:
    seed: int = 7
    blocks: int = 2000
    accounts: int = 200
    validators: int = 10
    epoch_blocks: int = 100
    max_actions: int = 4


@dataclass
class ChainInfo:
    spec: ChainSpec
    token: str
    staking: str
    head: int
    accounts: list[str] = field(default_factory=list)
    validators: list[int] = field(default_factory=list)
    big_token: str = ""  # empty in a chain.json written before it existed
    big_holders: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: str) -> ChainInfo:
        d = json.loads(raw)
        return cls(spec=ChainSpec(**d.pop("spec")), **d)


def compile_contract(name: str) -> dict[str, Any]:
    import vyper

    source = (resources.files("trace_platform.devnet") / "contracts" / f"{name}.vy").read_text()
    out = vyper.compile_code(source, output_formats=["bytecode", "bytecode_runtime", "abi"])
    return dict(out)


def account(seed: int, i: int) -> str:
    return "0x" + hashlib.sha256(f"trace-devnet:{seed}:{i}".encode()).hexdigest()[:40]


class Generator:
    def __init__(self, rpc: Rpc, spec: ChainSpec) -> None:
        self.rpc = rpc
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.accounts = [account(spec.seed, i) for i in range(spec.accounts)]
        self.token_balance: dict[str, int] = {}
        self.stake: dict[tuple[int, str], int] = {}
        self.pending: dict[tuple[int, str], int] = {}  # withdrawId 0 per (validator, delegator)
        self.token = ""
        self.big_token = ""
        self.big_holders = big_token.holders(spec.seed)
        self.validators: list[int] = []
        self.block = int(rpc.call("eth_blockNumber"), 16)
        self.nonces: dict[str, int] = {}  # each sender's next nonce (_nonce)
        # The large-amount token's script: one step per block, after setup, before the head.
        self.big_steps = big_token.schedule(self.block + 3, spec.blocks - 1)

    def _nonce(self, sender: str) -> int:
        """The sender's next nonce, counted here: a batch's calls are not always run one by one
        (two equal deployments with the node's own nonce once came out one transaction, "already
        imported"), and every transaction a sender makes is made here."""
        n = self.nonces.get(sender)
        if n is None:
            n = int(self.rpc.call("eth_getTransactionCount", sender, "pending"), 16)
        self.nonces[sender] = n + 1
        return n

    def _tx(self, sender: str, to: str | None, data: str, value: int = 0) -> tuple[str, list[Any]]:
        tx: dict[str, Any] = {
            "from": sender,
            "data": data,
            "gas": hex(3_000_000),
            "nonce": hex(self._nonce(sender)),
        }
        if to is not None:
            tx["to"] = to
        if value:
            tx["value"] = hex(value)
        return "eth_sendTransaction", [tx]

    def _mine(self, calls: list[tuple[str, list[Any]]]) -> None:
        self.block += 1
        # One HTTP request per block: anvil runs a batch's calls in order.
        try:
            self.rpc.batch([*calls, ("evm_mine", [GENESIS_TIME + self.block])])
        except Exception:
            # A rejected transaction took no nonce on the node, so the counts here ran ahead:
            # each later one would wait in anvil's queue behind the gap, never mined. The next
            # send asks the node again (its pending count); the head too may not have moved.
            self.nonces.clear()
            with contextlib.suppress(Exception):  # a node gone: the error above says so
                self.block = int(self.rpc.call("eth_blockNumber"), 16)
            raise

    def setup(self) -> None:
        r = self.rpc
        r.call("anvil_autoImpersonateAccount", True)
        funded = [DEPLOYER, *self.accounts, *self.big_holders]
        r.batch([("anvil_setBalance", [a, hex(10**9 * ETHER)]) for a in funded])
        token = compile_contract("Token")
        staking = compile_contract("Staking")
        r.call("anvil_setCode", STAKING_ADDRESS, staking["bytecode_runtime"])
        # Both tokens in one block, the ordinary one first (its address stays the first
        # deployment's, which the demo defaults to).
        self._mine([self._tx(DEPLOYER, None, token["bytecode"]) for _ in range(2)])
        block = r.call("eth_getBlockByNumber", hex(self.block), False)
        self.token, self.big_token = (
            r.call("eth_getTransactionReceipt", tx)["contractAddress"]
            for tx in block["transactions"]
        )
        creates = []
        for v in range(1, self.spec.validators + 1):
            auth = self.accounts[v - 1]
            commission = self.rng.randint(0, 20) * 10**16
            creates.append(
                self._tx(
                    DEPLOYER,
                    STAKING_ADDRESS,
                    calldata("createValidator(address,uint256)", auth, commission),
                )
            )
            self.validators.append(v)
        self._mine(creates)

    def _actions(self) -> list[tuple[str, list[Any]]]:
        rng, busy = self.rng, set()
        calls: list[tuple[str, list[Any]]] = []

        def pick(candidates: list[str]) -> str | None:
            free = [a for a in candidates if a not in busy]
            if not free:
                return None
            choice = rng.choice(free)
            busy.add(choice)
            return choice

        for _ in range(rng.randint(0, self.spec.max_actions)):
            kind = rng.choices(
                ["mint", "transfer", "burn", "delegate", "undelegate", "withdraw"],
                weights=[3, 6, 1, 3, 1, 1],
            )[0]
            holders = [a for a, b in self.token_balance.items() if b > 0]
            if kind == "mint" and (to := pick(self.accounts)):
                amount = rng.randint(1, 1000) * ETHER
                self.token_balance[to] = self.token_balance.get(to, 0) + amount
                calls.append(
                    self._tx(DEPLOYER, self.token, calldata("mint(address,uint256)", to, amount))
                )
            elif kind == "transfer" and (src := pick(holders)) and (dst := pick(self.accounts)):
                amount = rng.randint(1, self.token_balance[src])
                self.token_balance[src] -= amount
                self.token_balance[dst] = self.token_balance.get(dst, 0) + amount
                calls.append(
                    self._tx(src, self.token, calldata("transfer(address,uint256)", dst, amount))
                )
            elif kind == "burn" and (src := pick(holders)):
                amount = rng.randint(1, self.token_balance[src])
                self.token_balance[src] -= amount
                calls.append(self._tx(src, self.token, calldata("burn(uint256)", amount)))
            elif kind == "delegate" and (who := pick(self.accounts)):
                v = rng.choice(self.validators)
                amount = rng.randint(1, 10_000) * ETHER
                self.stake[(v, who)] = self.stake.get((v, who), 0) + amount
                calls.append(
                    self._tx(who, STAKING_ADDRESS, calldata("delegate(uint64)", v), value=amount)
                )
            elif kind == "undelegate":
                staked = [
                    k
                    for k, s in self.stake.items()
                    if s > 0 and k[1] not in busy and (k not in self.pending)
                ]
                if staked:
                    v, who = rng.choice(staked)
                    busy.add(who)
                    amount = rng.randint(1, self.stake[(v, who)])
                    self.stake[(v, who)] -= amount
                    self.pending[(v, who)] = amount
                    calls.append(
                        self._tx(
                            who,
                            STAKING_ADDRESS,
                            calldata("undelegate(uint64,uint256,uint8)", v, amount, 0),
                        )
                    )
            elif kind == "withdraw":
                ready = [k for k in self.pending if k[1] not in busy]
                if ready:
                    v, who = rng.choice(sorted(ready))
                    busy.add(who)
                    del self.pending[(v, who)]
                    calls.append(
                        self._tx(who, STAKING_ADDRESS, calldata("withdraw(uint64,uint8)", v, 0))
                    )
        return calls

    def _big_step(self, step: big_token.Step) -> tuple[str, list[Any]]:
        """The large-amount token's step (its holders take no part in anything else)."""
        to = self.big_holders[step.dst] if step.dst is not None else ""
        if step.kind == "mint":
            return self._tx(
                DEPLOYER, self.big_token, calldata("mint(address,uint256)", to, step.amount)
            )
        assert step.src is not None
        src = self.big_holders[step.src]
        if step.kind == "transfer":
            data = calldata("transfer(address,uint256)", to, step.amount)
        else:
            data = calldata("burn(uint256)", step.amount)
        return self._tx(src, self.big_token, data)

    def run(self, progress: Any = None) -> ChainInfo:
        big_token.replay(tuple(self.big_steps.values()))  # every step valid: nothing reverts
        self.setup()
        while self.block < self.spec.blocks:
            calls = self._actions()
            step = self.big_steps.get(self.block + 1)  # the block being built
            if step is not None:
                calls.append(self._big_step(step))
            if self.block % self.spec.epoch_blocks == 0:
                calls.append(self._tx(DEPLOYER, STAKING_ADDRESS, calldata("advanceEpoch()")))
            self._mine(calls)
            if progress is not None:
                progress(self.block)
        return ChainInfo(
            self.spec,
            self.token,
            STAKING_ADDRESS,
            self.block,
            self.accounts,
            self.validators,
            self.big_token,
            self.big_holders,
        )
