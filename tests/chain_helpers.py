"""Chain reads only the tests need (balances, the settlement's own nonce binding), made
through the daemon's own chain node so they take the same code path as production reads;
and the deployer's transactions that only tests send."""

from __future__ import annotations

from typing import Any

from relayer.chain import codec
from relayer.chain.node import ChainNode, address
from relayer.domain.retirement import Retirement

_CONTRACTS = {"usdc": "UsdcEip3009", "kvcm": "KlimaVcm"}


async def token_balance(node: ChainNode, token: str, owner: str) -> int:
    """``balanceOf(owner)`` of ``token`` ("usdc" or "kvcm"), atomic units."""
    (balance,) = await node.call(
        getattr(node.contracts, token), codec.function(_CONTRACTS[token], "balanceOf"), owner
    )
    return int(balance)


async def eth_balance(node: ChainNode, owner: str) -> int:
    """ETH balance of ``owner``, wei."""
    return int(await node.w3.eth.get_balance(address(owner)))


async def chain_hash_retirement(node: ChainNode, retirement: Retirement, salt: bytes) -> bytes:
    """The settlement's own ``authorizationNonce(r, salt)``."""
    function = codec.function("RetirementSettlement", "authorizationNonce")
    (nonce,) = await node.call(node.contracts.settlement, function, retirement.as_tuple(), salt)
    return bytes(nonce)


def transact_as_deployer(chain: dict[str, Any], to: str, contract: str, function: str, *args: Any) -> None:
    """Call ``contract.function(*args)`` at ``to`` as the devnet's deployer (the protocol owner,
    who holds ETH) and wait for success: what only a test does to the chain (sync web3)."""
    from eth_account import Account
    from web3 import Web3

    from relayer.chain.abi import abi

    w3 = Web3(Web3.HTTPProvider(chain["rpcUrl"]))
    sender = Account.from_key(chain["deployer"]["privateKey"])
    handle = w3.eth.contract(address=Web3.to_checksum_address(to), abi=abi(contract))
    base_fee = int(w3.eth.get_block("latest")["baseFeePerGas"])
    tx = getattr(handle.functions, function)(*args).build_transaction(
        {
            "from": sender.address,
            "nonce": w3.eth.get_transaction_count(sender.address),
            "chainId": chain["chainId"],
            # No tip: the executor's fee caps follow the recent median tip, and a test's own
            # transaction must not move the market its relays were priced at.
            "maxPriorityFeePerGas": 0,
            "maxFeePerGas": 2 * base_fee + 1,
        }
    )
    receipt = w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction), timeout=30
    )
    assert receipt["status"] == 1
