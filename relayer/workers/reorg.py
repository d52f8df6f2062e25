"""The one reorg walk-back of the chain follower and the catalogue indexer: what a worker saw
of the canonical chain (a bounded block memory), whether the node's chain is still that one,
and the walk back to the common ancestor, asking the node for one block hash at a time. The
decisions are the pure ones of :mod:`relayer.domain.reorg`; undoing what the lost blocks held
is the worker's (in the store)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from relayer.chain.types import BlockHeader
from relayer.domain.confirmation import ConfirmationPolicy
from relayer.domain.incidents import Incident
from relayer.domain.reorg import (
    KEEP_HASHES,
    Ancestor,
    BlockMemory,
    beyond_memory,
    confirmed_through,
    head_reorged,
    reorg_incident,
    walk_back,
)
from relayer.metrics import Metrics
from relayer.workers.chain_guard import ChainGuard

log = logging.getLogger(__name__)


class BlockHashes(Protocol):
    """The node's chain as the walk back reads it."""

    async def block_hash(self, number: int) -> bytes:
        """The hash of block ``number`` on the node's chain now; raises ``ChainUnavailable``."""
        ...


class TaggedBlocks(Protocol):
    """The node's ``safe``/``finalized`` heads as a worker reads them."""

    async def tagged(self, tag: str) -> int | None:
        """The number of the node's ``tag`` block, None when it keeps none; raises ``ChainUnavailable``."""
        ...


def policy_of(confirmations: int | ConfirmationPolicy) -> ConfirmationPolicy:
    """A worker's policy: a bare depth (blocks) counts at a block time of 1 s."""
    if isinstance(confirmations, ConfirmationPolicy):
        return confirmations
    return ConfirmationPolicy(1_000, max(confirmations, 1))


class Confirmed:
    """Which blocks count as confirmed for one worker under its policy: ``depth`` blocks under
    the head, or the node's ``safe``/``finalized`` head (read once per new head, one
    ``eth_getBlockByNumber``; a node with no such tag confirms nothing)."""

    def __init__(self, blocks: TaggedBlocks, policy: ConfirmationPolicy) -> None:
        self.blocks = blocks
        self.policy = policy
        self._at: int | None = None  # the head the tag was read at
        self._through = -1

    def known_through(self, head: int) -> int | None:
        """:meth:`through` when it needs no read (a depth policy: its answer); None under a tag."""
        return confirmed_through(head, self.policy.depth) if self.policy.tag is None else None

    async def through(self, head: int) -> int:
        """The newest confirmed block number under head ``head`` (at most ``head``); raises
        ``ChainUnavailable`` when the node fails."""
        if self.policy.tag is None:
            return confirmed_through(head, self.policy.depth)
        if self._at != head:
            tagged = await self.blocks.tagged(self.policy.tag)
            self._through, self._at = (-1 if tagged is None else tagged), head
        return min(self._through, head)

    async def settled_floor(self) -> int | None:
        """The block below which a reorg is an incident besides the window: the node's
        ``finalized`` block, or the policy's tag block when it settles at one."""
        return await self.blocks.tagged(self.policy.tag or "finalized")


class ReorgWatch:
    """One worker's watch for reorgs on one chain.

    ``floor`` is the block before the first the worker's index covers (its start block - 1);
    ``memory`` holds the blocks the worker read (block number -> hash), at most ``limit``;
    ``seen_head`` is the newest head seen on the remembered chain; ``incident`` says why the
    worker halts on a reorg it must not follow (None while it follows the chain).
    Every method raises ``ChainUnavailable`` when the node fails.
    """

    def __init__(self, blocks: BlockHashes, floor: int, limit: int = KEEP_HASHES) -> None:
        self.blocks = blocks
        self.floor = floor
        self.memory = BlockMemory(limit)
        self.seen_head: int | None = None
        self.incident: str | None = None

    async def resume(self, cursor: tuple[int, bytes | None] | None, head: int) -> Ancestor | None:
        """At start, from an index cursor (block number, hash) read from the store: None when
        there is nothing to undo (no cursor, no hash, a cursor above the head, or its block
        still on the chain, then remembered); else where to rewind to (the chain lost the
        cursor's block while no worker watched: :func:`beyond_memory` decides how far)."""
        if cursor is None or cursor[1] is None or cursor[0] > head:
            return None
        if await self.blocks.block_hash(cursor[0]) == cursor[1]:
            self.memory.remember(cursor[0], cursor[1])
            return None
        return Ancestor(beyond_memory({}, self.floor, unseen_from=cursor[0]), None, False)

    async def reorged(self, head: BlockHeader) -> bool:
        """Whether the chain ``head`` is on is not the one remembered (at most one
        ``eth_getBlockByNumber``, when the head alone cannot tell)."""
        verdict = head_reorged(self.memory, head.number, head.hash, head.parent_hash)
        if verdict is None:
            below = self.memory.newest_below(head.number)
            verdict = below is not None and await self.blocks.block_hash(below) != self.memory.get(below)
        if not verdict:
            self.seen_head = max(head.number, self.seen_head or head.number)
        return verdict

    def saw(self, head: BlockHeader) -> bool:
        """Remember ``head`` and its parent, once :meth:`reorged` judged the head on the
        remembered chain (or the worker undid the reorg under it). False, with nothing
        remembered, when either disagrees with the memory (the chain moved again since): the
        memory stays one chain."""
        pairs = ((head.number, head.hash), (head.number - 1, head.parent_hash))
        if any(self.memory.agrees(number, block_hash) is False for number, block_hash in pairs):
            return False
        for number, block_hash in pairs:
            self.memory.remember(number, block_hash)
        return True

    def judge(self, to: Ancestor, window: int, finalized: int | None) -> str | None:
        """Whether the rewind to ``to`` is an incident (why) or a reorg to follow (None), by
        :func:`~relayer.domain.reorg.reorg_incident` from the newest block seen."""
        seen = max(self.seen_head or to.number, self.memory.newest() or to.number)
        return reorg_incident(to, seen, window, finalized)

    async def ancestor(self, head: int) -> Ancestor:
        """The common ancestor of the remembered chain and the node's (whose head is block
        ``head``): one ``eth_getBlockByNumber`` per remembered block, newest first, until one
        agrees. The memory is left as it is: call :meth:`rewound` once the worker has undone
        the blocks above the ancestor."""
        remembered = self.memory.as_mapping()
        node: dict[int, bytes] = {}
        while True:
            move = walk_back(remembered, head, node, self.floor)
            if isinstance(move, Ancestor):
                return move
            node[move.number] = await self.blocks.block_hash(move.number)

    def rewound(self, ancestor: int) -> None:
        """The blocks above ``ancestor`` were undone: forget them."""
        self.memory.forget_above(ancestor)
        if self.seen_head is not None and self.seen_head > ancestor:
            self.seen_head = ancestor


@dataclass(frozen=True, slots=True)
class ReorgHalt:
    """How one worker halts on a reorg it must not follow: ``part`` names it in the guard,
    the metrics and the incident ("follower", "catalogue"); ``line`` is its error line;
    ``halts_lanes`` opens the chain guard too, so the executor lanes halt with it."""

    part: str
    line: str
    halts_lanes: bool


class ReorgWorker(Protocol):
    """What :func:`undo_or_halt` reads of a worker that follows reorgs (the chain follower,
    a catalogue indexer): its watch and confirmation, its window (blocks), its chain guard,
    metrics and chain, and how it undoes the blocks above an ancestor."""

    watch: ReorgWatch
    confirmed: Confirmed
    confirmations: int
    guard: ChainGuard | None
    metrics: Metrics
    chain_id: int

    async def _rewind(self, to: Ancestor, where: str) -> None: ...


async def undo_or_halt(head: BlockHeader, worker: ReorgWorker, halt: ReorgHalt) -> None:
    """The reorg under ``head``, for the follower and the catalogue indexer alike: asks the
    chain guard at once (another chain is its incident), then rewinds to the common ancestor
    (the worker's ``_rewind``) when the reorg is within its window and above the node's
    finalized block; else records the incident on its watch (once), sets
    ``relayer_deep_reorg`` and halts.

    Raises:
        Incident: ``deep_reorg`` (deeper than the window, below the finalized block or past
            memory; raised again at each step until the node's chain holds the remembered
            blocks), or the guard's own.
        ChainUnavailable: the node failed.
    """
    watch, guard, metrics, chain_id = worker.watch, worker.guard, worker.metrics, worker.chain_id
    if guard is not None:
        await guard.check(halt.part, now=True)
    if watch.incident is None:
        to = await watch.ancestor(head.number)
        why = watch.judge(to, worker.confirmations, await worker.confirmed.settled_floor())
        if why is None:
            await worker._rewind(to, f"head {head.number}")
            return
        watch.incident = why
        metrics.deep_reorg.labels(str(chain_id), halt.part).set(1)
        if guard is not None and halt.halts_lanes:
            guard.open(halt.part, why)
        log.error(
            halt.line,
            extra={"chain_id": chain_id, "head": head.number, "ancestor": to.number, "reason": why},
        )
    metrics.halted_steps.labels(halt.part, "deep_reorg").inc()
    raise Incident("deep_reorg", watch.incident, chain_id=chain_id)
