"""The follower's side of the chain: heads, block receipts (one ``eth_getBlockReceipts`` per
block), ``RetirementSettled`` logs (one ``eth_getLogs`` per range, decoded with the ABI
codec into domain types) and block timestamps. A new head clears the node's read cache."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from eth_typing import BlockNumber, HexStr
from web3.types import FilterParams

from relayer.chain import calls, codec
from relayer.chain.errors import rpc
from relayer.chain.node import ChainNode, address
from relayer.chain.types import BlockHeader, Receipt, SettledLog

# Strings in the event are decoded as bytes (the same ABI encoding): anyone can settle a
# retirement whose details hold invalid UTF-8, and the index must still move past it.
_SETTLED: Final = codec.event("RetirementSettlement", "RetirementSettled").with_strings_as_bytes()


class FollowerChain:
    """Reads that follow the chain block by block.

    Every method raises ``ChainUnavailable`` when the node fails.
    """

    def __init__(self, node: ChainNode) -> None:
        self.node = node

    async def head(self) -> int:
        """Latest block number; a change drops the node's cached reads."""
        number = int(await rpc(self.node.w3.eth.block_number))
        self.node.observe_head(number)
        return number

    async def head_block(self) -> BlockHeader:
        """The latest block's number, hash and parent hash; a new head drops the node's
        cached reads."""
        block = await rpc(self.node.w3.eth.get_block("latest"))
        header = BlockHeader(int(block["number"]), bytes(block["hash"]), bytes(block["parentHash"]))
        self.node.observe_head(header.number)
        return header

    async def block_hash(self, number: int) -> bytes:
        block = await rpc(self.node.w3.eth.get_block(BlockNumber(number)))
        return bytes(block["hash"])

    async def block_timestamps(self, numbers: set[int]) -> dict[int, int]:
        """Unix timestamps of the given blocks (one ``eth_getBlockByNumber`` each, concurrently)."""
        blocks = await asyncio.gather(
            *(rpc(self.node.w3.eth.get_block(BlockNumber(n))) for n in sorted(numbers))
        )
        return {int(b["number"]): int(b["timestamp"]) for b in blocks}

    async def block_receipts(self, number: int) -> list[Receipt]:
        """All receipts of one block (one ``eth_getBlockReceipts``)."""
        receipts = await rpc(self.node.w3.eth.get_block_receipts(BlockNumber(number)))
        return [
            Receipt(
                tx_hash=bytes(r["transactionHash"]),
                block_number=int(r["blockNumber"]),
                block_hash=bytes(r["blockHash"]),
                status=int(r["status"]),
                gas_used=int(r["gasUsed"]),
                effective_gas_price=int(r.get("effectiveGasPrice", 0)),
                l1_fee=_quantity(r.get("l1Fee")) + _operator_fee(r),
            )
            for r in receipts
        ]

    async def settled_logs(self, from_block: int, to_block: int) -> list[SettledLog]:
        """``RetirementSettled`` events of the settlement in a block range (one ``eth_getLogs``)."""
        query: FilterParams = {
            "address": address(self.node.contracts.settlement),
            "fromBlock": BlockNumber(from_block),
            "toBlock": BlockNumber(to_block),
            "topics": [HexStr("0x" + _SETTLED.topic.hex())],
        }
        return [_settled(entry) for entry in await rpc(self.node.w3.eth.get_logs(query))]


def _settled(entry: Any) -> SettledLog:
    (payer, beneficiary, index), (value, fee, cost, refunded, nonce, retirement) = _SETTLED.decode(
        [bytes(t) for t in entry["topics"]], bytes(entry["data"])
    )
    return SettledLog(
        tx_hash=bytes(entry["transactionHash"]),
        block_number=int(entry["blockNumber"]),
        block_hash=bytes(entry["blockHash"]),
        log_index=int(entry["logIndex"]),
        payer=payer,
        beneficiary=beneficiary,
        retirement_index=int(index),
        value=int(value),
        fee=int(fee),
        retirement_cost=int(cost),
        refunded=int(refunded),
        authorization_nonce=bytes(nonce),
        retirement=calls.retirement_from_tuple(retirement),
    )


def _quantity(value: object) -> int:
    """A receipt field web3 may leave unformatted (an OP-stack extra such as ``l1Fee``): an
    int, bytes, a hex quantity ("0x" is 0), or absent (0)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, bytes):
        return int.from_bytes(value, "big")
    digits = str(value).removeprefix("0x")  # a JSON-RPC quantity is hex
    return int(digits, 16) if digits else 0


def _operator_fee(receipt: Any) -> int:
    """The operator fee an OP-stack receipt implies (Isthmus: ``gasUsed * operatorFeeScalar
    / 1e6 + operatorFeeConstant``); 0 when it carries no operator-fee fields."""
    scalar, constant = receipt.get("operatorFeeScalar"), receipt.get("operatorFeeConstant")
    if scalar is None and constant is None:
        return 0
    return int(receipt["gasUsed"]) * _quantity(scalar) // 10**6 + _quantity(constant)
