"""Chain reads only the tests need (balances, the settlement's own nonce binding), made
through the daemon's own chain node so they take the same code path as production reads."""

from __future__ import annotations

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
