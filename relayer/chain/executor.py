"""The executor's side of the chain: the fee market (``eth_feeHistory``), simulation (many
calls in one batch prober ``eth_call``, one call by ``eth_estimateGas``), the lane's nonces
and broadcast of signed bytes. A node's refusal of a broadcast is an outcome
(:class:`SendOutcome`) with its own handling, not an error."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from eth_abi.exceptions import DecodingError

from relayer.chain import codec, prober
from relayer.chain.errors import ChainUnavailable, SendOutcome, refusal
from relayer.chain.node import ChainNode

log = logging.getLogger(__name__)

FEE_HISTORY_BLOCKS: Final = 20
"""Blocks whose tips the market tip is the median of (each block's median tip): a sender
must pay large tips in more than half of them to move it (five let a few set it)."""
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
        self._probing = True  # False once the node refused the batch prober's state override

    def fee_market_fresh(self) -> bool:
        """Whether :meth:`fee_market` is cached and current: awaiting it costs no round trip."""
        return self.node.fresh("fee_market")

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
        self,
        sender: str,
        calls: Sequence[tuple[str, bytes, int, codec.FunctionAbi]],
        block: int | None = None,
    ) -> list[bool]:
        """Whether each call (to, data, gas limit, the function it calls) from ``sender``
        succeeds at ``block`` (default: the latest) within its gas limit and returns what the function
        returns, as its own ``eth_call`` would say: all of them executed in one ``eth_call``
        of the batch prober (:mod:`relayer.chain.prober`, its code placed at ``sender`` by
        state override; more ``eth_call`` s, in the same JSON-RPC batch, when their gas
        passes :data:`~relayer.chain.prober.PROBER_GAS_MAX`), each with exactly the gas a
        transaction at its limit leaves it and none seeing another's state changes. A node
        that refuses the state override (an error that is no revert) is asked one
        ``eth_call`` each, in one JSON-RPC batch, from then on (remembered for the process);
        a prober call answered otherwise than with outcomes, and a call it could not run,
        are asked that way that time. False is any other answer (a revert, out of gas, the
        node's error, an empty result where there is no code): the caller finds out which
        by :meth:`estimate_gas`.

        Raises:
            ChainUnavailable: the batch failed as a whole.
        """
        verdicts: list[bool | None] = [None] * len(calls)
        if self._probing and calls:
            outcomes = await self._probed(sender, [(to, data, limit) for to, data, limit, _f in calls], block)
            for i, outcome in enumerate(outcomes):
                if outcome is prober.UNDER_INTRINSIC:
                    verdicts[i] = False  # no transaction runs it
                elif isinstance(outcome, prober.Outcome) and outcome.status is not prober.Status.NOT_RUN:
                    succeeded = outcome.status is prober.Status.SUCCEEDED
                    verdicts[i] = succeeded and _decodes(outcome.data, calls[i][3])
        rest = [i for i, verdict in enumerate(verdicts) if verdict is None]
        if rest:
            answers = await self.node.batch([_eth_call(sender, *calls[i][:3], block) for i in rest])
            for i, answer in zip(rest, answers, strict=True):
                verdicts[i] = _returns(answer, calls[i][3])
        return [bool(v) for v in verdicts]

    async def simulate_many(
        self, sender: str, calls: Sequence[tuple[str, bytes, codec.FunctionAbi]], gas_cap: int, block: int
    ) -> list[int | None]:
        """Each call (to, data, the function it calls) from ``sender`` simulated at ``block``
        as a transaction of at most ``gas_cap`` gas would run it, all in one ``eth_call`` of
        the batch prober (more in the same JSON-RPC batch past
        :data:`~relayer.chain.prober.PROBER_GAS_MAX`), none seeing another's state changes:
        for each, the gas limit it needs (:func:`~relayer.chain.prober.transaction_gas`
        from the gas its execution consumed), or None when this cannot tell (it reverted,
        ran out of gas within the cap, returned what the function does not return, was not
        run; the node refuses state overrides, remembered for the process): the caller
        asks :meth:`estimate_gas` for those, which names the revert.

        Raises:
            ChainUnavailable: the batch failed as a whole.
        """
        if not self._probing or not calls:
            return [None] * len(calls)
        outcomes = await self._probed(sender, [(to, data, gas_cap) for to, data, _f in calls], block)
        gas: list[int | None] = []
        for (_to, data, function), outcome in zip(calls, outcomes, strict=True):
            if (
                isinstance(outcome, prober.Outcome)
                and outcome.status is prober.Status.SUCCEEDED
                and _decodes(outcome.data, function)
            ):
                gas.append(prober.transaction_gas(data, outcome.gas_used))
            else:
                gas.append(None)
        return gas

    async def _probed(
        self, sender: str, calls: Sequence[tuple[str, bytes, int]], block: int | None
    ) -> list[prober.Outcome | prober.Unknown | None]:
        """The batch prober's outcome of each call (to, data, gas limit) from ``sender`` at
        ``block`` (None: the latest): :data:`~relayer.chain.prober.UNDER_INTRINSIC` for a
        limit under the call's intrinsic gas (no transaction runs it), None when not known
        (its ``eth_call`` failed or answered no outcomes, or a call past the prober's gas
        bound on its own). A node that refuses the state override turns the batch prober
        off for the process (``_probing``), with one warning.

        Raises:
            ChainUnavailable: the batch failed as a whole.
        """
        outcomes: list[prober.Outcome | prober.Unknown | None] = [None] * len(calls)
        probes: list[tuple[str, bytes, int]] = []
        probed: list[int] = []  # the index in calls of each probe
        for i, (to, data, limit) in enumerate(calls):
            gas = prober.execution_gas(data, limit)
            if gas is None:
                outcomes[i] = prober.UNDER_INTRINSIC
            else:
                probes.append((to, data, gas))
                probed.append(i)
        runs = prober.prober_calls(probes)  # a probe too big for one eth_call: not run here
        answers = await self.node.batch(
            [("eth_call", prober.call_params(sender, run, block)) for run in runs]
        )
        refused: str | None = None
        for run, answer in zip(runs, answers, strict=True):
            error = answer.get("error")
            if error is not None:
                message = str(error.get("message", "") if isinstance(error, dict) else error)
                if not _is_revert(error) and "gas" not in message.lower():
                    refused = message[:200]
                continue
            try:
                decoded = prober.decode(str(answer.get("result")), len(run.indexes))
            except ValueError as exc:  # "0x": the node ignored the override
                refused = str(exc)
                continue
            for j, outcome in zip(run.indexes, decoded, strict=True):
                outcomes[probed[j]] = outcome
        if refused is not None and self._probing:
            self._probing = False
            log.warning(
                "the node refuses eth_call state overrides: pre-signing checks take one eth_call each",
                extra={"error": refused},
            )
        return outcomes

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


def _eth_call(sender: str, to: str, data: bytes, gas: int, block: int | None = None) -> tuple[str, list[Any]]:
    tag = "latest" if block is None else hex(block)
    return "eth_call", [{"from": sender, "to": to, "data": "0x" + data.hex(), "gas": hex(gas)}, tag]


def _returns(answer: dict[str, Any], function: codec.FunctionAbi) -> bool:
    result = answer.get("result")
    if "error" in answer or not isinstance(result, str):
        return False
    return _decodes(bytes.fromhex(result[2:]), function)


def _decodes(data: bytes, function: codec.FunctionAbi) -> bool:
    """Whether ``data`` is what ``function`` returns."""
    try:
        function.decode(data)
    except (ValueError, DecodingError):
        return False
    return True


def _is_revert(error: Any) -> bool:
    """Whether a JSON-RPC ``error`` member is an execution's revert (revert data, or a
    message saying so), not the node refusing the request."""
    if not isinstance(error, dict):
        return False
    data = error.get("data")
    return (isinstance(data, str) and data.startswith("0x")) or "revert" in str(
        error.get("message", "")
    ).lower()
