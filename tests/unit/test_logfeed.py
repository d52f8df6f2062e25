"""The node's shared log reads (relayer/chain/logfeed.py): one ``eth_getLogs`` per range and
last-block hash for every reader, over the union of what they read; each picks its own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from relayer.chain.errors import ChainUnavailable
from relayer.chain.logfeed import LogFeed, pick

A, B = "0x" + "aa" * 20, "0x" + "bb" * 20
T1, T2 = b"\x01" * 32, b"\x02" * 32


def _entry(address: str, topic: bytes) -> dict[str, Any]:
    return {
        "address": address.upper().replace("0X", "0x"),
        "topics": ["0x" + topic.hex().upper()],
        "data": "0x",
    }


class _Node:
    """Answers ``eth_getLogs`` with one entry per (address, topic) the query asks for."""

    def __init__(self) -> None:
        self.queries: list[dict[str, Any]] = []
        self.fail = False

    async def request(self, method: str, params: list[Any]) -> Any:
        assert method == "eth_getLogs"
        await asyncio.sleep(0)
        if self.fail:
            raise ChainUnavailable(detail="down")
        query = params[0]
        self.queries.append(query)
        return [_entry(a, bytes.fromhex(t[2:])) for a in query["address"] for t in query["topics"][0]]


def _feed() -> tuple[LogFeed, _Node]:
    node = _Node()
    return LogFeed(node), node  # type: ignore[arg-type]


def test_pick_keeps_a_readers_pairs_whatever_the_case() -> None:
    entries = [_entry(A, T1), _entry(A, T2), _entry(B, T1), {"address": A, "topics": [], "data": "0x"}]
    pairs = frozenset({(A, "0x" + T1.hex()), (B, "0x" + T1.hex())})
    assert pick(entries, pairs) == [entries[0], entries[2]]
    with pytest.raises(KeyError):
        pick([{"topics": []}], pairs)


async def test_readers_of_one_range_at_one_hash_share_one_read_over_their_union() -> None:
    feed, node = _feed()
    follower = feed.want([A], [T1])
    catalogue = feed.want([B], [T2])
    got = await asyncio.gather(feed.read(follower, 5, 6, b"h"), feed.read(catalogue, 5, 6, b"h"))
    assert len(node.queries) == 1  # together: one read
    assert node.queries[0]["address"] == [A, B] and node.queries[0]["fromBlock"] == "0x5"
    assert pick(got[0], follower) == [_entry(A, T1)] and pick(got[1], catalogue) == [_entry(B, T2)]
    await feed.read(catalogue, 5, 6, b"h")
    assert len(node.queries) == 1  # later, within KEEP_S: the same read
    await feed.read(catalogue, 5, 6, b"other")  # the range's last block is another: read again
    await feed.read(catalogue, 7, 7, b"h")  # another range
    await feed.read(catalogue, 5, 6, None)  # no hash: a read of its own
    assert len(node.queries) == 4


async def test_a_reader_that_came_after_a_read_gets_its_own_and_a_failure_is_not_kept() -> None:
    feed, node = _feed()
    first = feed.want([A], [T1])
    await feed.read(first, 1, 1, b"h")
    late = feed.want([B], [T2])
    assert pick(await feed.read(late, 1, 1, b"h"), late) == [_entry(B, T2)]  # not in the kept read
    assert len(node.queries) == 2
    node.fail = True
    with pytest.raises(ChainUnavailable):
        await feed.read(first, 2, 2, b"h")
    node.fail = False
    await feed.read(first, 2, 2, b"h")
    assert len(node.queries) == 3
