"""The catalogue indexer's side of a chain: every event it indexes in a block range, from one
``eth_getLogs`` over the marketplace, the credit token and (on chains this daemon does not
relay on) the settlement contract, decoded into domain types: listing events, credit
registrations, ERC-1155 transfers of credits, and ``RetirementSettled`` logs. The read is the
node's :class:`~relayer.chain.logfeed.LogFeed`'s: on the chain this daemon relays on, the
chain follower's ``RetirementSettled`` of the same range come in the same ``eth_getLogs``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from relayer.chain import codec
from relayer.chain.blocks import BlockReader, _bytes, _int, _parsed, _settled
from relayer.chain.logfeed import pick
from relayer.chain.node import ChainNode
from relayer.chain.types import SettledLog
from relayer.domain.marketplace import CreditRegistration, ListingEvent, Transfer

_CREATED: Final = codec.event("Marketplace", "ListingCreated")
_UPDATED: Final = codec.event("Marketplace", "ListingUpdated")
_FILLED: Final = codec.event("Marketplace", "ListingFilled")
_CANCELLED: Final = codec.event("Marketplace", "ListingCancelled")
_REGISTERED: Final = codec.event("CarbonCredits", "CreditRegistered").with_strings_as_bytes()
_SINGLE: Final = codec.event("CarbonCredits", "TransferSingle")
_BATCH: Final = codec.event("CarbonCredits", "TransferBatch")
_SETTLED: Final = codec.event("RetirementSettlement", "RetirementSettled")

MAX_TRANSFER_BATCH: Final = 256
"""Ids in one TransferBatch the indexer keeps (a longer batch is not one of the protocol's)."""


@dataclass(slots=True)
class CatalogueLogs:
    """What one range of blocks holds for the catalogue, each list in chain order, listing
    events and transfers stamped with their blocks' timestamps; ``block_hashes`` maps each
    block holding one of the logs read to its hash (what the indexer remembers of them)."""

    listings: list[ListingEvent] = field(default_factory=list)
    credits: list[CreditRegistration] = field(default_factory=list)
    transfers: list[tuple[int, Transfer]] = field(default_factory=list)  # (token id, transfer)
    settled: list[SettledLog] = field(default_factory=list)
    block_hashes: dict[int, bytes] = field(default_factory=dict)


class CatalogueChain:
    """Catalogue reads of one chain. Every method raises ``ChainUnavailable`` when the node
    fails or answers a malformed log."""

    def __init__(self, node: ChainNode, *, settlement: bool) -> None:
        self.node = node
        self.blocks = BlockReader(node)
        self.with_settlement = settlement
        contracts = node.contracts
        topics = [_CREATED, _UPDATED, _FILLED, _CANCELLED, _REGISTERED, _SINGLE, _BATCH]
        self._pairs = node.logs.want([contracts.marketplace], [t.topic for t in topics[:4]])
        self._pairs |= node.logs.want([contracts.carbon_credits], [t.topic for t in topics[4:]])
        if settlement:
            self._pairs |= node.logs.want([contracts.settlement], [_SETTLED.topic])

    async def logs(self, from_block: int, to_block: int, to_hash: bytes | None = None) -> CatalogueLogs:
        """Events of the range (one ``eth_getLogs``, shared with the chain follower's read of
        the same range when ``to_hash``, the hash of ``to_block`` on the chain the caller
        follows, is given; plus one ``eth_getBlockByNumber`` per block holding a listing event
        or a transfer whose logs carry no ``blockTimestamp``, for its timestamp)."""
        contracts = self.node.contracts
        entries = _parsed(
            lambda es: pick(es, self._pairs),
            await self.node.logs.read(self._pairs, from_block, to_block, to_hash),
        )
        raw = _parsed(
            lambda es: [_decode(e, contracts.marketplace, contracts.carbon_credits) for e in es], entries
        )
        carried = _parsed(
            lambda es: {
                _int(e["blockNumber"]): _int(e["blockTimestamp"])
                for e in es
                if e.get("blockTimestamp") is not None
            },
            entries,
        )
        stamps_needed = {r[1] for r in raw if r[0] != "settled"} - carried.keys()
        stamps = carried | (await self.blocks.block_timestamps(stamps_needed) if stamps_needed else {})
        out = CatalogueLogs(
            block_hashes=_parsed(
                lambda es: {_int(e["blockNumber"]): _bytes(e["blockHash"], 32) for e in es}, entries
            )
        )
        for kind, block, log_index, value in raw:
            if kind == "listing":
                kind_, listing_id, data, tx_hash = value
                out.listings.append(
                    ListingEvent(listing_id, kind_, data, block, stamps[block], log_index, tx_hash)
                )
            elif kind == "credit":
                out.credits.append(value)
            elif kind == "transfer":
                for batch_index, (tx_hash, sender, receiver, token_id, amount) in enumerate(value):
                    transfer = Transfer(
                        block, log_index, batch_index, tx_hash, stamps[block], sender, receiver, amount
                    )
                    out.transfers.append((token_id, transfer))
            elif kind == "settled" and self.with_settlement:
                out.settled.append(value)
        return out


def _decode(entry: Any, marketplace: str, credits: str) -> tuple[str, int, int, Any]:
    """(kind, block, log index, decoded value) of one log; ("other", ...) for a log of another
    event or contract that matched nothing we index."""
    topics = [_bytes(t, 32) for t in entry["topics"]]
    data = _bytes(entry["data"])
    block, log_index = _int(entry["blockNumber"]), _int(entry["logIndex"])
    address = str(entry["address"]).lower()
    topic = topics[0] if topics else b""
    decoded: Any
    if address == marketplace.lower():
        decoded = _listing(topic, topics, data)
        if decoded is None:
            return ("other", block, log_index, None)
        return ("listing", block, log_index, (*decoded, _bytes(entry["transactionHash"], 32)))
    if address == credits.lower():
        if topic == _REGISTERED.topic:
            (token_id,), (project, vintage, registry) = _REGISTERED.decode(topics, data)
            registration = CreditRegistration(
                int(token_id), _text(project), int(vintage), _text(registry), block
            )
            return ("credit", block, log_index, registration)
        tx_hash = _bytes(entry["transactionHash"], 32)
        if topic == _SINGLE.topic:
            (_, sender, receiver), (token_id, amount) = _SINGLE.decode(topics, data)
            return ("transfer", block, log_index, [(tx_hash, sender, receiver, int(token_id), int(amount))])
        if topic == _BATCH.topic:
            (_, sender, receiver), (ids, amounts) = _BATCH.decode(topics, data)
            if len(ids) != len(amounts) or len(ids) > MAX_TRANSFER_BATCH:
                raise ValueError("malformed TransferBatch")
            moves = [(tx_hash, sender, receiver, int(i), int(a)) for i, a in zip(ids, amounts, strict=True)]
            return ("transfer", block, log_index, moves)
        return ("other", block, log_index, None)
    if topic == _SETTLED.topic:
        return ("settled", block, log_index, _settled(entry))
    return ("other", block, log_index, None)


ListingKind = Literal["created", "updated", "filled", "cancelled"]


def _listing(
    topic: bytes, topics: list[bytes], data: bytes
) -> tuple[ListingKind, int, dict[str, Any]] | None:
    if topic == _CREATED.topic:
        (listing_id, seller), (token, token_id, amount, price, min_fill, expiration) = _CREATED.decode(
            topics, data
        )
        return (
            "created",
            int(listing_id),
            {
                "seller": seller,
                "creditToken": token,
                "tokenId": int(token_id),
                "amount": int(amount),
                "unitPrice": int(price),
                "minFill": int(min_fill),
                "expiration": int(expiration),
            },
        )
    if topic == _UPDATED.topic:
        (listing_id,), (price, min_fill, expiration) = _UPDATED.decode(topics, data)
        return (
            "updated",
            int(listing_id),
            {"unitPrice": int(price), "minFill": int(min_fill), "expiration": int(expiration)},
        )
    if topic == _FILLED.topic:
        (listing_id, buyer), (amount, cost) = _FILLED.decode(topics, data)
        return ("filled", int(listing_id), {"buyer": buyer, "amount": int(amount), "cost": int(cost)})
    if topic == _CANCELLED.topic:
        (listing_id,), () = _CANCELLED.decode(topics, data)
        return ("cancelled", int(listing_id), {})
    return None


def _text(raw: bytes) -> str:
    """A string field decoded as bytes: UTF-8 with replacement, at most 200 characters."""
    return bytes(raw).decode("utf-8", errors="replace")[:200]
