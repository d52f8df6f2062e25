"""View calls of many readers in one ``eth_call`` (:class:`Views`): Multicall3's
``tryBlockAndAggregate`` at a block, which also answers the number of the block the views
were read at (the payers' balances, the listings, the classes, the per-head reads).
Concurrent readers within :data:`GATHER_S` share one call (at most :data:`MOST_PER_CALL`
views each). On a chain without Multicall3 at its canonical address (a devnet; Base
preinstalls it) its code is placed there by the call's state override, so nothing is
deployed and nothing is sent."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from eth_abi.exceptions import DecodingError
from eth_utils.crypto import keccak

from relayer.chain import codec
from relayer.chain.abi_reader import AbiReader
from relayer.chain.errors import ChainRevert, ChainUnavailable
from relayer.chain.multicall3_code import RUNTIME_HEX
from relayer.domain.abi_words import bool_word, tuple_array, uint_word

if TYPE_CHECKING:
    from relayer.chain.node import ChainNode

log = logging.getLogger(__name__)

MULTICALL3: Final = "0xcA11bde05977b3631167028862bE2a173976CA11"
GATHER_S: Final = 0.003
"""How long the first reader of a call waits for others to join it, seconds."""
MOST_PER_CALL: Final = 200
"""Most views one call reads (a bounded call; the rest go in the next one)."""


def _function(name: str, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> codec.FunctionAbi:
    selector = keccak(text=f"{name}({','.join(inputs)})")[:4]
    return codec.FunctionAbi("Multicall3", name, selector, inputs, outputs)


_TRY_BLOCK_AND_AGGREGATE: Final = _function(
    "tryBlockAndAggregate", ("bool", "(address,bytes)[]"), ("uint256", "bytes32", "(bool,bytes)[]")
)
_BALANCE_OF: Final = codec.function("UsdcEip3009", "balanceOf")


_TRY_AGGREGATE_AT: Final = _TRY_BLOCK_AND_AGGREGATE


def encode_try_block_and_aggregate(require_success: bool, calls: Sequence[tuple[str, bytes]]) -> bytes:
    """The call data of ``tryBlockAndAggregate(require_success, calls)`` ((target, call data)
    each): what eth_abi encodes, word by word (:mod:`relayer.domain.abi_words`).

    Raises:
        ValueError: a target is not an address.
    """
    head = bool_word(require_success) + uint_word(64)
    return _TRY_AGGREGATE_AT.selector + head + tuple_array(calls, ("address", "bytes"))


def decode_try_block_and_aggregate(answer: bytes) -> tuple[int, bytes, list[tuple[bool, bytes]]]:
    """(block number, block hash, (success, returned data) of each call) of
    ``tryBlockAndAggregate``'s ``answer``: what eth_abi decodes, read word by word
    (:class:`~relayer.chain.abi_reader.AbiReader`).

    Raises:
        DecodingError: the answer is not that.
    """
    r = AbiReader(answer)
    count, heads = r.array(r.offset(0, 64, 96))
    results: list[tuple[bool, bytes]] = []
    for i in range(count):
        at = r.offset(heads, heads + 32 * i, 32 * count)
        results.append((r.boolean(at), r.dynamic_bytes(r.offset(at, at + 32, 64))))
    return r.uint(0), r.word(32), results


WORKING_SET_MAX: Final = 64
"""Most per-head reads a new head's first call reads ahead (see :class:`Views`)."""
WORKING_SET_KEEP_S: Final = 5.0
"""How long a per-head read stays in the working set after its last use, seconds."""

ViewCall = tuple[str, codec.FunctionAbi, tuple[Any, ...]]
"""(contract address, function, arguments) of a view call."""


class Views:
    """View calls of the protocol's contracts (``eth_call`` without a sender) shared in one
    Multicall3 ``tryBlockAndAggregate`` per block: the calls asked within :data:`GATHER_S` at
    the same block tag (the latest block, or a numbered one) go in one ``eth_call``, at most
    :data:`MOST_PER_CALL` a call; a call that reverts is that caller's :class:`ChainRevert`,
    never the others'. Callers that read mutable state per head (:meth:`ChainNode.cached_view`)
    name their read: the first call at the latest block after a new head also reads every
    named read of the last :data:`WORKING_SET_KEEP_S` seconds not yet cached at that head (the
    fees, reserves, classes, price feed and oracle reads the jobs of a block share), so a
    block's per-head reads cost one ``eth_call`` between them."""

    def __init__(self, node: ChainNode) -> None:
        self.node = node
        self._override: dict[str, Any] | None = None
        self._looked = False
        self._waiting: dict[
            int | None, list[tuple[ViewCall, asyncio.Future[tuple[tuple[Any, ...], int]]]]
        ] = {}
        self._flushes: dict[int | None, asyncio.Future[None]] = {}
        self._running: set[asyncio.Future[None]] = set()
        self._working: dict[str, tuple[ViewCall, float]] = {}
        self.calls = 0  # eth_calls sent (for tests and metrics)

    async def code_override(self) -> dict[str, Any] | None:
        """The state override that places Multicall3 at its address, when the chain has no
        code there (looked up once: ``eth_getCode``).

        Raises:
            ChainUnavailable: the node failed.
        """
        if not self._looked:
            code = await self.node.request("eth_getCode", [MULTICALL3, "latest"])
            if str(code) in ("0x", ""):
                log.info(
                    "no Multicall3 on this chain: its code goes in each Multicall3 call's state override"
                )
                self._override = {MULTICALL3: {"code": "0x" + RUNTIME_HEX}}
            self._looked = True
        return self._override

    def remember(self, key: str, call: ViewCall) -> None:
        """Name a per-head read (cache ``key``) for the next heads' read-ahead."""
        self._working.pop(key, None)
        self._working[key] = (call, time.monotonic())
        while len(self._working) > WORKING_SET_MAX:
            self._working.pop(next(iter(self._working)))

    def read_ahead_now(self) -> None:
        """A new head: read the working set ahead at once (one flush at the latest block, as
        the head's first call would), so the requests that come after the block find its
        per-head reads cached or on their way. Nothing when the working set is empty (a daemon
        without work for :data:`WORKING_SET_KEEP_S` reads nothing ahead) or a flush at the
        latest block is already due, or outside a running event loop."""
        if not self._working or None in self._flushes:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._flush_soon(None))
        except RuntimeError:
            return
        self._flushes[None] = task
        self._running.add(task)
        task.add_done_callback(self._retrieved)

    def _retrieved(self, task: asyncio.Future[None]) -> None:
        """A read-ahead flush ended: its failure was its readers' (every read answered)."""
        self._running.discard(task)
        if not task.cancelled():
            task.exception()

    async def call(
        self, to: str, function: codec.FunctionAbi, *args: Any, block: int | None = None
    ) -> tuple[Any, ...]:
        """``function(*args)`` on ``to`` at ``block`` (default: the latest block), shared as
        the class says; its decoded outputs.

        Raises:
            ChainRevert: this call reverted (custom error decoded).
            ChainUnavailable: the node failed, or the answer does not decode.
        """
        outputs, _block = await self.call_at(to, function, *args, block=block)
        return outputs

    async def call_at(
        self, to: str, function: codec.FunctionAbi, *args: Any, block: int | None = None
    ) -> tuple[tuple[Any, ...], int]:
        """As :meth:`call`, with the number of the block it was read at."""
        future: asyncio.Future[tuple[tuple[Any, ...], int]] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(block, []).append(((to, function, args), future))
        if block not in self._flushes:
            task = asyncio.ensure_future(self._flush_soon(block))
            self._flushes[block] = task
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return await asyncio.shield(future)

    async def _flush_soon(self, block: int | None) -> None:
        """After :data:`GATHER_S`, send what was asked at ``block`` meanwhile (and, at the
        latest block, the read-ahead), :data:`MOST_PER_CALL` a call, the calls concurrently;
        what is asked while they are under way gathers for the next flush (a slow call
        holds up only its own readers)."""
        try:
            await asyncio.sleep(GATHER_S)
        finally:
            self._flushes.pop(block, None)
        pending = self._waiting.pop(block, []) + (self._read_ahead() if block is None else [])
        chunks = [pending[i : i + MOST_PER_CALL] for i in range(0, len(pending), MOST_PER_CALL)]
        await asyncio.gather(*(self._answer(chunk, block) for chunk in chunks))

    async def _answer(
        self, batch: list[tuple[ViewCall, asyncio.Future[tuple[tuple[Any, ...], int]]]], block: int | None
    ) -> None:
        """One aggregate call for ``batch``; each future answered with its call's outcome."""
        try:
            answers = await self._aggregate([c for c, _ in batch], block)
        except BaseException as exc:
            failure = (
                exc
                if isinstance(exc, ChainUnavailable)
                else ChainUnavailable(detail=f"view call failed: {type(exc).__name__}")
            )
            for _c, f in batch:
                if not f.done():
                    f.set_exception(failure)
                    f.exception()  # retrieved: a read-ahead nobody awaits is not an error
            if not isinstance(exc, ChainUnavailable):
                raise  # a bug, or cancelled: its readers were answered unavailable
            return
        for (_c, future), answer in zip(batch, answers, strict=True):
            if future.done():
                continue
            if isinstance(answer, BaseException):
                future.set_exception(answer)
                future.exception()
            else:
                future.set_result(answer)

    def _read_ahead(self) -> list[tuple[ViewCall, asyncio.Future[tuple[tuple[Any, ...], int]]]]:
        """The working set's reads not cached at the node's head, each now in the node's
        cache under its key (its future answered by this flush's call)."""
        now = time.monotonic()
        out: list[tuple[ViewCall, asyncio.Future[tuple[tuple[Any, ...], int]]]] = []
        for key, (call, used) in list(self._working.items()):
            if now - used > WORKING_SET_KEEP_S:
                del self._working[key]
            elif not self.node.loading_or_fresh(key):
                answer: asyncio.Future[tuple[tuple[Any, ...], int]] = (
                    asyncio.get_running_loop().create_future()
                )
                self.node.prime(key, answer)
                out.append((call, answer))
        return out

    async def _aggregate(
        self, calls: list[ViewCall], block: int | None
    ) -> list[tuple[tuple[Any, ...], int] | BaseException]:
        """One ``eth_call`` of Multicall3's ``tryBlockAndAggregate`` for ``calls`` at ``block``.

        Raises:
            ChainUnavailable: the call failed or its answer does not decode.
        """
        encoded = [(to, function.encode(*args)) for to, function, args in calls]
        data = "0x" + encode_try_block_and_aggregate(False, encoded).hex()
        params: list[Any] = [{"to": MULTICALL3, "data": data}, "latest" if block is None else hex(block)]
        override = await self.code_override()
        if override is not None:
            params.append(override)
        self.calls += 1
        raw = await self.node.request("eth_call", params)
        try:
            number, _hash, results = decode_try_block_and_aggregate(bytes.fromhex(str(raw)[2:]))
        except (ValueError, DecodingError):
            raise ChainUnavailable(detail="Multicall3 answered no results") from None
        out: list[tuple[tuple[Any, ...], int] | BaseException] = []
        for (_to, function, _args), (success, returned) in zip(calls, results, strict=True):
            if not success:
                out.append(ChainRevert(bytes(returned) or None, function.name, "execution reverted"))
                continue
            try:
                out.append((function.decode(bytes(returned)), int(number)))
            except DecodingError as exc:  # no code there (a lagging node, the wrong chain)
                out.append(ChainUnavailable(detail=f"{type(exc).__name__} decoding {function.name}"))
        return out
