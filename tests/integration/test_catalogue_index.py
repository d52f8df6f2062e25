"""The catalogue index in Postgres: listing events fold into listings idempotently, and a
reorg deletes what lost blocks held and folds the touched listings again (store/catalogue.py,
store/reorg.py); on a real anvil, the catalogue indexer walks a shallow reorg back to the
common ancestor and undoes exactly the lost blocks (workers/catalogue_indexer.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from web3 import Web3

from relayer.chain.abi import abi
from relayer.chain.catalogue import CatalogueChain
from relayer.chain.node import ChainNode
from relayer.chain.reads import ChainReads
from relayer.chain.types import Contracts
from relayer.domain.incidents import Incident
from relayer.domain.marketplace import ZERO_ADDRESS, CreditRegistration, ListingEvent, Transfer
from relayer.metrics import Metrics
from relayer.store import reorg
from relayer.store.catalogue import CatalogueStore, IndexBatch
from relayer.workers.catalogue_indexer import CatalogueIndexer
from tests.chain_helpers import transact_as, transact_as_deployer
from tests.private import Anvil, private_chain

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


def _list_one_tonne(info: dict[str, Any], token_id: int) -> int:
    """The seller lists one tonne of credit ``token_id`` (minted to it first, in a block of its
    own); returns the new listing's id. Each transaction is a block of its own (automine)."""
    contracts = info["contracts"]
    w3 = Web3(Web3.HTTPProvider(info["rpcUrl"]))
    market = w3.eth.contract(address=contracts["marketplace"], abi=abi("Marketplace"))
    seller = info["seller"]["address"]
    transact_as_deployer(info, contracts["carbonCredits"], "CarbonCredits", "mint", seller, token_id, 1_000)
    expiration = int(w3.eth.get_block("latest")["timestamp"]) + 86_400
    receipt = transact_as(
        info,
        "seller",
        contracts["marketplace"],
        "Marketplace",
        "createListing",
        contracts["carbonCredits"],
        token_id,
        1_000,
        2_000_000,
        0,
        expiration,
    )
    assert receipt["status"] == 1
    return int(market.functions.listingCount().call())


def _hash(anvil: Anvil, number: int) -> bytes:
    return bytes.fromhex(anvil.rpc("eth_getBlockByNumber", hex(number), False)["hash"][2:])


async def test_the_indexer_undoes_exactly_the_blocks_a_shallow_reorg_took_and_halts_on_a_deep_one(
    tmp_path: Path, admin_database_url: str, db_of: Any
) -> None:
    async with private_chain(tmp_path, admin_database_url) as (info, dsn):
        anvil = Anvil(info["rpcUrl"])
        node = ChainNode(info["rpcUrl"], info["chainId"], Contracts.from_deployment(info["contracts"]))
        store, metrics = CatalogueStore(await db_of(dsn)), Metrics()
        indexer = CatalogueIndexer(
            CatalogueChain(node, settlement=False),
            ChainReads(node),
            store,
            metrics,
            1,  # depth 1: anvil mines a block per transaction
            info["deployBlock"],
            0.05,
            retirements=False,
        )
        chain_id = info["chainId"]

        async def indexed_all() -> None:
            while await indexer.step():
                pass

        try:
            await indexer.step()  # resumes with no cursor: nothing to undo
            await indexed_all()
            seeded = [row["listingId"] for row in info["listings"]]
            token_id = info["listings"][0]["tokenId"]
            kept = _list_one_tonne(info, token_id)
            await indexed_all()
            lost = _list_one_tonne(info, token_id)  # minted in one block, listed in the next
            await indexed_all()
            head = int(anvil.rpc("eth_blockNumber"), 16)
            kept_block, kept_hash = head - 1, _hash(anvil, head - 1)  # the mint's block
            assert await store.listing(chain_id, lost) is not None
            assert await store.cursor(chain_id, "catalogue") == (head, _hash(anvil, head))

            anvil.rpc("anvil_reorg", 1, [])  # within the window: the listing's block is replaced
            assert await indexer.step()  # the walk back and the undo
            # Exactly the lost block is undone: back to the common ancestor, not 128 blocks.
            assert await store.cursor(chain_id, "catalogue") == (kept_block, kept_hash)
            assert await store.listing(chain_id, lost) is None
            assert await store.listing(chain_id, kept) is not None
            for listing_id in seeded:  # indexed long before: untouched by the undo
                assert await store.listing(chain_id, listing_id) is not None
            assert metrics.reorgs.labels(str(chain_id))._value.get() == 1

            await indexed_all()  # the new chain holds the mint, not the listing
            assert await store.listing(chain_id, lost) is None
            assert await store.listing(chain_id, kept) is not None
            assert await store.cursor(chain_id, "catalogue") == (head, _hash(anvil, head))
            assert metrics.reorgs.labels(str(chain_id))._value.get() == 1

            # Deeper than the confirmation window (1 block): an incident, nothing undone.
            head = int(anvil.rpc("eth_blockNumber"), 16)
            anvil.rpc("anvil_reorg", 3, [])
            with pytest.raises(Incident) as halted:
                await indexer.step()
            assert (
                halted.value.kind == "deep_reorg"
                and "deeper than the confirmation window" in halted.value.message
            )
            with pytest.raises(Incident):
                await indexer.step()  # it stays halted
            assert await store.cursor(chain_id, "catalogue") == (head, indexer.watch.memory.get(head))
            assert await store.listing(chain_id, kept) is not None
            assert metrics.deep_reorg.labels(str(chain_id), "catalogue")._value.get() == 1
            assert metrics.reorgs.labels(str(chain_id))._value.get() == 1  # the shallow one only
        finally:
            await node.close()
