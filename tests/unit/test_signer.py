"""The executor's own EIP-1559 signer (relayer/chain/signer.py) against eth-account's: the
same bytes and hash for every shape the relay signs (calls, no-ops, zero and huge fees)."""

from __future__ import annotations

import random

import pytest
from eth_account import Account

from relayer.chain.signer import ExecutorSigner


@pytest.mark.parametrize("seed", range(25))
def test_signed_bytes_are_eth_accounts(seed: int) -> None:
    rng = random.Random(seed)
    key = "0x" + rng.randbytes(32).hex()
    chain_id = rng.choice([8453, 84532, 31337])
    fields = {
        "to": Account.from_key("0x" + rng.randbytes(32).hex()).address,
        "data": rng.randbytes(rng.choice([0, 4, 68, 900])),
        "nonce": rng.choice([0, 1, rng.randrange(2**32)]),
        "gas": rng.choice([21_000, rng.randrange(30_000_000)]),
        "max_fee_per_gas": rng.choice([0, 1, rng.randrange(2**64)]),
        "max_priority_fee_per_gas": rng.choice([0, rng.randrange(2**40)]),
    }
    raw, tx_hash = ExecutorSigner(key, chain_id).sign(**fields)
    expected = Account.from_key(key).sign_transaction(
        {
            "type": 2,
            "chainId": chain_id,
            "to": fields["to"],
            "data": fields["data"],
            "value": 0,
            "nonce": fields["nonce"],
            "gas": fields["gas"],
            "maxFeePerGas": fields["max_fee_per_gas"],
            "maxPriorityFeePerGas": fields["max_priority_fee_per_gas"],
        }
    )
    assert raw == bytes(expected.raw_transaction)
    assert tx_hash == bytes(expected.hash)
    assert Account.recover_transaction(raw) == Account.from_key(key).address


def test_the_signer_never_shows_its_key() -> None:
    key = "0x" + "4f" * 32
    signer = ExecutorSigner(key, 84532)
    assert key[2:] not in repr(signer) and key[2:] not in str(vars(signer))


@pytest.mark.parametrize("to", ["0x1234", "0x" + "00" * 21])
def test_a_malformed_target_is_refused(to: str) -> None:
    with pytest.raises(ValueError):
        ExecutorSigner("0x" + "4f" * 32, 84532).sign(
            to=to, data=b"", nonce=0, gas=21_000, max_fee_per_gas=1, max_priority_fee_per_gas=0
        )
