"""Token balances of many owners in one ``eth_call``: Multicall3's ``tryBlockAndAggregate``
at the latest block, which also answers the number of the block the balances were read at.
Concurrent readers within :data:`GATHER_S` share one call (at most :data:`MOST_PER_CALL`
balances each). On a chain without Multicall3 at its canonical address (a devnet; Base
preinstalls it) its code is placed there by the call's state override, so nothing is
deployed and nothing is sent."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Final

from eth_abi.exceptions import DecodingError
from eth_utils.crypto import keccak

from relayer.chain import codec
from relayer.chain.errors import ChainUnavailable
from relayer.chain.multicall3_code import RUNTIME_HEX
from relayer.chain.node import ChainNode

log = logging.getLogger(__name__)

MULTICALL3: Final = "0xcA11bde05977b3631167028862bE2a173976CA11"
GATHER_S: Final = 0.003
"""How long the first reader of a call waits for others to join it, seconds."""
MOST_PER_CALL: Final = 200
"""Most balances one call reads (a bounded call; the rest go in the next one)."""


def _function(name: str, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> codec.FunctionAbi:
    selector = keccak(text=f"{name}({','.join(inputs)})")[:4]
    return codec.FunctionAbi("Multicall3", name, selector, inputs, outputs)


_TRY_BLOCK_AND_AGGREGATE: Final = _function(
    "tryBlockAndAggregate", ("bool", "(address,bytes)[]"), ("uint256", "bytes32", "(bool,bytes)[]")
)
_BALANCE_OF: Final = codec.function("UsdcEip3009", "balanceOf")


@dataclass(frozen=True, slots=True)
class BalanceAt:
    """An owner's token balance (atomic units) and the number of the block it was read at."""

    amount: int
    block_number: int


class Balances:
    """Balances at the latest block, many owners a call (see the module's docstring)."""

    def __init__(self, node: ChainNode) -> None:
        self.node = node
        self._waiting: dict[tuple[str, str], asyncio.Future[BalanceAt]] = {}
        self._flush: asyncio.Task[None] | None = None
        self._override: dict[str, Any] | None = None
        self._looked = False

    async def latest(self, token: str, owner: str) -> BalanceAt:
        """``owner``'s balance of the ERC-20 ``token`` at the latest block now and that
        block's number, read with the other balances asked within :data:`GATHER_S` (one
        ``eth_call``; an owner asked twice meanwhile is read once).

        Raises:
            ChainUnavailable: the node failed, or the token answered no balance.
        """
        key = (token, owner)
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = asyncio.get_running_loop().create_future()
            self._waiting[key] = waiting
            if self._flush is None or self._flush.done():
                self._flush = asyncio.ensure_future(self._read_soon())
        return await asyncio.shield(waiting)

    async def _read_soon(self) -> None:
        await asyncio.sleep(GATHER_S)
        while self._waiting:  # bounded: each pass takes up to MOST_PER_CALL of them off
            keys = list(self._waiting)[:MOST_PER_CALL]
            futures = [self._waiting.pop(k) for k in keys]
            try:
                answers = await self._read(keys)
            except ChainUnavailable as exc:
                answers = [exc] * len(keys)
            except BaseException as exc:  # cancelled, or a bug: no reader waits for ever
                for f in futures:
                    if not f.done():
                        f.set_exception(ChainUnavailable(detail=f"balance read failed: {type(exc).__name__}"))
                raise
            for future, answer in zip(futures, answers, strict=True):
                if future.done():
                    continue
                if isinstance(answer, BaseException):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)

    async def _read(self, keys: list[tuple[str, str]]) -> list[BalanceAt | ChainUnavailable]:
        """One ``eth_call`` of Multicall3 at the latest block for ``keys`` (token, owner).

        Raises:
            ChainUnavailable: the call failed or its answer does not decode.
        """
        calls = [(token, _BALANCE_OF.encode(owner)) for token, owner in keys]
        data = "0x" + _TRY_BLOCK_AND_AGGREGATE.encode(False, calls).hex()
        params: list[Any] = [{"to": MULTICALL3, "data": data}, "latest"]
        override = await self._code_override()
        if override is not None:
            params.append(override)
        raw = await self.node.request("eth_call", params)
        try:
            block, _hash, results = _TRY_BLOCK_AND_AGGREGATE.decode(bytes.fromhex(str(raw)[2:]))
        except (ValueError, DecodingError):
            raise ChainUnavailable(detail="Multicall3 answered no balances") from None
        out: list[BalanceAt | ChainUnavailable] = []
        for success, returned in results:
            if success and len(returned) == 32:
                out.append(BalanceAt(int.from_bytes(returned, "big"), int(block)))
            else:
                out.append(ChainUnavailable(detail="balanceOf answered no balance"))
        return out

    async def _code_override(self) -> dict[str, Any] | None:
        """The state override that places Multicall3 at its address, when the chain has no
        code there (looked up once: ``eth_getCode``).

        Raises:
            ChainUnavailable: the node failed.
        """
        if not self._looked:
            code = await self.node.request("eth_getCode", [MULTICALL3, "latest"])
            if str(code) in ("0x", ""):
                log.info("no Multicall3 on this chain: its code goes in each balance read's state override")
                self._override = {MULTICALL3: {"code": "0x" + RUNTIME_HEX}}
            self._looked = True
        return self._override
