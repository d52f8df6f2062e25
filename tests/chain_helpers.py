"""Chain reads only the tests need (balances, the settlement's own nonce binding), made
through the daemon's own chain node so they take the same code path as production reads;
the transactions that only tests send (as the deployer or another devnet role); and the
deployment files of the local chains a daemon indexes."""

from __future__ import annotations

import json
from pathlib import Path
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


def write_deployment_file(chain: dict[str, Any], path: Path) -> Path:
    """Write a devnet description (``contracts``, ``deployBlock`` and the rest, as
    ``deploy_and_seed`` returns it) to ``path`` as JSON: the deployment file a daemon reads,
    for its own chain (``RELAYER_DEPLOYMENT_FILE``) or an indexed one. Returns ``path``."""
    path.write_text(json.dumps({k: v for k, v in chain.items() if k != "deploymentFile"}, indent=1))
    return path


def index_chain_setting(chain: dict[str, Any], confirmations: int = 1) -> dict[str, Any]:
    """One entry of ``RELAYER_INDEX_CHAINS`` (``Settings.index_chains``) for a local chain
    described with a ``deploymentFile`` (the ``polygon_chain`` fixture): ``chainId``,
    ``rpcUrl``, ``deploymentFile`` and ``confirmations`` (1: anvil mines a block per
    transaction)."""
    return {
        "chainId": chain["chainId"],
        "rpcUrl": chain["rpcUrl"],
        "deploymentFile": chain["deploymentFile"],
        "confirmations": confirmations,
    }


def transact_as_deployer(chain: dict[str, Any], to: str, contract: str, function: str, *args: Any) -> None:
    """Call ``contract.function(*args)`` at ``to`` as the devnet's deployer (the protocol owner,
    who holds ETH) and wait for success: what only a test does to the chain (sync web3)."""
    receipt = transact_as(chain, "deployer", to, contract, function, *args)
    assert receipt["status"] == 1


def transact_as(chain: dict[str, Any], role: str, to: str, contract: str, function: str, *args: Any) -> Any:
    """Send ``contract.function(*args)`` at ``to`` from the devnet account ``role``
    (``"deployer"``, ``"seller"``, ...: one that holds ETH) without a tip, and return its
    receipt (web3's ``TxReceipt``; ``status`` 1 or 0). Gas is estimated, so a call that
    would revert raises web3's ``ContractLogicError`` before anything is sent."""
    from eth_account import Account
    from web3 import Web3

    from relayer.chain.abi import abi

    w3 = Web3(Web3.HTTPProvider(chain["rpcUrl"]))
    sender = Account.from_key(chain[role]["privateKey"])
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
    return w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction), timeout=30
    )
