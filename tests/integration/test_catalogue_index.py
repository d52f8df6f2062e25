"""The catalogue index in Postgres: listing events fold into listings idempotently, and a
reorg deletes what lost blocks held and folds the touched listings again (store/catalogue.py,
store/reorg.py)."""

from __future__ import annotations

from typing import Any

import pytest

from relayer.domain.marketplace import ZERO_ADDRESS, CreditRegistration, ListingEvent, Transfer
from relayer.store import reorg
from relayer.store.catalogue import CatalogueStore, IndexBatch

pytestmark = pytest.mark.integration

CHAIN = 990_001  # a chain id no other test uses
MARKET = "0x" + "aa" * 20
CREDITS = "0x" + "bb" * 20
SELLER = "0x" + "cc" * 20


def _created(listing_id: int, block: int, amount: int = 5_000, price: int = 2_000_000) -> ListingEvent:
    data = {
        "seller": SELLER,
        "creditToken": CREDITS,
        "tokenId": 1,
        "amount": amount,
        "unitPrice": price,
        "minFill": 0,
        "expiration": 4_000_000_000,
    }
    return ListingEvent(listing_id, "created", data, block, 1_000 + block, 0, bytes([block]) * 32)


def _filled(listing_id: int, block: int, amount: int) -> ListingEvent:
    data = {"buyer": SELLER, "amount": amount, "cost": 1}
    return ListingEvent(listing_id, "filled", data, block, 1_000 + block, 1, bytes([block]) * 32)


def _batch(events: list[ListingEvent], transfers: list[tuple[int, Transfer]] | None = None) -> IndexBatch:
    return IndexBatch(
        CHAIN, MARKET, CREDITS, [CreditRegistration(1, "VCS-10", 2019, "VCS", 1)], events, transfers or []
    )


async def test_events_fold_once_and_a_reorg_folds_again(database_url: str, db_of: Any) -> None:
    db = await db_of(database_url)
    store = CatalogueStore(db)
    mint = Transfer(1, 2, 0, b"\x01" * 32, 1001, ZERO_ADDRESS, SELLER, 5_000)
    first = _batch([_created(1, 1), _created(2, 2), _filled(1, 3, 1_000)], [(1, mint)])
    await store.save(first, "catalogue", 3, b"\x03" * 32)
    await store.save(first, "catalogue", 3, b"\x03" * 32)  # replayed range: nothing counted twice
    one = await store.listing(CHAIN, 1)
    assert one is not None and one.state.left_to_sell == 4_000
    await store.save(_batch([_filled(1, 4, 500), _filled(2, 5, 5_000)]), "catalogue", 5, b"\x05" * 32)
    live = {cl.state.listing_id: cl.state for cl in await store.live_listings(0) if cl.chain_id == CHAIN}
    assert live[1].left_to_sell == 3_500 and 2 not in live  # listing 2 sold out
    # blocks 4 and 5 are lost to a reorg; block 2 (listing 2's creation) stays
    await reorg.rewind(db, CHAIN, 3, b"\x03" * 32)
    live = {cl.state.listing_id: cl.state for cl in await store.live_listings(0) if cl.chain_id == CHAIN}
    assert live[1].left_to_sell == 4_000 and live[2].left_to_sell == 5_000
    assert (await store.cursor(CHAIN, "catalogue")) == (3, b"\x03" * 32)
    # a reorg below a listing's creation removes the listing, its credit and its transfers
    await store.rewind(CHAIN, 1, None, ["catalogue"], retirements=True)
    assert await store.listing(CHAIN, 2) is None
    assert (await store.listing(CHAIN, 1)) is not None
    await store.rewind(CHAIN, 0, None, ["catalogue"], retirements=True)
    assert await store.listing(CHAIN, 1) is None
    assert (CHAIN, CREDITS, 1) not in await store.credit_totals()
    assert all(c.chain_id != CHAIN for c in await store.credits())
