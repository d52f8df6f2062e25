"""Catalogue and token reads: carbon classes, listings, credits, pool reserves, the fee
schedule, permit nonces and EIP-3009 authorization state. Mutable state is cached per head
(see :meth:`ChainNode.cached`), the executors' ETH balances for :data:`ETH_BALANCE_MAX_AGE_S`;
credit metadata never changes and is cached for good."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from eth_abi.exceptions import DecodingError

from relayer.chain import codec
from relayer.chain.errors import ChainRevert, ChainUnavailable
from relayer.chain.node import ChainNode
from relayer.chain.types import ClassInfo, CreditInfo, TokenBalance
from relayer.domain.fees import FeeSchedule, PoolReserves
from relayer.domain.marketplace import ListingInfo
from relayer.domain.proof import (
    AUTHORIZATION_USED_TOPIC,
    TRANSFER_TOPIC,
    Evidence,
    TokenLog,
    TransferClaim,
    address_topic,
    find_proof,
)

LISTING_PAGE: Final = 200
ETH_BALANCE_MAX_AGE_S: Final = 2.0
"""Longest an executor's ETH balance is reused, seconds, across heads: the floor it is checked
against (``min_executor_balance_wei``) is a margin of many transactions' gas, and a lane spends
little of it in this time."""

_FEES: Final = codec.function("RetirementSettlement", "fees")
_RESERVES: Final = codec.function("UsdcKvcmPool", "getReserves")
_CREDIT_INFO: Final = codec.function("CarbonCredits", "creditInfo")
_ALL_CLASSES: Final = codec.function("CarbonClasses", "allClasses")
_GET_LISTING: Final = codec.function("Marketplace", "getListing")
_GET_LISTINGS: Final = codec.function("Marketplace", "getListings")
_NONCES: Final = codec.function("KlimaVcm", "nonces")
_AUTHORIZATION_STATE: Final = codec.function("UsdcEip3009", "authorizationState")
_BALANCE_OF: Final = codec.function("UsdcEip3009", "balanceOf")  # ERC-20: the same for kVCM
LOG_RANGE_MAX: Final = 10_000
"""Most blocks one ``eth_getLogs`` of a proof read spans (what public nodes take)."""
PROOF_SPAN_MAX: Final = 1_000_000
"""Most blocks a proof read searches, back from its head (about 55 hours of Base blocks, 100
``eth_getLogs`` in one batch): a payment is judged within minutes of its ``validBefore``, and
a use older than this is not found (the payment is not proven)."""


@dataclass(frozen=True, slots=True)
class TransferPreview:
    """A token transfer tried without sending it: the payer's ``balance`` (atomic units) and
    the call's ``revert`` (None when it would succeed)."""

    balance: int
    revert: ChainRevert | None


@dataclass(frozen=True, slots=True)
class StateNow:
    """State the re-check before signing reads, all at one block (``block``, the latest when
    read): token balances by (token, owner) in atomic units, listings by id (None: no such
    listing), and the classes (None when not asked)."""

    block: int
    balances: dict[tuple[str, str], int]
    listings: dict[int, ListingInfo | None]
    classes: list[ClassInfo] | None


class ChainReads:
    """Reads of the protocol's state for discovery, quotes and prepare-auth.

    Every method raises ``ChainUnavailable`` when the node fails, and ``ChainRevert`` when a
    read reverts unexpectedly.
    """

    def __init__(self, node: ChainNode) -> None:
        self.node = node
        self.contracts = node.contracts
        self._credits: dict[int, CreditInfo] = {}
        self._reading_credits: dict[int, asyncio.Future[CreditInfo]] = {}  # at most one read a credit
        self._classes_memo: tuple[tuple[Any, ...], list[ClassInfo]] | None = None

    async def fee_schedule(self) -> FeeSchedule:
        """The settlement's protocol fees (cached per head: the owner may change them)."""

        (class_bps, class_floor, listing_bps, listing_floor), _block = await self.node.cached_view(
            "fees", self.contracts.settlement, _FEES
        )
        return FeeSchedule(int(class_bps), int(class_floor), int(listing_bps), int(listing_floor))

    async def reserves(self) -> PoolReserves:
        """USDC/kVCM pool reserves, atomic units (cached per head)."""

        (usdc, kvcm), _block = await self.node.cached_view("reserves", self.contracts.pool, _RESERVES)
        return PoolReserves(int(usdc), int(kvcm))

    def reserves_fresh(self) -> bool:
        """Whether :meth:`reserves` is cached and current: awaiting it costs no round trip."""
        return self.node.fresh("reserves")

    def pricing_fresh(self) -> bool:
        """Whether :meth:`reserves` and :meth:`fee_schedule` (what a quote reads at the head)
        are cached and current: awaiting them costs no round trip."""
        return self.node.fresh("reserves", "fees")

    def catalog_fresh(self) -> bool:
        """Whether the catalogue's per-head reads (classes, listings, pool reserves, fee
        schedule) are cached and current (see :meth:`ChainNode.fresh`)."""
        return self.node.fresh("classes", "listings", "reserves", "fees")

    async def credits(self, token_ids: Sequence[int]) -> list[CreditInfo]:
        """:meth:`credit` of each id, in order: the unknown ones read concurrently, the
        known ones (all of them, once warm) without a task or a round trip."""
        known = [self._credits.get(t) for t in token_ids]
        if all(c is not None for c in known):
            return [c for c in known if c is not None]
        return list(await asyncio.gather(*(self.credit(t) for t in token_ids)))

    async def credit(self, token_id: int) -> CreditInfo:
        """Credit metadata (cached for good: it never changes); concurrent readers of a
        credit not yet known share one ``eth_call`` (a burst of requests at start-up read it
        once, not once each)."""
        cached = self._credits.get(token_id)
        if cached is not None:
            return cached
        reading = self._reading_credits.get(token_id)
        if reading is None:
            reading = asyncio.ensure_future(self._read_credit(token_id))
            self._reading_credits[token_id] = reading
        return await asyncio.shield(reading)

    async def _read_credit(self, token_id: int) -> CreditInfo:
        try:
            project, vintage, registry, whole, meta = await self.node.call(
                self.contracts.carbon_credits, _CREDIT_INFO, token_id
            )
            info = CreditInfo(token_id, str(project), int(vintage), str(registry), bool(whole), bool(meta))
            self._credits[token_id] = info
            return info
        finally:
            self._reading_credits.pop(token_id, None)

    async def classes(self, *, block: int | None = None) -> list[ClassInfo]:
        """All carbon classes with their credits' liquidity (cached per head and read with the
        block's other per-head reads; at ``block`` when given, cached per head and block)."""
        if block is None:
            return (await self.classes_at())[0]

        async def load() -> list[ClassInfo]:
            outputs = await self.node.views.call(self.contracts.carbon_classes, _ALL_CLASSES, block=block)
            return _classes(outputs)

        return await self.node.cached(f"classes@{block}", load)

    async def classes_at(self) -> tuple[list[ClassInfo], int]:
        """:meth:`classes` at the latest block (cached per head) and the number of the block
        they were read at."""
        outputs, block = await self.node.cached_view("classes", self.contracts.carbon_classes, _ALL_CLASSES)
        memo = self._classes_memo
        if memo is None or memo[0] is not outputs:
            memo = self._classes_memo = (outputs, _classes(outputs))
        return memo[1], block

    async def listing(self, listing_id: int, *, block: int | None = None) -> ListingInfo | None:
        """A listing, or None when no listing has this id (cached per head; at ``block`` when
        given, cached per head and block)."""

        async def load() -> ListingInfo | None:
            try:
                (raw,) = await self.node.views.call(
                    self.contracts.marketplace, _GET_LISTING, listing_id, block=block
                )
            except ChainRevert as exc:
                if exc.error_name == "ListingNotFound":
                    return None
                raise
            return _listing(listing_id, raw)

        key = f"listing:{listing_id}" if block is None else f"listing:{listing_id}@{block}"
        return await self.node.cached(key, load)

    async def listings(self) -> list[ListingInfo]:
        """All listings (cached per head)."""

        async def load() -> list[ListingInfo]:
            out: list[ListingInfo] = []
            while True:  # bounded by listingCount: each page moves `first` forward or ends
                first = len(out) + 1  # the page's first id (not len(out) while extending)
                (page,) = await self.node.call(self.contracts.marketplace, _GET_LISTINGS, first, LISTING_PAGE)
                out.extend(_listing(first + i, raw) for i, raw in enumerate(page))
                if len(page) < LISTING_PAGE:
                    return out

        return await self.node.cached("listings", load)

    async def state_now(
        self,
        balances: Sequence[tuple[str, str]],
        listing_ids: Sequence[int],
        classes: bool,
        block: int | None = None,
    ) -> StateNow:
        """The balances of ``balances`` (token, owner), the listings ``listing_ids`` and (when
        ``classes``) the classes, all at ``block`` (None: the latest block now) and with its
        number: one Multicall3 ``eth_call`` (:class:`~relayer.chain.multicall.Views`), past
        the cache.

        Raises:
            ChainUnavailable: the node failed, or the reads did not come from one block.
            ChainRevert: a read reverted unexpectedly.
        """
        views = self.node.views
        wanted = list(dict.fromkeys(balances))
        ids = list(dict.fromkeys(listing_ids))
        answers = await asyncio.gather(
            *(views.call_at(token, _BALANCE_OF, owner, block=block) for token, owner in wanted),
            *(views.call_at(self.contracts.marketplace, _GET_LISTING, i, block=block) for i in ids),
            *([views.call_at(self.contracts.carbon_classes, _ALL_CLASSES, block=block)] if classes else []),
            return_exceptions=True,
        )
        blocks: set[int] = set()
        listings: dict[int, ListingInfo | None] = {}
        for i, answer in zip(ids, answers[len(wanted) : len(wanted) + len(ids)], strict=True):
            if isinstance(answer, ChainRevert) and answer.error_name == "ListingNotFound":
                listings[i] = None
                continue
            if isinstance(answer, BaseException):
                raise answer
            blocks.add(answer[1])
            listings[i] = _listing(i, answer[0][0])
        held: dict[tuple[str, str], int] = {}
        for key, answer in zip(wanted, answers[: len(wanted)], strict=True):
            if isinstance(answer, BaseException):
                raise answer
            blocks.add(answer[1])
            held[key] = int(answer[0][0])
        found: list[ClassInfo] | None = None
        if classes:
            last = answers[-1]
            if isinstance(last, BaseException):
                raise last
            blocks.add(last[1])
            found = _classes(last[0])
        if len(blocks) > 1:
            raise ChainUnavailable(detail="the re-check's reads came from more than one block")
        if blocks:
            block = blocks.pop()
        elif block is None:
            block = await self.latest_block()
        return StateNow(block, held, listings, found)

    async def permit_nonce(self, owner: str) -> int:
        """The kVCM EIP-2612 nonce ``owner`` signs its next permit with (not cached)."""
        (nonce,) = await self.node.call(self.contracts.kvcm, _NONCES, owner)
        return int(nonce)

    async def latest_block(self) -> int:
        """The chain's latest block number now, past the per-head cache (``eth_blockNumber``);
        the node observes it, so the per-head reads that follow are at least at this head.

        Raises:
            ChainUnavailable: the node failed.
        """
        return await self.node.latest_head()

    async def balance(
        self, token: str, owner: str, *, fresh: bool = False, block: int | None = None
    ) -> TokenBalance:
        """``owner``'s balance of the ERC-20 ``token`` (atomic units) and the block it was
        read at: at ``block`` when given; else cached per head and owner (one ``eth_call``
        per payer per block); ``fresh`` reads the chain's latest block now, past the cache.

        Raises:
            ChainUnavailable: the node failed.
        """
        if fresh and block is None:
            block = await self.latest_block()
        if block is not None:
            (amount,) = await self.node.views.call(token, _BALANCE_OF, owner, block=block)
            return TokenBalance(int(amount), block)
        block = await self.node.head()

        async def load() -> TokenBalance:
            (amount,) = await self.node.call(token, _BALANCE_OF, owner, block=block)
            return TokenBalance(int(amount), block)

        return await self.node.cached(_balance_key(token, owner, block), load)

    async def cached_balance(self, token: str, owner: str) -> TokenBalance | None:
        """``owner``'s balance of ``token`` as :meth:`balance` already read it at the cached
        head, or None when it has not: no round trip either way."""
        if not self.node.head_fresh():
            return None
        block = await self.node.head()
        if not self.node.fresh(_balance_key(token, owner, block)):
            return None
        return await self.balance(token, owner)

    async def balance_latest(self, token: str, owner: str) -> TokenBalance:
        """``owner``'s balance of ``token`` (atomic units) at the node's latest block now, past
        the cache, with that block's number: the balances asked together share one
        ``eth_call`` with the block's other reads at the latest block (Multicall3, see
        :class:`~relayer.chain.multicall.Views`).

        Raises:
            ChainUnavailable: the node failed.
        """
        try:
            (amount,), block = await self.node.views.call_at(token, _BALANCE_OF, owner)
        except ChainRevert:
            raise ChainUnavailable(detail="balanceOf answered no balance") from None
        return TokenBalance(int(amount), block)

    async def balance_now(self, token: str, owner: str) -> int:
        """``owner``'s balance of ``token`` (atomic units) at the node's latest block now, past
        the cache: one ``eth_call``, whose block number is not known (enough to refuse).

        Raises:
            ChainUnavailable: the node failed.
        """
        (amount,) = await self.node.call(token, _BALANCE_OF, owner)
        return int(amount)

    async def eth_balance(self, account: str) -> int:
        """``account``'s ETH balance in wei at the latest block, read at most once every
        :data:`ETH_BALANCE_MAX_AGE_S` for the process (the accept path's and each lane's
        floor check and the gauges share it; a new head does not drop it).

        Raises:
            ChainUnavailable: the node failed.
        """

        async def load() -> int:
            return int(str(await self.node.answer("eth_getBalance", [account, "latest"])), 16)

        return await self.node.recent(f"eth:{account}", load, ETH_BALANCE_MAX_AGE_S)

    async def authorization_used(self, authorizer: str, nonce: bytes) -> bool:
        """USDC's EIP-3009 ``authorizationState``: the chain's own single-use guard."""
        return await self.authorization_state(self.contracts.usdc, authorizer, nonce)

    async def authorization_state(
        self, token: str, authorizer: str, nonce: bytes, *, block: int | None = None
    ) -> bool:
        """EIP-3009 ``authorizationState(authorizer, nonce)`` of ``token`` at ``block``
        (default: the latest block): whether that 32-byte nonce was used (or cancelled).

        Raises:
            ChainUnavailable: the node failed.
        """
        (used,) = await self.node.call(token, _AUTHORIZATION_STATE, authorizer, nonce, block=block)
        return bool(used)

    async def preview_transfer(
        self, token: str, owner: str, sender: str, call_data: bytes
    ) -> TransferPreview:
        """``owner``'s balance of ``token`` (atomic units) and one execution of ``call_data``
        on ``token`` from ``sender`` (``eth_call``), both at the latest block and sent as one
        JSON-RPC batch: one round trip (one by one on a node that takes no batches).

        Raises:
            ChainUnavailable: the node failed, or answered either call with an error that is
                not a revert (a revert of the call is the preview's ``revert``).
        """
        answers = await self.node.batch(
            [
                ("eth_call", [{"to": token, "data": "0x" + _BALANCE_OF.encode(owner).hex()}, "latest"]),
                ("eth_call", [{"from": sender, "to": token, "data": "0x" + call_data.hex()}, "latest"]),
            ]
        )
        held, run = answers
        try:
            (amount,) = _BALANCE_OF.decode(bytes.fromhex(str(held["result"])[2:]))
        except (KeyError, TypeError, ValueError, DecodingError):
            raise ChainUnavailable(detail="balanceOf answered no balance") from None
        return TransferPreview(int(amount), _revert_of(run))

    async def transfer_evidence(
        self, claim: TransferClaim, from_block: int, head: int, confirmed: int
    ) -> Evidence:
        """What the chain shows of ``claim`` at block ``head`` (see :mod:`relayer.domain.proof`),
        in one JSON-RPC batch (one round trip): the token's ``AuthorizationUsed(payer, nonce)``
        and ``Transfer(payer, pay_to)`` logs from ``from_block`` through ``head`` (one
        ``eth_getLogs`` by topics per :data:`LOG_RANGE_MAX` blocks, at most the newest
        :data:`PROOF_SPAN_MAX` blocks), the nonce's ``authorizationState`` at ``head`` and at
        ``confirmed`` (the confirmation policy's block; -1: none yet), and ``confirmed``'s
        timestamp. Logs the node marks ``removed`` are ignored.

        Raises:
            ChainUnavailable: the node failed, or answered any of the calls with an error or
                a malformed result.
        """
        token, payer = claim.token, claim.payer
        topics = [
            ["0x" + AUTHORIZATION_USED_TOPIC.hex(), "0x" + TRANSFER_TOPIC.hex()],
            "0x" + address_topic(payer).hex(),
            ["0x" + claim.nonce.hex(), "0x" + address_topic(claim.pay_to).hex()],
        ]
        low = max(0, from_block, head - PROOF_SPAN_MAX + 1)
        calls: list[tuple[str, list[Any]]] = []
        for start in range(low, head + 1, LOG_RANGE_MAX):
            end = min(head, start + LOG_RANGE_MAX - 1)
            query = {"address": token, "fromBlock": hex(start), "toBlock": hex(end), "topics": topics}
            calls.append(("eth_getLogs", [query]))
        state = "0x" + _AUTHORIZATION_STATE.encode(payer, claim.nonce).hex()
        searched = len(calls)
        calls.append(("eth_call", [{"to": token, "data": state}, hex(head)]))
        if confirmed >= 0:
            calls.append(("eth_call", [{"to": token, "data": state}, hex(confirmed)]))
            calls.append(("eth_getBlockByNumber", [hex(confirmed), False]))
        answers = await self.node.batch(calls)
        try:
            logs = [_token_log(e) for a in answers[:searched] for e in _result(a) if not e.get("removed")]
            used_at_head = _used(answers[searched])
            used_at_confirmed = confirmed >= 0 and _used(answers[searched + 1])
            block = _result(answers[searched + 2]) if confirmed >= 0 else None
            confirmed_time = None if block is None else int(str(block["timestamp"]), 16)
        except (KeyError, TypeError, ValueError, DecodingError) as exc:
            raise ChainUnavailable(detail=f"malformed answer to a proof read: {type(exc).__name__}") from None
        return Evidence(
            find_proof(logs, claim), head, confirmed, used_at_head, used_at_confirmed, confirmed_time
        )


def _result(answer: dict[str, Any]) -> Any:
    """A batch answer's ``result``.

    Raises:
        ChainUnavailable: the call answered an error.
    """
    if "error" in answer:
        error = answer["error"]
        message = str(error.get("message", "")) if isinstance(error, dict) else str(error)
        raise ChainUnavailable(detail=f"the node answered an error: {message[:120]}")
    return answer["result"]


def _used(answer: dict[str, Any]) -> bool:
    (used,) = _AUTHORIZATION_STATE.decode(bytes.fromhex(str(_result(answer))[2:]))
    return bool(used)


def _token_log(entry: dict[str, Any]) -> TokenLog:
    return TokenLog(
        address=str(entry["address"]).lower(),
        topics=tuple(bytes.fromhex(str(t)[2:]) for t in entry["topics"]),
        data=bytes.fromhex(str(entry["data"])[2:]),
        block_number=int(str(entry["blockNumber"]), 16),
        block_hash=bytes.fromhex(str(entry["blockHash"])[2:]),
        tx_hash=bytes.fromhex(str(entry["transactionHash"])[2:]),
        log_index=int(str(entry["logIndex"]), 16),
    )


def _revert_of(answer: dict[str, Any]) -> ChainRevert | None:
    """The revert a JSON-RPC ``eth_call`` answer reports (custom error decoded from its
    ``data``), or None when the call succeeded.

    Raises:
        ChainUnavailable: an error that is not a revert, or no result at all.
    """
    error = answer.get("error")
    if error is None:
        if not isinstance(answer.get("result"), str):
            raise ChainUnavailable(detail="eth_call answered no result")
        return None
    message = str(error.get("message", "")) if isinstance(error, dict) else str(error)
    data = error.get("data") if isinstance(error, dict) else None
    if isinstance(data, str) and re.fullmatch(r"0x(?:[0-9a-fA-F]{2})+", data):
        return ChainRevert(bytes.fromhex(data[2:]), "transferWithAuthorization", message)
    if "revert" in message.lower():
        return ChainRevert(None, "transferWithAuthorization", message)
    raise ChainUnavailable(detail=f"eth_call answered an error: {message[:120]}")


def _classes(outputs: tuple[Any, ...]) -> list[ClassInfo]:
    infos, token_ids, available = outputs
    return [
        ClassInfo(
            class_id=i + 1,
            symbol=str(info[0]),
            name=str(info[1]),
            price_kvcm_per_tonne=int(info[2]),
            min_retirement_units=int(info[3]),
            credits=tuple((int(t), int(a)) for t, a in zip(ids, avail, strict=True)),
        )
        for i, (info, ids, avail) in enumerate(zip(infos, token_ids, available, strict=True))
    ]


def _listing(listing_id: int, raw: Any) -> ListingInfo:
    seller, token, token_id, price, total, left, min_fill, expiration, active = raw
    return ListingInfo(
        listing_id=listing_id,
        seller=str(seller),
        credit_token=str(token),
        token_id=int(token_id),
        unit_price=int(price),
        total_amount=int(total),
        left_to_sell=int(left),
        min_fill=int(min_fill),
        expiration=int(expiration),
        active=bool(active),
    )


def _balance_key(token: str, owner: str, block: int) -> str:
    return f"balance:{token}:{owner}:{block}"
