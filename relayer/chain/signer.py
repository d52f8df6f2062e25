"""The executor's transaction signer: EIP-1559 transactions signed locally with the executor
key (coincurve-backed through eth-keys). The key never leaves this object and is never
logged."""

from __future__ import annotations

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.address import to_checksum_address


class ExecutorSigner:
    """Signs executor transactions for one chain."""

    def __init__(self, private_key: str, chain_id: int) -> None:
        self._account: LocalAccount = Account.from_key(private_key)
        self.chain_id = chain_id

    @property
    def address(self) -> str:
        return str(self._account.address)

    def __repr__(self) -> str:  # never show the key
        return f"ExecutorSigner({self.address}, chain {self.chain_id})"

    def sign(
        self,
        *,
        to: str,
        data: bytes,
        nonce: int,
        gas: int,
        max_fee_per_gas: int,
        max_priority_fee_per_gas: int,
    ) -> tuple[bytes, bytes]:
        """(raw transaction bytes, transaction hash) of an EIP-1559 call with value 0."""
        signed = self._account.sign_transaction(
            {
                "type": 2,
                "chainId": self.chain_id,
                "to": to_checksum_address(to),
                "data": data,
                "value": 0,
                "nonce": nonce,
                "gas": gas,
                "maxFeePerGas": max_fee_per_gas,
                "maxPriorityFeePerGas": max_priority_fee_per_gas,
            }
        )
        return bytes(signed.raw_transaction), bytes(signed.hash)
