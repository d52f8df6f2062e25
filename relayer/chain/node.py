"""One chain node: the AsyncWeb3 session over the keep-alive transport, the deployment's
contracts, ``eth_call`` with the ABI codec, and a single-flight read cache that a new head
clears. The catalogue, executor and follower views share one node.

Policy: mutable reads are cached per head (and for at most ``read_ttl_s`` seconds);
constant facts are read once; every failure is translated by :mod:`relayer.chain.errors`.
The head itself is read at most once per ``head_every_s`` (the poll cadence) for the whole
process (:meth:`ChainNode.recent`, shared by every reader of this node: the follower, the
indexers, the gauges, the accept path's cached head); reads whose meaning allows a few
seconds' age across heads (the executor's balance floor) are kept by time, and the indexers'
logs of a block range are read once for all of them (:class:`~relayer.chain.logfeed.LogFeed`).
Every cache is bounded.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar, cast

from eth_abi.exceptions import DecodingError
from eth_typing import BlockNumber, ChecksumAddress
from web3 import AsyncWeb3
from web3.types import RPCEndpoint

from relayer.chain.codec import FunctionAbi
from relayer.chain.errors import ChainRevert, ChainUnavailable, rpc
from relayer.chain.logfeed import LogFeed
from relayer.chain.multicall import Views
from relayer.chain.single_flight import shared as shared_read
from relayer.chain.transport import BatchRefused, KeepAliveHTTPProvider
from relayer.chain.types import Contracts
from relayer.config import ConfigError

T = TypeVar("T")
_REVERT_DATA: Final = re.compile(r"0x(?:[0-9a-fA-F]{2})+")
BATCH_MAX: Final = 64
"""Most calls in one JSON-RPC batch (providers cap batches; a bounded body either way)."""
RECENT_KEYS: Final = 64
"""Most reads :meth:`ChainNode.recent` keeps (the oldest goes first)."""


def address(value: str) -> ChecksumAddress:
    """``value`` typed as web3 wants it; callers pass checksummed addresses."""
    return cast(ChecksumAddress, value)


class WrongChain(ConfigError):
    """The node serves chain ``served``, not the configured ``expected``."""

    def __init__(self, served: int, expected: int) -> None:
        super().__init__(message=f"the chain node serves chain {served}, not the configured chain {expected}")
        self.served = served
        self.expected = expected


class ChainNode:
    """Async access to the reference protocol on one chain.

    Args:
        rpc_url: the node's HTTP JSON-RPC URL.
        chain_id: the chain it must serve (8453 or 84532).
        contracts: the deployment's contract addresses.
        timeout_s: limit per JSON-RPC request, seconds.
        read_ttl_s: longest a cached read of mutable state is reused, seconds.
        head_every_s: how long one read of the head serves every reader of this node
            (the process's poll cadence, seconds; 0: only readers asking while it is under
            way share it).
    """

    def __init__(
        self,
        rpc_url: str,
        chain_id: int,
        contracts: Contracts,
        timeout_s: float = 10.0,
        read_ttl_s: float = 1.0,
        head_every_s: float = 0.0,
    ) -> None:
        self.chain_id = chain_id
        self.contracts = contracts
        # No default middleware: the validation middleware asks eth_chainId on every call,
        # and the chain id is checked once in check() instead.
        self.rpc_url = rpc_url
        self.w3 = AsyncWeb3(KeepAliveHTTPProvider(rpc_url, timeout_s), middleware=[])
        self.read_ttl_s = read_ttl_s
        self.head_every_s = head_every_s
        self._head: int | None = None
        self._head_at = float("-inf")  # monotonic time a head read last answered
        self._reads: dict[str, tuple[int | None, float, asyncio.Future[Any]]] = {}
        self._recent: OrderedDict[str, tuple[float, asyncio.Future[Any]]] = OrderedDict()
        self.views = Views(self)
        self.logs = LogFeed(self)

    async def check(self) -> bytes:
        """Verify the node answers and serves the configured chain id; returns the chain's
        genesis block hash (its identity across resets).

        Raises:
            ChainUnavailable: it does not answer.
            WrongChain: it serves another chain (a ConfigError).
        """
        got = await rpc(self.w3.eth.chain_id)
        if int(got) != self.chain_id:
            raise WrongChain(int(got), self.chain_id)
        genesis = await rpc(self.w3.eth.get_block(BlockNumber(0)))
        return bytes(genesis["hash"])

    async def close(self) -> None:
        await self.w3.provider.disconnect()

    async def call(
        self, to: str, function: FunctionAbi, *args: Any, block: int | None = None
    ) -> tuple[Any, ...]:
        """``eth_call`` of ``function`` on ``to`` at ``block`` (default: the latest block);
        its decoded outputs.

        Raises:
            ChainRevert: the call reverted (custom error decoded).
            ChainUnavailable: the node failed.
        """
        data = "0x" + function.encode(*args).hex()
        at = "latest" if block is None else hex(block)
        raw = await self.answer("eth_call", [{"to": to, "data": data}, at], function.name)
        try:
            return function.decode(bytes.fromhex(str(raw)[2:]))
        except (DecodingError, ValueError) as exc:  # "0x" from a lagging node or the wrong chain
            raise ChainUnavailable(detail=f"{type(exc).__name__} decoding {function.name}") from None

    async def answer(self, method: str, params: list[Any], function: str | None = None) -> Any:
        """One JSON-RPC call straight over the transport (no web3 formatters), its ``result``
        as the node sent it; an error that is a revert (revert data, or a message saying so)
        is the revert of ``function``.

        Raises:
            ChainRevert: the call reverted (custom error decoded).
            ChainUnavailable: the node failed, answered another error or no result.
        """
        provider = self.w3.provider
        assert isinstance(provider, KeepAliveHTTPProvider)
        reply = await rpc(provider.make_request(RPCEndpoint(method), params))
        error = reply.get("error")
        if error is not None:
            raise _error(error, method, function)
        if reply.get("result") is None:
            raise ChainUnavailable(detail=f"{method} answered null")
        return reply["result"]

    async def request(self, method: str, params: list[Any]) -> Any:
        """One JSON-RPC call, its ``result`` as the node sent it (JSON: hex strings, lists,
        objects), past web3's formatters: for the hot reads that parse only the fields they
        use (the follower's blocks, receipts and logs).

        Raises:
            ChainUnavailable: the node failed, answered an error or no result.
        """
        provider = self.w3.provider
        assert isinstance(provider, KeepAliveHTTPProvider)
        answer = await rpc(provider.make_request(RPCEndpoint(method), params))
        if "error" in answer or answer.get("result") is None:
            raise ChainUnavailable(detail=f"{method} answered {'an error' if 'error' in answer else 'null'}")
        return answer["result"]

    async def batch(self, calls: Sequence[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
        """``calls`` (method, params) as JSON-RPC batches of at most :data:`BATCH_MAX`
        (one round trip each); each call's response (``result`` or ``error``), in order. A
        node that refuses batches gets the calls one by one, in order. When a later batch
        fails, the earlier ones' responses stand and each call of the failed ones gets an
        ``error`` response.

        Raises:
            ChainUnavailable: the first batch failed as a whole (transport, malformed
                answer): nothing is known of any call.
        """
        provider = self.w3.provider
        assert isinstance(provider, KeepAliveHTTPProvider)
        answers: list[dict[str, Any]] = []
        for start in range(0, len(calls), BATCH_MAX):
            chunk = calls[start : start + BATCH_MAX]
            try:
                answers += await rpc(_batch_or_one_by_one(provider, chunk))
            except ChainUnavailable as exc:
                if not answers:
                    raise
                failed = {"code": -32603, "message": f"batch failed: {exc.detail}"}
                answers += [{"error": failed} for _ in calls[len(answers) :]]
                break
        return answers

    async def head(self) -> int:
        """The latest block number within ``read_ttl_s`` of the chain's: the head a read of
        this process last observed (the follower's, an indexer's) when that was within
        ``read_ttl_s``, at no cost; else one ``eth_blockNumber`` (single-flight), observed.

        Raises:
            ChainUnavailable: the node failed.
        """
        if self.head_fresh():
            assert self._head is not None
            return self._head

        return await self.cached("head", self.latest_head)

    async def latest_head(self) -> int:
        """The latest block number now, past every cache (one ``eth_blockNumber``), observed
        (:meth:`observe_read_head`): the reads cached at an older head are not served under it.

        Raises:
            ChainUnavailable: the node failed.
        """
        asked = time.monotonic()
        number = int(str(await self.answer("eth_blockNumber", [])), 16)
        self.observe_read_head(number, asked)
        return number

    def observe_read_head(self, number: int, asked: float) -> None:
        """A head read asked at ``asked`` (monotonic seconds) answered ``number``: observed
        (:meth:`observe_head`) when it is newer than the head known, or when no read asked
        later answered meanwhile; so an older read that answers late never rolls the head
        back, and the cached reads are never served under a head older than one read."""
        if self._head is None or number > self._head or self._head_at < asked:
            self.observe_head(number)

    @property
    def last_head(self) -> int | None:
        """The head a read of this process last observed, however long ago (no round trip;
        None before the first)."""
        return self._head

    def head_fresh(self) -> bool:
        """Whether :meth:`head` answers now without a round trip."""
        return (self._head is not None and time.monotonic() - self._head_at < self.read_ttl_s) or self.fresh(
            "head"
        )

    def observe_head(self, number: int) -> None:
        """A head read answered ``number``: a new head drops every cached read of mutable
        state, and reads the working set's per-head reads ahead (:meth:`Views.read_ahead_now`)."""
        self._head_at = time.monotonic()
        if number != self._head:
            self._head = number
            self._reads.clear()
            self.views.read_ahead_now()  # the working set's per-head reads, at once

    async def recent(self, key: str, load: Callable[[], Awaitable[T]], max_age_s: float) -> T:
        """Single-flight read kept by time, whatever the head: callers within ``max_age_s``
        of the start of the last load of ``key`` (or while it is under way) share it; a
        failed load is not kept. For reads whose meaning allows that age (the head within the
        poll cadence, the executor's balance floor). At most :data:`RECENT_KEYS` keys are
        kept, the oldest dropped first."""
        now = time.monotonic()
        hit = self._recent.get(key)
        if hit is not None:
            shared: asyncio.Future[T] = hit[1]
            if not shared.done():
                return await asyncio.shield(shared)
            if now - hit[0] < max_age_s and not shared.cancelled() and shared.exception() is None:
                return shared.result()
        task: asyncio.Future[T] = asyncio.ensure_future(load())
        self._recent[key] = (now, task)
        self._recent.move_to_end(key)
        while len(self._recent) > RECENT_KEYS:
            self._recent.popitem(last=False)
        return await shared_read(self._recent, key, task, 1)

    def recent_result(self, key: str, max_age_s: float) -> Any | None:
        """What :meth:`recent` holds under ``key``, when loaded within ``max_age_s`` and not a
        failure; else None (no round trip either way)."""
        hit = self._recent.get(key)
        if hit is None or time.monotonic() - hit[0] >= max_age_s:
            return None
        future = hit[1]
        if not future.done() or future.cancelled() or future.exception() is not None:
            return None
        return future.result()

    def fresh(self, *keys: str) -> bool:
        """Whether every read cached under ``keys`` is loaded and current: awaiting them
        now costs no round trip and never waits, so callers may await them one after the
        other instead of paying a task each for ``asyncio.gather``."""
        now = time.monotonic()
        for key in keys:
            hit = self._reads.get(key)
            if hit is None or hit[0] != self._head or now - hit[1] >= self.read_ttl_s:
                return False
            future = hit[2]
            if not future.done() or future.cancelled() or future.exception() is not None:
                return False
        return True

    def loading_or_fresh(self, key: str) -> bool:
        """Whether a read cached under ``key`` is current or being loaded (not failed)."""
        hit = self._reads.get(key)
        if hit is None or hit[0] != self._head or time.monotonic() - hit[1] >= self.read_ttl_s:
            return False
        future = hit[2]
        return not future.done() or (not future.cancelled() and future.exception() is None)

    def prime(self, key: str, future: asyncio.Future[Any]) -> None:
        """Cache ``future`` (answered by a read already under way) under ``key`` at the head."""
        self._reads[key] = (self._head, time.monotonic(), future)

    async def cached_view(
        self, key: str, to: str, function: FunctionAbi, *args: Any, read_ahead: bool = True
    ) -> tuple[tuple[Any, ...], int]:
        """The decoded outputs of ``function(*args)`` on ``to`` at the latest block and that
        block's number, cached
        per head under ``key`` (as :meth:`cached`) and read with the block's other per-head
        reads in one Multicall3 ``eth_call`` (:class:`~relayer.chain.multicall.Views`).
        ``read_ahead`` False: a read whose key is seldom asked again (one per job's gas
        limit, say) stays out of the next heads' read-ahead, which would read it again at
        every head for nothing.

        Raises:
            ChainRevert: the call reverted.
            ChainUnavailable: the node failed.
        """
        if read_ahead:
            self.views.remember(key, (to, function, args))

        async def load() -> tuple[tuple[Any, ...], int]:
            return await self.views.call_at(to, function, *args)

        return await self.cached(key, load)

    async def cached(self, key: str, load: Callable[[], Awaitable[T]]) -> T:
        """Single-flight read cache: concurrent callers share one load per head and TTL; a
        failed load is not cached."""
        now = time.monotonic()
        hit = self._reads.get(key)
        if hit is not None and hit[0] == self._head and now - hit[1] < self.read_ttl_s:
            shared: asyncio.Future[T] = hit[2]
            if not shared.done():
                return await asyncio.shield(shared)
            if not shared.cancelled() and shared.exception() is None:
                return shared.result()
        task: asyncio.Future[T] = asyncio.ensure_future(load())
        self._reads[key] = (self._head, now, task)
        return await shared_read(self._reads, key, task, 2)


def _error(error: Any, method: str, function: str | None) -> ChainRevert | ChainUnavailable:
    """What a JSON-RPC ``error`` member means: a revert (its data decoded) or the node failing."""
    message = str(error.get("message", "")) if isinstance(error, dict) else str(error)
    data = error.get("data") if isinstance(error, dict) else None
    if isinstance(data, str) and _REVERT_DATA.fullmatch(data):
        return ChainRevert(bytes.fromhex(data[2:]), function, message)
    if "revert" in message.lower():
        return ChainRevert(None, function, message)
    return ChainUnavailable(detail=f"{method} answered an error: {message[:120]}")


async def _batch_or_one_by_one(
    provider: KeepAliveHTTPProvider, calls: Sequence[tuple[str, list[Any]]]
) -> list[dict[str, Any]]:
    try:
        return await provider.batch(calls)
    except BatchRefused:
        return [dict(await provider.make_request(RPCEndpoint(m), p)) for m, p in calls]
