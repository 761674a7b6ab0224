"""The devnet's staking contract emits Monad's exact events: topic0 = keccak of the signature,
checked against the values in FACTS.md and against what vyper compiled."""

from __future__ import annotations

import pytest

from trace_platform.chain import calldata, selector, topic0, word
from trace_platform.devnet.chain import compile_contract

MONAD = {
    "ValidatorCreated(uint64,address,uint256)": "0x6f8045cd38e512b8f12f6f02947c632e5f25af03aad132890ecf50015d97c1b2",
    "Delegate(uint64,address,uint256,uint64)": "0xe4d4df1e1827dd28252fd5c3cd7ebccd3da6e0aa31f74c828f3c8542af49d840",
    "Undelegate(uint64,address,uint8,uint256,uint64)": "0x3e53c8b91747e1b72a44894db10f2a45fa632b161fdcdd3a17bd6be5482bac62",
    "Withdraw(uint64,address,uint8,uint256,uint64)": "0x63030e4238e1146c63f38f4ac81b2b23c8be28882e68b03f0887e50d0e9bb18f",
    "ClaimRewards(uint64,address,uint256,uint64)": "0xcb607e6b63c89c95f6ae24ece9fe0e38a7971aa5ed956254f1df47490921727b",
    "ValidatorRewarded(uint64,address,uint256,uint64)": "0x3a420a01486b6b28d6ae89c51f5c3bde3e0e74eecbb646a0c481ccba3aae3754",
    "EpochChanged(uint64,uint64)": "0x4fae4dbe0ed659e8ce6637e3c273cd8e4d3bf029b9379a9e8b3f3f27dbef809b",
}


@pytest.mark.parametrize(("signature", "expected"), MONAD.items())
def test_topic0_is_keccak_of_signature(signature: str, expected: str) -> None:
    assert topic0(signature) == expected


def test_compiled_staking_abi_has_monads_events() -> None:
    abi = compile_contract("Staking")["abi"]
    events = {
        f"{e['name']}({','.join(i['type'] for i in e['inputs'])})": [
            i["indexed"] for i in e["inputs"]
        ]
        for e in abi
        if e["type"] == "event"
    }
    assert set(MONAD) <= set(events)
    assert events["Delegate(uint64,address,uint256,uint64)"] == [True, True, False, False]
    transfer = topic0("Transfer(address,address,uint256)")
    assert transfer == "0xddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef"


def test_abi_words() -> None:
    assert selector("transfer(address,uint256)") == "0xa9059cbb"
    assert word("0xAbC") == "0" * 61 + "abc"
    assert calldata("balanceOf(address)", "0x" + "11" * 20) == "0x70a08231" + "0" * 24 + "11" * 20
    with pytest.raises(ValueError):
        word(-1)
