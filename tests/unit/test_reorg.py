"""Reorgs as pure decisions (relayer/domain/reorg.py): the confirmation-depth predicate, the
bounded block memory, the walk back to the common ancestor and what a reorg deeper than memory
does; and the walk back as the follower and the catalogue indexer run it
(relayer/workers/reorg.py) against a fake node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from relayer.chain.types import BlockHeader, Receipt
from relayer.domain.reorg import (
    KEEP_HASHES,
    Ancestor,
    Ask,
    BlockMemory,
    beyond_memory,
    confirmed_through,
    head_reorged,
    is_confirmed,
    reorg_incident,
    walk_back,
)
from relayer.metrics import Metrics
from relayer.workers.follower import ChainFollower
from relayer.workers.reorg import ReorgWatch


def h(number: int, fork: int = 0) -> bytes:
    """The hash of block ``number`` on chain ``fork`` (0: the one first seen)."""
    return bytes([fork]) + number.to_bytes(31, "big")


# ---------------------------------------------------------------- confirmation depth


def test_depth_one_confirms_the_head_itself() -> None:
    assert confirmed_through(100, 1) == 100
    assert is_confirmed(100, 100, 1)
    assert not is_confirmed(101, 100, 1)


def test_depth_zero_is_depth_one() -> None:
    assert confirmed_through(100, 0) == 100
    assert is_confirmed(100, 100, 0) and not is_confirmed(101, 100, 0)


@pytest.mark.parametrize("depth", [2, 5, 64])
def test_depth_n_counts_the_block_itself(depth: int) -> None:
    head = 1_000
    newest = head - depth + 1  # buried under depth - 1 blocks: depth confirmations
    assert confirmed_through(head, depth) == newest
    assert is_confirmed(newest, head, depth) and is_confirmed(newest - 1, head, depth)
    assert not is_confirmed(newest + 1, head, depth)


def test_a_negative_depth_is_refused() -> None:
    with pytest.raises(ValueError):
        confirmed_through(10, -1)
    with pytest.raises(ValueError):
        is_confirmed(1, 10, -1)


def test_a_depth_above_the_chain_confirms_nothing_yet() -> None:
    assert confirmed_through(3, 10) == -6
    assert not is_confirmed(0, 3, 10)


# ---------------------------------------------------------------- block memory


def test_memory_keeps_the_newest_blocks_up_to_its_bound() -> None:
    memory = BlockMemory(limit=3)
    for number in (5, 1, 3, 9, 7):
        memory.remember(number, h(number))
    assert list(memory) == [5, 7, 9] and len(memory) == 3
    assert memory.get(1) is None and memory.get(9) == h(9)
    assert (memory.oldest(), memory.newest()) == (5, 9)


def test_memory_default_bound_is_keep_hashes() -> None:
    memory = BlockMemory()
    for number in range(KEEP_HASHES + 10):
        memory.remember(number, h(number))
    assert len(memory) == KEEP_HASHES and memory.oldest() == 10


def test_memory_with_gaps_forgets_above_and_finds_the_newest_below() -> None:
    memory = BlockMemory(limit=10)
    for number in (10, 20, 30):
        memory.remember(number, h(number))
    assert memory.newest_below(30) == 20 and memory.newest_below(31) == 30
    assert memory.newest_below(10) is None
    memory.forget_above(25)
    assert list(memory) == [10, 20]
    # The memory holds one chain: another hash at a remembered height is refused (a reorg the
    # worker must notice and undo, forget_above, before the new chain is remembered).
    assert memory.remember(20, h(20)) is True  # the same sight again
    assert memory.remember(20, h(20, 1)) is False
    assert memory.get(20) == h(20) and len(memory) == 2
    assert memory.agrees(20, h(20)) is True and memory.agrees(20, h(20, 1)) is False
    assert memory.agrees(15, h(15)) is None  # not remembered: cannot tell
    memory.forget_above(19)
    assert memory.remember(20, h(20, 1)) is True


def test_memory_holds_at_least_one_block() -> None:
    with pytest.raises(ValueError):
        BlockMemory(limit=0)


# ---------------------------------------------------------------- a head against memory


def test_a_head_is_judged_by_its_own_height_then_its_parent() -> None:
    memory = BlockMemory()
    for number in (8, 9):
        memory.remember(number, h(number))
    assert head_reorged(memory, 9, h(9), h(8)) is False  # the same head
    assert head_reorged(memory, 9, h(9, 1), h(8)) is True  # another block at 9
    assert head_reorged(memory, 10, h(10), h(9)) is False  # a child of what was seen
    assert head_reorged(memory, 10, h(10, 1), h(9, 1)) is True  # a child of another 9
    assert head_reorged(memory, 8, h(8), h(7)) is True  # block 9 is gone
    assert head_reorged(memory, 12, h(12), h(11)) is None  # ask the node about block 9
    assert head_reorged(BlockMemory(), 5, h(5), h(4)) is None


def test_a_head_matching_its_height_is_still_checked_through_its_parent() -> None:
    # A head whose own height agrees but whose parent does not links two chains: a reorg.
    memory = BlockMemory()
    for number in (8, 9, 10):
        memory.remember(number, h(number))
    assert head_reorged(memory, 10, h(10), h(9, 1)) is True
    assert head_reorged(memory, 10, h(10), h(9)) is False


# ---------------------------------------------------------------- the walk back


def test_the_walk_asks_newest_first_and_stops_at_the_first_agreement() -> None:
    remembered = {n: h(n) for n in range(10, 16)}
    node = {15: h(15, 1), 14: h(14, 1)}
    assert walk_back(remembered, 15, {}, 0) == Ask(15)
    assert walk_back(remembered, 15, {15: h(15, 1)}, 0) == Ask(14)
    assert walk_back(remembered, 15, node, 0) == Ask(13)
    assert walk_back(remembered, 15, {**node, 13: h(13)}, 0) == Ancestor(13, h(13), True, 14)


def test_a_depth_one_reorg_keeps_the_parent() -> None:
    remembered = {n: h(n) for n in range(1, 6)}
    assert walk_back(remembered, 5, {5: h(5, 1), 4: h(4)}, 0) == Ancestor(4, h(4), True, 5)


def test_remembered_blocks_above_the_head_are_lost_without_asking() -> None:
    remembered = {n: h(n) for n in range(1, 8)}
    assert walk_back(remembered, 5, {}, 0) == Ask(5)  # 6 and 7 are not on a chain whose head is 5
    assert walk_back(remembered, 5, {5: h(5)}, 0) == Ancestor(5, h(5), True, 6)


def test_with_gaps_the_ancestor_is_the_newest_remembered_block_that_agrees() -> None:
    remembered = {100: h(100), 140: h(140), 160: h(160)}
    node = {160: h(160, 1), 140: h(140, 1), 100: h(100)}
    assert walk_back(remembered, 170, node, 0) == Ancestor(100, h(100), True, 140)


def test_no_common_ancestor_within_memory_rewinds_to_its_edge() -> None:
    remembered = {n: h(n) for n in range(50, 54)}
    node = {n: h(n, 1) for n in range(50, 54)}
    assert walk_back(remembered, 53, node, 9) == Ancestor(49, None, False, 50)
    assert beyond_memory(remembered, 9) == 49


def test_an_empty_memory_rewinds_to_the_floor() -> None:
    assert walk_back({}, 20, {}, 9) == Ancestor(9, None, False)
    assert beyond_memory({}, 9) == 9


def test_a_resumed_cursor_lost_while_nobody_watched_rewinds_keep_hashes_blocks() -> None:
    assert beyond_memory({}, 9, unseen_from=1_000) == 1_000 - KEEP_HASHES
    assert beyond_memory({}, 9, unseen_from=100) == 9  # no further than the floor


# ---------------------------------------------------------------- the shared routine


class FakeNode:
    """A chain as a list of hashes by number, counting what is asked."""

    def __init__(self, hashes: dict[int, bytes]) -> None:
        self.hashes = hashes
        self.asked: list[int] = []

    async def block_hash(self, number: int) -> bytes:
        self.asked.append(number)
        return self.hashes[number]

    def head(self) -> BlockHeader:
        number = max(self.hashes)
        return BlockHeader(number, self.hashes[number], self.hashes[number - 1])


async def test_the_watch_walks_back_only_as_far_as_the_reorg() -> None:
    node = FakeNode({n: h(n) for n in range(0, 300)})
    watch = ReorgWatch(node, floor=0)
    for number in range(1, 300):
        watch.memory.remember(number, h(number))
    assert not await watch.reorged(node.head()) and node.asked == []
    for number in (297, 298, 299):  # a depth-3 reorg
        node.hashes[number] = h(number, 1)
    assert await watch.reorged(node.head())
    ancestor = await watch.ancestor(299)
    assert ancestor == Ancestor(296, h(296), True, 297)
    assert node.asked == [299, 298, 297, 296]  # one hash per lost block and one for the ancestor
    assert watch.memory.newest() == 299  # kept until the worker has undone the blocks
    watch.rewound(ancestor.number)
    assert watch.memory.newest() == 296


async def test_the_watch_asks_the_node_when_the_head_alone_cannot_tell() -> None:
    node = FakeNode({n: h(n) for n in range(0, 20)})
    watch = ReorgWatch(node, floor=0)
    watch.memory.remember(10, h(10))  # an indexer: only what it indexed, below the head
    assert not await watch.reorged(node.head()) and node.asked == [10]
    node.hashes[10] = h(10, 1)
    assert await watch.reorged(node.head())


async def test_the_watch_resumes_from_a_cursor() -> None:
    node = FakeNode({n: h(n) for n in range(0, 600)})
    watch = ReorgWatch(node, floor=4)
    assert await watch.resume(None, 599) is None
    assert await watch.resume((500, None), 599) is None
    assert await watch.resume((700, h(700)), 599) is None  # above the head: nothing to compare
    assert node.asked == [] and len(watch.memory) == 0
    assert await watch.resume((500, h(500)), 599) is None
    assert watch.memory.get(500) == h(500)
    fresh = ReorgWatch(node, floor=4)
    assert await fresh.resume((500, h(500, 1)), 599) == Ancestor(500 - KEEP_HASHES, None, False)
    assert await fresh.resume((100, h(100, 1)), 599) == Ancestor(4, None, False)


# ---------------------------------------------------------------- deep reorgs are incidents


def test_a_reorg_within_the_confirmation_window_is_followed() -> None:
    assert reorg_incident(Ancestor(96, h(96), True, 97), 100, 5, None) is None  # 4 blocks
    assert reorg_incident(Ancestor(95, h(95), True, 96), 100, 5, None) is None  # 5 blocks: the window


def test_a_reorg_deeper_than_the_window_is_an_incident() -> None:
    why = reorg_incident(Ancestor(94, h(94), True, 95), 100, 5, None)
    assert why is not None and "6 blocks" in why and "window of 5" in why
    # Depth 0 is depth 1: a one-block reorg is followed, a two-block one is not.
    assert reorg_incident(Ancestor(99, h(99), True, 100), 100, 0, None) is None
    assert reorg_incident(Ancestor(98, h(98), True, 99), 100, 0, None) is not None


def test_with_gaps_in_memory_the_depth_counts_from_the_oldest_block_known_lost() -> None:
    # The ancestor found is 90 (the newest remembered that agrees), but only 99 and 100 are
    # known lost: a two-block reorg, within a window of 3.
    assert reorg_incident(Ancestor(90, h(90), True, 99), 100, 3, None) is None
    assert reorg_incident(Ancestor(90, h(90), True, 97), 100, 3, None) is not None


def test_a_reorg_below_the_finalized_block_is_an_incident() -> None:
    why = reorg_incident(Ancestor(96, h(96), True, 97), 100, 10, finalized=98)
    assert why is not None and "finalized block 98" in why
    assert reorg_incident(Ancestor(96, h(96), True, 97), 100, 10, finalized=96) is None


def test_a_reorg_past_memory_is_an_incident() -> None:
    why = reorg_incident(Ancestor(49, None, False, 50), 53, 64, None)
    assert why is not None and "no remembered block" in why


async def test_the_watch_judges_from_the_newest_head_it_saw() -> None:
    node = FakeNode({n: h(n) for n in range(0, 20)})
    watch = ReorgWatch(node, floor=0)
    watch.memory.remember(10, h(10))
    assert not await watch.reorged(node.head()) and watch.seen_head == 19
    for number in (9, 10):
        node.hashes[number] = h(number, 1)
    assert await watch.reorged(node.head())
    watch.memory.remember(5, h(5))
    ancestor = await watch.ancestor(19)
    assert ancestor == Ancestor(5, h(5), True, 10)
    # Seen up to 19, block 10 lost: at least a 10-block reorg.
    assert watch.judge(ancestor, 10, None) is None
    assert watch.judge(ancestor, 9, None) is not None
    watch.rewound(5)
    assert watch.seen_head == 5


# ---------------------------------------------------------------- the follower's memory is one chain


class FakeBlocks:
    """The follower's chain reads: heads (each listing one transaction, ``TX``), headers,
    block hashes and receipts by block hash and by transaction hash, from ``chain`` (number
    -> (hash, parent hash)), which a test swaps mid-step. A block no longer on ``chain`` is
    unknown by its hash, unless ``keeps_side_blocks`` (as geth keeps a reorged block)."""

    def __init__(self, chain: dict[int, tuple[bytes, bytes]], keeps_side_blocks: bool = False) -> None:
        self.chain = chain
        self.node = type("Node", (), {"chain_id": 8453})()
        self.on_receipts: Callable[[], None] = lambda: None
        self.read: list[str] = []
        self.keeps_side_blocks = keeps_side_blocks
        self.ever = {block: number for number, (block, _parent) in chain.items()}

    def _header(self, number: int) -> BlockHeader:
        return BlockHeader(number, *self.chain[number], frozenset({"0x" + bytes([number]).hex() * 32}))

    async def head_block(self) -> BlockHeader:
        return self._header(max(self.chain))

    async def headers(self, numbers: list[int]) -> list[BlockHeader]:
        self.read.append(f"headers {numbers}")
        return [self._header(n) for n in numbers]

    async def block_hash(self, number: int) -> bytes:
        return self.chain[number][0]

    async def finalized(self) -> int | None:
        return None

    async def tagged(self, tag: str) -> int | None:
        return None

    async def receipts_in(self, listed: dict[bytes, list[bytes]]) -> dict[bytes, Receipt]:
        self.read.append(f"receipts of {sum(map(len, listed.values()))} in {len(listed)} block(s)")
        self.on_receipts()  # the chain moves while the step reads
        self.ever |= {block: number for number, (block, _parent) in self.chain.items()}
        held = {block: number for number, (block, _parent) in self.chain.items()}
        if self.keeps_side_blocks:
            held = {**self.ever, **held}
        return {
            t: Receipt(t, held[block], block, 1, 21_000, 1, 0)
            for block, txs in listed.items()
            for t in txs
            if block in held and t[0] == held[block]
        }

    async def receipts(self, tx_hashes: list[bytes]) -> dict[bytes, Receipt]:
        self.read.append(f"receipts of {len(tx_hashes)}")
        self.on_receipts()  # the chain moves while the step reads
        return {
            t: Receipt(t, t[0], self.chain[t[0]][0], 1, 21_000, 1, 0) for t in tx_hashes if t[0] in self.chain
        }


def _fork(numbers: range, fork: int, below: int) -> dict[int, tuple[bytes, bytes]]:
    """Blocks ``numbers`` of chain ``fork``, the first a child of block ``numbers[0] - 1`` of
    chain ``below``."""
    return {n: (h(n, fork), h(n - 1, below if n == numbers[0] else fork)) for n in numbers}


class FakeLane:
    def __init__(self, pending: dict[bytes, Any] | None = None) -> None:
        self.recorded: list[Any] = []
        self.in_flight = {b"\xff" * 32: object()} if pending is None else pending

    async def pending(self) -> dict[bytes, Any]:
        return self.in_flight  # something in flight: our receipts are read

    async def record_mined(self, mined: Any, moves: Any, stood_in: Any) -> dict[Any, Any]:
        self.recorded.append(mined)
        return {}


def _follower(blocks: FakeBlocks, lane: FakeLane) -> ChainFollower:
    return ChainFollower(
        blocks,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        lane,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        Metrics(),
        confirmations=1,
        start_block=90,
        poll_interval_s=0.05,
    )


async def test_the_follower_reads_only_the_receipts_of_its_own_transactions() -> None:
    # Blocks 101-103 each list one transaction; ours (in flight) is 102's only: one batch of
    # headers for the blocks under the head, one receipt, nobody else's.
    chain = _fork(range(90, 104), 0, 0)
    blocks = FakeBlocks(chain)
    ours = bytes([102]) * 32
    tx = type("Tx", (), {"kind": "noop", "job_id": None})()
    lane = FakeLane({ours: tx, b"\xee" * 32: tx})
    follower = _follower(blocks, lane)
    follower._indexed = follower._scanned = 100
    head = await blocks.head_block()
    assert follower.watch.saw(head)
    assert await follower._scan(head)
    assert blocks.read == ["headers [101, 102]", "receipts of 1 in 1 block(s)"]
    assert [[m[0] for m in mined] for mined in lane.recorded] == [[ours]]
    assert follower._scanned == 103
    assert [follower.watch.memory.get(n) for n in (101, 102, 103)] == [h(101), h(102), h(103)]


async def test_a_reorg_while_the_follower_reads_receipts_leaves_its_memory_on_one_chain() -> None:
    # The follower saw 100 on chain 0; it reads head 101 (chain 0), then, while it reads the
    # receipt of our transaction listed in 101, a depth-2 reorg replaces 100 and 101 (chain 1,
    # common ancestor 99).
    old = {**_fork(range(90, 102), 0, 0)}
    blocks = FakeBlocks({n: v for n, v in old.items() if n <= 100})
    lane = FakeLane({bytes([101]) * 32: type("Tx", (), {"kind": "noop", "job_id": None})()})
    follower = _follower(blocks, lane)
    follower._indexed = follower._scanned = 100
    for number in range(90, 101):
        assert follower.watch.memory.remember(number, old[number][0])
    follower.watch.seen_head = 100
    blocks.chain[101] = old[101]
    new = {**{n: old[n] for n in range(90, 100)}, **_fork(range(100, 102), 1, 0)}

    def reorg() -> None:
        blocks.chain = new

    blocks.on_receipts = reorg
    head = await blocks.head_block()
    assert follower.watch.saw(head)  # as step does before its receipts
    assert await follower._scan(head) is False  # the chain moved under the step
    assert lane.recorded == [] and follower._scanned == 100, "nothing recorded of a moved chain"
    assert follower.watch.memory.get(101) == h(101, 0), "no hash of the new chain is remembered"
    follower.watch.seen_head = 101
    head = await blocks.head_block()
    assert await follower.watch.reorged(head)
    ancestor = await follower.watch.ancestor(head.number)
    assert ancestor.number == 99  # the real common ancestor: the reorg is 2 blocks deep
    why = follower.watch.judge(ancestor, 1, None)
    assert why is not None and "a reorg of 2 blocks" in why


async def test_receipts_of_a_block_reorged_away_while_read_are_recorded_in_it_and_rewound_next_step() -> None:
    # As above, but the node still answers the receipts of the reorged block 101 by its hash
    # (geth keeps side blocks): ours is recorded mined in the block the follower listed it in,
    # the memory holds that block's chain, and the next head (101 of chain 1) is a reorg of 2
    # blocks whose rewind undoes it.
    old = {**_fork(range(90, 102), 0, 0)}
    blocks = FakeBlocks({n: v for n, v in old.items() if n <= 101}, keeps_side_blocks=True)
    ours = bytes([101]) * 32
    lane = FakeLane({ours: type("Tx", (), {"kind": "noop", "job_id": None})()})
    follower = _follower(blocks, lane)
    follower._indexed = follower._scanned = 100
    for number in range(90, 101):
        assert follower.watch.memory.remember(number, old[number][0])
    follower.watch.seen_head = 100
    new = {**{n: old[n] for n in range(90, 100)}, **_fork(range(100, 102), 1, 0)}

    def reorg() -> None:
        blocks.chain = new

    blocks.on_receipts = reorg
    head = await blocks.head_block()
    assert follower.watch.saw(head)
    assert await follower._scan(head)
    assert [[(m[0], m[1]) for m in mined] for mined in lane.recorded] == [[(ours, 101)]]
    assert follower.watch.memory.get(101) == h(101, 0), "the block it was recorded in"
    head = await blocks.head_block()
    assert await follower.watch.reorged(head)
    assert (await follower.watch.ancestor(head.number)).number == 99


async def test_the_watch_remembers_a_head_only_on_the_chain_it_holds() -> None:
    node = FakeNode({n: h(n) for n in range(0, 20)})
    watch = ReorgWatch(node, floor=0)
    assert watch.saw(node.head())
    assert watch.memory.get(19) == h(19) and watch.memory.get(18) == h(18)
    # A head of another chain at the same height, or a child of another 18: refused whole.
    assert not watch.saw(BlockHeader(19, h(19, 1), h(18, 1)))
    assert not watch.saw(BlockHeader(20, h(20, 1), h(19, 1)))
    assert watch.memory.get(19) == h(19) and watch.memory.get(20) is None
    assert watch.saw(BlockHeader(20, h(20), h(19)))
