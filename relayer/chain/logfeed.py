"""The logs of one chain node, read once per block range for every reader of them (the chain
follower's ``RetirementSettled``, the catalogue indexer's listing, credit and transfer
events): each reader says which (contract address, event topic) pairs it reads
(:meth:`LogFeed.want`); a range is read with one ``eth_getLogs`` over the union of every
reader's pairs, and the answer is kept for :data:`KEEP_S` seconds (at most :data:`KEEP_RANGES`
ranges) under the range and the hash of its last block, so the other readers of the same range
on the same chain take it from there and pick their own entries out (:func:`pick`). A reader
that does not give that hash reads on its own."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from relayer.chain.single_flight import shared as shared_read

if TYPE_CHECKING:
    from relayer.chain.node import ChainNode

KEEP_S: Final = 2.0
"""How long a range's logs stay for the other readers, seconds."""
KEEP_RANGES: Final = 4
"""Most ranges whose logs are kept at once (the oldest dropped first): the readers of one chain
read the same newest range, and a catching-up range may hold many logs."""

Pairs = frozenset[tuple[str, str]]
"""(lower-case contract address, ``0x`` topic 0) pairs a reader reads."""


def pick(entries: list[Any], pairs: Pairs) -> list[Any]:
    """The entries of ``entries`` (``eth_getLogs`` JSON) that a reader of ``pairs`` reads, in
    order. Raises ``KeyError``, ``TypeError`` or ``AttributeError`` on a malformed entry (the
    caller's parser makes that the node's failure)."""
    out = []
    for entry in entries:
        topics = entry["topics"]
        topic = str(topics[0]).lower() if topics else ""
        if (str(entry["address"]).lower(), topic) in pairs:
            out.append(entry)
    return out


class LogFeed:
    """The shared ``eth_getLogs`` of one node (see the module's docstring)."""

    def __init__(self, node: ChainNode) -> None:
        self.node = node
        self._wanted: dict[str, set[str]] = {}  # address -> topics, every reader's
        # (from, to, to_hash) -> when the read started, and the read: what it was read for, entries
        self._kept: OrderedDict[tuple[int, int, bytes], tuple[float, asyncio.Future[tuple[Pairs, list[Any]]]]]
        self._kept = OrderedDict()

    def want(self, addresses: Iterable[str], topics: Iterable[bytes]) -> Pairs:
        """Add what a reader reads (every pair of ``addresses`` and ``topics``) to what each
        range is read for; the pairs, for :meth:`read`."""
        pairs = frozenset((a.lower(), "0x" + t.hex()) for a in addresses for t in topics)
        for address, topic in pairs:
            self._wanted.setdefault(address, set()).add(topic)
        return pairs

    async def read(self, pairs: Pairs, from_block: int, to_block: int, to_hash: bytes | None) -> list[Any]:
        """The log entries (JSON, as the node sent them) of blocks ``from_block`` through
        ``to_block`` that the pairs of every reader match: a superset of ``pairs``'s (pick
        them out with :func:`pick`). With ``to_hash`` (the hash of ``to_block`` on the chain
        the reader follows), one read serves every reader of that range at that hash within
        :data:`KEEP_S` (one ``eth_getLogs``); without it, one ``eth_getLogs`` of its own.

        Raises:
            ChainUnavailable: the node failed.
        """
        if to_hash is None:
            return (await self._load(self._pairs(), from_block, to_block))[1]
        read_for, entries = await self._shared((from_block, to_block, to_hash))
        if pairs <= read_for:
            return entries
        # read before this reader said what it reads: once, on its own
        return (await self._load(self._pairs(), from_block, to_block))[1]

    async def _shared(self, key: tuple[int, int, bytes]) -> tuple[Pairs, list[Any]]:
        """The read of range ``key`` kept (single-flight; a failed read is not kept)."""
        now = time.monotonic()
        for old in [k for k, (started, _) in self._kept.items() if now - started >= KEEP_S]:
            del self._kept[old]
        hit = self._kept.get(key)
        if hit is not None:
            return await asyncio.shield(hit[1])
        read = asyncio.ensure_future(self._load(self._pairs(), key[0], key[1]))
        self._kept[key] = (now, read)
        while len(self._kept) > KEEP_RANGES:
            self._kept.popitem(last=False)
        return await shared_read(self._kept, key, read, 1)

    def _pairs(self) -> Pairs:
        return frozenset((a, t) for a, topics in self._wanted.items() for t in topics)

    async def _load(self, pairs: Pairs, from_block: int, to_block: int) -> tuple[Pairs, list[Any]]:
        addresses = sorted({a for a, _ in pairs})
        topics = sorted({t for _, t in pairs})
        query = {
            "address": addresses,
            "fromBlock": hex(from_block),
            "toBlock": hex(to_block),
            "topics": [topics],
        }
        entries = await self.node.request("eth_getLogs", [query])
        return pairs, list(entries)
