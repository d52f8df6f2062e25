"""What a payer can do to its own EIP-3009 nonces behind our back, as tests do it on the local
chain: cancel a nonce (``cancelAuthorization``), or spend it with another authorization (to
itself, to anyone, for any value). Payers hold no ETH, so the devnet's deployer sends the
payer-signed call (anyone may). Each returns the mined receipt, or with ``raw=True`` the signed
transaction (0x hex) unsent, for a reorg to put in a block of its own (``anvil_reorg``)."""

from __future__ import annotations

import os
import time
from typing import Any

from eth_account import Account
from eth_account.messages import encode_typed_data
from web3 import Web3

from relayer.chain import calls
from relayer.domain import eip712
from relayer.domain.chains import usdc_domain_name

CANCEL_AUTHORIZATION_FIELDS = [
    {"name": "authorizer", "type": "address"},
    {"name": "nonce", "type": "bytes32"},
]


def _domain(chain: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": usdc_domain_name(int(chain["chainId"])),
        "version": "2",
        "chainId": int(chain["chainId"]),
        "verifyingContract": chain["contracts"]["usdc"],
    }


def cancel_call(chain: dict[str, Any], payer_key: str, nonce: bytes) -> bytes:
    """The call data of USDC's ``cancelAuthorization(payer, nonce, v, r, s)`` signed by the payer."""
    payer = Account.from_key(payer_key)
    typed = {
        "types": {"EIP712Domain": eip712.DOMAIN_FIELDS, "CancelAuthorization": CANCEL_AUTHORIZATION_FIELDS},
        "primaryType": "CancelAuthorization",
        "domain": _domain(chain),
        "message": {"authorizer": payer.address, "nonce": "0x" + nonce.hex()},
    }
    signed = Account.sign_message(encode_typed_data(full_message=typed), payer_key)
    selector = Web3.keccak(text="cancelAuthorization(address,bytes32,uint8,bytes32,bytes32)")[:4]
    from eth_abi import encode

    args = encode(
        ["address", "bytes32", "uint8", "bytes32", "bytes32"],
        [payer.address, nonce, signed.v, signed.r.to_bytes(32, "big"), signed.s.to_bytes(32, "big")],
    )
    return bytes(selector) + args


def spend_call(
    chain: dict[str, Any], payer_key: str, to: str, value: int, nonce: bytes, valid_before: int | None = None
) -> bytes:
    """The call data of USDC's ``transferWithAuthorization`` of ``value`` (atomic units) from
    the payer to ``to`` with the payer's ``nonce``, signed by the payer."""
    payer = Account.from_key(payer_key)
    before = valid_before or int(time.time()) + 3600
    typed = eip712.transfer_with_authorization(
        chain_id=int(chain["chainId"]),
        usdc=chain["contracts"]["usdc"],
        payer=payer.address,
        to=to,
        value=value,
        valid_after=0,
        valid_before=before,
        nonce=nonce,
    )
    signed = Account.sign_message(encode_typed_data(full_message=typed), payer_key)
    signature = eip712.parse_signature(bytes(signed.signature))
    return calls.transfer_with_authorization(payer.address, to, value, 0, before, nonce, signature)


def send(
    chain: dict[str, Any], data: bytes, *, raw: bool = False, role: str = "deployer", tip_wei: int = 0
) -> Any:
    """Send ``data`` to USDC from the devnet account ``role`` (no tip unless ``tip_wei``, which
    orders it before our own transactions in a block): the mined receipt (its ``status`` 1 or
    0), or with ``raw`` the signed transaction, unsent (0x hex)."""
    w3 = Web3(Web3.HTTPProvider(chain["rpcUrl"]))
    sender = Account.from_key(chain[role]["privateKey"])
    base_fee = int(w3.eth.get_block("latest")["baseFeePerGas"])  # type: ignore[arg-type]
    tx = {
        "type": 2,
        "chainId": int(chain["chainId"]),
        "to": chain["contracts"]["usdc"],
        "data": data,
        "value": 0,
        "gas": 200_000,
        "nonce": w3.eth.get_transaction_count(sender.address, "pending"),
        "maxFeePerGas": 4 * base_fee + 1 + tip_wei,
        "maxPriorityFeePerGas": tip_wei,
    }
    signed = sender.sign_transaction(tx).raw_transaction
    if raw:
        return "0x" + bytes(signed).hex()
    return w3.eth.wait_for_transaction_receipt(w3.eth.send_raw_transaction(signed), timeout=30)


def cancel(chain: dict[str, Any], payer_key: str, nonce: bytes) -> Any:
    """The payer cancels its ``nonce`` (mined; the receipt)."""
    receipt = send(chain, cancel_call(chain, payer_key, nonce))
    assert receipt["status"] == 1, receipt
    return receipt


def spend(chain: dict[str, Any], payer_key: str, nonce: bytes, to: str | None = None, value: int = 1) -> Any:
    """The payer spends its ``nonce`` on another authorization: ``value`` to ``to`` (default
    itself), mined; the receipt."""
    payer = Account.from_key(payer_key).address
    receipt = send(chain, spend_call(chain, payer_key, to or payer, value, nonce))
    assert receipt["status"] == 1, receipt
    return receipt


def new_nonce() -> bytes:
    return os.urandom(32)
