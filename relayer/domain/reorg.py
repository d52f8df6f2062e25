"""Reorgs as pure decisions: when a block counts as confirmed, the bounded memory of the
canonical chain a worker keeps (block number -> hash), the walk back from a changed chain
to the common ancestor, including what happens when no ancestor is left in memory, and which
reorgs are followed and which are incidents (:func:`reorg_incident`)."""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

KEEP_HASHES: Final = 256
"""Block hashes a worker keeps to find a common ancestor: a reorg deeper than this rewinds to
the edge of what is remembered."""


def confirmed_through(head: int, depth: int) -> int:
    """The newest block number buried under ``depth`` confirmations (the block itself counting
    as the first) when the chain's head is ``head``: ``head - depth + 1``. Depth 0 is depth 1
    (a block on the chain has its own confirmation; the block after the head has none).

    Raises:
        ValueError: ``depth`` is negative.
    """
    if depth < 0:
        raise ValueError("a confirmation depth is not negative")
    return head - max(depth, 1) + 1


def is_confirmed(block_number: int, head: int, depth: int) -> bool:
    """Whether block ``block_number`` has ``depth`` confirmations under head ``head``: the one
    definition of confirmed that the follower (jobs, retirements) and the catalogue indexer use.

    Raises:
        ValueError: ``depth`` is negative.
    """
    return block_number <= confirmed_through(head, depth)


class BlockMemory:
    """The newest ``limit`` blocks (number -> hash) a worker saw on the canonical chain; older
    numbers are forgotten first. Numbers need not be contiguous (a worker remembers only the
    blocks it read). It holds one chain: a remembered hash is never replaced by another (that
    is a reorg, for the worker to notice and undo, :meth:`forget_above`, first); otherwise a
    walk back would find a block of the new chain among the old and judge the reorg shallower
    than it is."""

    def __init__(self, limit: int = KEEP_HASHES) -> None:
        if limit < 1:
            raise ValueError("a block memory holds at least one block")
        self.limit = limit
        self._hashes: dict[int, bytes] = {}
        self._order: list[int] = []  # a min-heap of the numbers held (O(log n) to forget the oldest)
        self._newest: int | None = None

    def remember(self, number: int, block_hash: bytes) -> bool:
        """Hold ``block_hash`` as block ``number``'s (beyond ``limit`` blocks, the oldest go);
        False, and nothing changed, when another hash is remembered at ``number``."""
        known = self.agrees(number, block_hash)
        if known is False:
            return False
        if known is None:
            self._hashes[number] = block_hash
            heapq.heappush(self._order, number)
            self._newest = number if self._newest is None else max(self._newest, number)
            while len(self._hashes) > self.limit:
                del self._hashes[heapq.heappop(self._order)]
        return True

    def agrees(self, number: int, block_hash: bytes) -> bool | None:
        """Whether ``block_hash`` is the hash remembered at ``number`` (None: none is)."""
        remembered = self._hashes.get(number)
        return None if remembered is None else remembered == block_hash

    def forget_above(self, number: int) -> None:
        """Drop every block above ``number`` (they were rewound)."""
        self._hashes = {n: h for n, h in self._hashes.items() if n <= number}
        self._order = sorted(self._hashes)  # a sorted list is a heap
        self._newest = max(self._hashes, default=None)

    def get(self, number: int) -> bytes | None:
        return self._hashes.get(number)

    def newest(self) -> int | None:
        return self._newest

    def oldest(self) -> int | None:
        return min(self._hashes, default=None)

    def newest_below(self, number: int) -> int | None:
        """The newest remembered block under ``number``, if any (the few blocks just under it
        are looked up first: the usual answer, without a pass over the memory)."""
        for near in range(number - 1, number - 9, -1):
            if near in self._hashes:
                return near
        return max((n for n in self._hashes if n < number - 8), default=None)

    def as_mapping(self) -> Mapping[int, bytes]:
        return dict(self._hashes)

    def __len__(self) -> int:
        return len(self._hashes)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._hashes))


def head_reorged(memory: BlockMemory, number: int, block_hash: bytes, parent_hash: bytes) -> bool | None:
    """Whether a head (``number``, its hash and parent hash) is on another chain than the one
    remembered: True when remembered blocks lie above it or it or its parent differs from what
    is remembered at that height (both are checked: a head whose own height agrees but whose
    parent does not links two chains), False when they match there; None when the head alone
    cannot tell (compare the node's hash of ``memory.newest_below(number)`` with the memory's,
    when there is such a block; with none, nothing remembered can have been lost)."""
    newest = memory.newest()
    if newest is not None and number < newest:
        return True  # blocks above the head are gone
    verdicts = {memory.agrees(number, block_hash), memory.agrees(number - 1, parent_hash)} - {None}
    return None if not verdicts else False in verdicts


@dataclass(frozen=True, slots=True)
class Ancestor:
    """Where a walk back ends: the index keeps blocks up to ``number`` and undoes those above.

    ``block_hash`` is the remembered hash of ``number`` (None when not remembered);
    ``within_memory`` is False when no remembered block is still on the node's chain and
    ``number`` is the deep-reorg fallback of :func:`beyond_memory`; ``lost`` is the oldest
    remembered block known gone from the node's chain (None when not known): with gaps in
    memory the reorg took at least the blocks from ``lost`` up, at most those above
    ``number``."""

    number: int
    block_hash: bytes | None
    within_memory: bool
    lost: int | None = None


@dataclass(frozen=True, slots=True)
class Ask:
    """The walk back needs the node's hash of block ``number`` to go on."""

    number: int


def walk_back(
    remembered: Mapping[int, bytes], head: int, node: Mapping[int, bytes], floor: int
) -> Ancestor | Ask:
    """The next move of a walk back from head ``head`` to the common ancestor.

    The remembered blocks at or below ``head`` are compared with the node's hashes
    (``node``: those fetched so far), newest first. The first that agrees is the common
    ancestor (every block under it agrees too: each hash covers its parent); one not yet
    fetched is asked for. With gaps in memory the ancestor is the newest remembered block
    that agrees, at or below the true one (undoing a little more is safe: re-indexing is
    idempotent). When none agrees, :func:`beyond_memory` decides.

    Args:
        remembered: block number -> hash as the worker saw them.
        head: the node's head block number (remembered blocks above it are lost).
        node: block number -> the node's hash now, for the numbers asked so far.
        floor: the block before the first the index covers (its start block - 1).
    """
    lost = min((n for n in remembered if n > head), default=None)
    for number in sorted((n for n in remembered if n <= head), reverse=True):
        if number not in node:
            return Ask(number)
        if node[number] == remembered[number]:
            return Ancestor(number, remembered[number], True, lost)
        lost = number
    fallback = beyond_memory(remembered, floor)
    return Ancestor(fallback, remembered.get(fallback), False, lost)


def beyond_memory(remembered: Mapping[int, bytes], floor: int, unseen_from: int | None = None) -> int:
    """Where an index rewinds to when no remembered block is still on the node's chain: the one
    place deciding what a reorg deeper than memory does (today no incident: the index rewinds
    to the edge of what it knew, and what lies below that edge stands).

    Args:
        remembered: block number -> hash as the worker saw them.
        floor: the block before the first the index covers (its start block - 1).
        unseen_from: the cursor of an index resumed whose block is no longer on the chain (a
            reorg while no worker ran, so nothing was remembered): it rewinds
            :data:`KEEP_HASHES` blocks under it (no further than ``floor``), as far as a
            followed reorg reaches.

    Returns:
        With ``unseen_from``: ``max(floor, unseen_from - KEEP_HASHES)``; else the block just
        below the oldest remembered one (``floor`` when nothing is remembered).
    """
    if unseen_from is not None:
        return max(floor, unseen_from - KEEP_HASHES)
    return min(remembered, default=floor + 1) - 1


def reorg_incident(ancestor: Ancestor, seen_head: int, window: int, finalized: int | None) -> str | None:
    """Whether undoing the blocks above ``ancestor`` is a reorg to follow (None) or an
    incident (why, one line): the rewind would reach deeper than the confirmation window
    (``seen_head - ancestor.number > window``, or from ``ancestor.lost`` when memory has
    gaps: blocks buried under the window, reported settled, would be undone), below the
    node's ``finalized`` block, or past what the worker remembers (no remembered block is
    still on the chain).

    Args:
        ancestor: where the walk back ended.
        seen_head: the newest block the worker saw on the chain it followed (its old head).
        window: the confirmation depth (blocks), at least 1.
        finalized: the node's finalized block number (or its safe block, when blocks are
            settled at the safe head), None when it reports none.
    """
    depth = seen_head - (ancestor.number if ancestor.lost is None else ancestor.lost - 1)
    if not ancestor.within_memory:
        return f"no remembered block is on the node's chain (a reorg of more than {depth} blocks)"
    if depth > max(window, 1):
        return f"a reorg of {depth} blocks, deeper than the confirmation window of {max(window, 1)}"
    if finalized is not None and ancestor.number < finalized:
        return f"a reorg below the finalized block {finalized} (common ancestor {ancestor.number})"
    return None
