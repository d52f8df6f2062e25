"""The executor's side of the chain: EIP-1559 base fee, simulation by ``eth_estimateGas``,
the lane's pending nonce and broadcast of signed bytes. Refusals of a broadcast that mean
"already there" are outcomes (:class:`SendOutcome`), not errors."""

from __future__ import annotations

from eth_typing import HexStr
from web3.types import TxParams

from relayer.chain.errors import SendOutcome, rpc, send_outcome, translate
from relayer.chain.node import ChainNode, address


class ExecutorChain:
    """Gas pricing, simulation and broadcast for executor transactions."""

    def __init__(self, node: ChainNode) -> None:
        self.node = node

    async def base_fee(self) -> int:
        """Base fee per gas of the latest block, wei (cached per head).

        Raises:
            ChainUnavailable: the node failed.
        """

        async def load() -> int:
            block = await rpc(self.node.w3.eth.get_block("latest"))
            return int(block.get("baseFeePerGas", 0))

        return await self.node.cached("base_fee", load)

    async def estimate_gas(self, sender: str, to: str, data: bytes, function: str | None = None) -> int:
        """Simulate the call from ``sender`` and return its gas (one ``eth_estimateGas``).

        Raises:
            ChainRevert: the simulation reverted (custom error decoded; ``function`` named).
            ChainUnavailable: the node failed.
        """
        tx: TxParams = {
            "from": address(sender),
            "to": address(to),
            "data": HexStr("0x" + data.hex()),
        }
        return int(await rpc(self.node.w3.eth.estimate_gas(tx), function))

    async def pending_nonce(self, account: str) -> int:
        """The next nonce the node would accept from ``account`` (counting its mempool).

        Raises:
            ChainUnavailable: the node failed.
        """
        return int(await rpc(self.node.w3.eth.get_transaction_count(address(account), "pending")))

    async def send_raw(self, raw: bytes) -> SendOutcome:
        """Broadcast signed bytes.

        Returns:
            SENT; KNOWN when the node already holds the transaction; STALE when its nonce is
            already used on-chain (mined earlier, or replaced).

        Raises:
            ChainUnavailable: any other failure (send the same bytes again later).
        """
        try:
            await self.node.w3.eth.send_raw_transaction(raw)
        except Exception as exc:
            outcome = send_outcome(exc)
            if outcome is not None:
                return outcome
            mapped = translate(exc)
            if mapped is None:
                raise
            raise mapped from None
        return SendOutcome.SENT
