"""The executor's side of the chain: the fee market (``eth_feeHistory``), simulation by
``eth_estimateGas``, the lane's nonces and broadcast of signed bytes. A node's refusal of a
broadcast is an outcome (:class:`SendOutcome`) with its own handling, not an error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from eth_abi.exceptions import DecodingError

from relayer.chain import codec
from relayer.chain.errors import ChainUnavailable, SendOutcome, refusal
from relayer.chain.node import ChainNode

FEE_HISTORY_BLOCKS: Final = 5
TIP_PERCENTILE: Final = 50
_IS_EXECUTOR: Final = codec.function("RetirementSettlement", "isExecutor")


@dataclass(frozen=True, slots=True)
class FeeMarket:
    """What the next block will ask: its base fee (the last one ``eth_feeHistory`` gives)
    and the median tip of recent blocks, wei per gas."""

    next_base_fee: int
    recent_tip: int


class ExecutorChain:
    """Gas pricing, simulation and broadcast for executor transactions."""

    def __init__(self, node: ChainNode) -> None:
        self.node = node

    async def fee_market(self) -> FeeMarket:
        """The next block's base fee and the recent median tip (one ``eth_feeHistory``,
        cached per head).

        Raises:
            ChainUnavailable: the node failed.
        """

        async def load() -> FeeMarket:
            history = await self.node.answer(
                "eth_feeHistory", [hex(FEE_HISTORY_BLOCKS), "latest", [TIP_PERCENTILE]]
            )
            try:
                bases = [int(b, 16) for b in history["baseFeePerGas"]]
                tips = sorted(int(r[0], 16) for r in history.get("reward") or [] if r)
            except (KeyError, TypeError, ValueError):
                raise ChainUnavailable(detail="eth_feeHistory answered a malformed history") from None
            return FeeMarket(bases[-1] if bases else 0, tips[len(tips) // 2] if tips else 0)

        return await self.node.cached("fee_market", load)

    async def estimate_gas(
        self, sender: str, to: str, data: bytes, function: str | None = None, *, block: int | None = None
    ) -> int:
        """Simulate the call from ``sender`` at ``block`` (default: the node's own default,
        its latest block) and return its gas (one ``eth_estimateGas``).

        Raises:
            ChainRevert: the simulation reverted (custom error decoded; ``function`` named).
            ChainUnavailable: the node failed.
        """
        tx = {"from": sender, "to": to, "data": "0x" + data.hex()}
        params: list[Any] = [tx] if block is None else [tx, hex(block)]
        gas = await self.node.answer("eth_estimateGas", params, function)
        try:
            return int(str(gas), 16)
        except ValueError:
            raise ChainUnavailable(detail="eth_estimateGas answered no number") from None

    async def calls_succeed(
        self, sender: str, calls: Sequence[tuple[str, bytes, int, codec.FunctionAbi]]
    ) -> list[bool]:
        """Whether each call (to, data, gas limit, the function it calls) from ``sender``
        succeeds at the latest block within its gas limit and returns what the function
        returns: one execution each (``eth_call``), all in one JSON-RPC batch. False is any
        other answer (a revert, out of gas, the node's error, an empty result where there
        is no code): the caller finds out which by :meth:`estimate_gas`.

        Raises:
            ChainUnavailable: the batch failed as a whole.
        """
        answers = await self.node.batch(
            [
                ("eth_call", [{"from": sender, "to": to, "data": "0x" + data.hex(), "gas": hex(g)}, "latest"])
                for to, data, g, _f in calls
            ]
        )
        return [_returns(answer, f) for answer, (_t, _d, _g, f) in zip(answers, calls, strict=True)]

    async def is_executor(self, account: str) -> bool:
        """Whether the settlement accepts ``account`` as an executor (``isExecutor``).

        Raises:
            ChainUnavailable: the node failed.
        """
        (accepted,) = await self.node.call(self.node.contracts.settlement, _IS_EXECUTOR, account)
        return bool(accepted)

    async def pending_nonce(self, account: str) -> int:
        """The next nonce the node would accept from ``account`` (counting its mempool).

        Raises:
            ChainUnavailable: the node failed.
        """
        return int(str(await self.node.answer("eth_getTransactionCount", [account, "pending"])), 16)

    async def mined_nonce(self, account: str) -> int:
        """How many transactions of ``account`` are mined: its lowest nonce still free.

        Raises:
            ChainUnavailable: the node failed.
        """
        return int(str(await self.node.answer("eth_getTransactionCount", [account, "latest"])), 16)

    async def send_raw_many(self, raws: Sequence[bytes]) -> list[SendOutcome | ChainUnavailable]:
        """Broadcast signed bytes in JSON-RPC batches (one round trip per batch), in order.

        Returns:
            For each: SENT, the node's refusal (see :class:`SendOutcome`), or the failure
            (send the same bytes again later).

        Raises:
            ChainUnavailable: a batch failed as a whole (nothing known about its sends).
        """
        answers = await self.node.batch([("eth_sendRawTransaction", ["0x" + raw.hex()]) for raw in raws])
        outcomes: list[SendOutcome | ChainUnavailable] = []
        for answer in answers:
            if "error" not in answer:
                outcomes.append(SendOutcome.SENT)
                continue
            error = answer["error"]
            outcome = refusal(error)
            message = str(error.get("message", "") if isinstance(error, dict) else error)
            outcomes.append(outcome if outcome is not None else ChainUnavailable(detail=message[:200]))
        return outcomes


def _returns(answer: dict[str, Any], function: codec.FunctionAbi) -> bool:
    result = answer.get("result")
    if "error" in answer or not isinstance(result, str):
        return False
    try:
        function.decode(bytes.fromhex(result[2:]))
    except (ValueError, DecodingError):
        return False
    return True
