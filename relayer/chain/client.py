"""Every web3 call of the daemon: contract reads, simulation with custom-error decoding,
EIP-1559 fee estimation, broadcast, block receipts and retirement logs.

Policy: constant facts (chain id, fee schedule, credit metadata) are read once and cached;
web3 exceptions are translated at this boundary (:class:`ChainRevert`,
:class:`ChainUnavailable`) so nothing above imports web3.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import aiohttp
from eth_utils.address import to_checksum_address
from web3 import AsyncWeb3
from web3.types import RPCEndpoint

from relayer.chain.abi import abi, decode_revert
from relayer.chain.transport import KeepAliveHTTPProvider
from relayer.domain.fees import FeeSchedule, PoolReserves
from relayer.domain.retirement import Retirement

log = logging.getLogger(__name__)
T = TypeVar("T")
LISTING_PAGE: Final = 200

CONTRACT_KEYS: Final = {
    "usdc": "UsdcEip3009",
    "kvcm": "KlimaVcm",
    "carbonCredits": "CarbonCredits",
    "carbonClasses": "CarbonClasses",
    "pool": "UsdcKvcmPool",
    "marketplace": "Marketplace",
    "settlement": "RetirementSettlement",
}


class ChainError(Exception):
    """Root of the chain layer's errors."""


class ChainUnavailable(ChainError):
    """The node could not be reached or answered with a non-revert error (transient)."""


class ChainRevert(ChainError):
    """A call or gas estimate reverted; ``info`` is ``{selector, decoded, contract}``."""

    def __init__(self, info: dict[str, Any], function: str | None = None) -> None:
        self.info = {**info, "function": function}
        super().__init__(f"reverted: {info.get('decoded', {}).get('errorName')}")


@dataclass(frozen=True, slots=True)
class CreditInfo:
    token_id: int
    project_id: str
    vintage: int
    registry: str
    whole_tonnes_only: bool
    requires_consumption_metadata: bool


@dataclass(frozen=True, slots=True)
class ClassInfo:
    """A carbon class: price in kVCM atomic units per tonne, minimum in credit units, and
    ``credits`` as (token id, credit units available)."""

    class_id: int
    symbol: str
    name: str
    price_kvcm_per_tonne: int
    min_retirement_units: int
    credits: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class ListingInfo:
    """A marketplace listing: ``unit_price`` in USDC atomic units per tonne, amounts in
    credit units, ``expiration`` unix seconds."""

    listing_id: int
    seller: str
    credit_token: str
    token_id: int
    unit_price: int
    total_amount: int
    left_to_sell: int
    min_fill: int
    expiration: int
    active: bool


@dataclass(frozen=True, slots=True)
class Receipt:
    tx_hash: bytes
    block_number: int
    block_hash: bytes
    status: int
    gas_used: int


@dataclass(frozen=True, slots=True)
class SettledLog:
    """A decoded RetirementSettled event."""

    tx_hash: bytes
    block_number: int
    block_hash: bytes
    log_index: int
    payer: str
    beneficiary: str
    retirement_index: int
    value: int
    fee: int
    retirement_cost: int
    refunded: int
    authorization_nonce: bytes
    retirement: dict[str, Any]


def _hexbytes(value: Any) -> bytes:
    return bytes(value)


class ChainClient:
    """Async access to the reference protocol on one chain."""

    def __init__(
        self,
        rpc_url: str,
        chain_id: int,
        addresses: dict[str, str],
        timeout_s: float = 10.0,
        read_ttl_s: float = 1.0,
    ) -> None:
        self.chain_id = chain_id
        self.addresses = {k: str(to_checksum_address(v)) for k, v in addresses.items() if k in CONTRACT_KEYS}
        missing = set(CONTRACT_KEYS) - set(self.addresses)
        if missing:
            raise ValueError(f"deployment lacks contract addresses: {sorted(missing)}")
        # No default middleware: the validation middleware asks eth_chainId on every call,
        # and the chain id is checked once in check() instead.
        self.w3 = AsyncWeb3(KeepAliveHTTPProvider(rpc_url, timeout_s), middleware=[])
        self.contracts = {
            key: self.w3.eth.contract(address=self.addresses[key], abi=abi(name))  # type: ignore[call-overload]
            for key, name in CONTRACT_KEYS.items()
        }
        self._credits: dict[int, CreditInfo] = {}
        self._settled_event = self.contracts["settlement"].events.RetirementSettled()
        # Reads of mutable state (classes, listings, reserves, base fee) are cached per head:
        # an entry is good while the head is unchanged and for at most read_ttl_s seconds.
        self.read_ttl_s = read_ttl_s
        self._head: int | None = None
        self._reads: dict[str, tuple[int | None, float, Any]] = {}

    def observe_head(self, number: int) -> None:
        """A new head was seen: drop every cached read of mutable state."""
        if number != self._head:
            self._head = number
            self._reads.clear()

    async def _cached(self, key: str, load: Callable[[], Awaitable[T]]) -> T:
        """Single-flight read cache: concurrent callers share one load per head and TTL."""
        now = time.monotonic()
        hit = self._reads.get(key)
        if hit is not None and hit[0] == self._head and now - hit[1] < self.read_ttl_s:
            shared: asyncio.Future[T] = hit[2]
            return await asyncio.shield(shared)
        task: asyncio.Future[T] = asyncio.ensure_future(load())
        self._reads[key] = (self._head, now, task)
        try:
            return await asyncio.shield(task)
        except BaseException:
            if self._reads.get(key, (None, 0.0, None))[2] is task:
                del self._reads[key]
            raise

    # ------------------------------------------------------------------ life cycle

    async def check(self) -> None:
        """Verify the node serves the configured chain id (raises ChainUnavailable)."""
        got = await self._rpc(self.w3.eth.chain_id)
        if int(got) != self.chain_id:
            raise ChainUnavailable(f"node serves chain {got}, configured {self.chain_id}")

    async def close(self) -> None:
        await self.w3.provider.disconnect()

    async def _rpc(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except ChainError:
            raise
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            raise ChainUnavailable(f"RPC unavailable: {type(exc).__name__}") from None
        except Exception as exc:
            data = getattr(exc, "data", None)
            if isinstance(data, str) and data.startswith("0x"):
                raise ChainRevert(decode_revert(bytes.fromhex(data[2:]))) from None
            raise ChainUnavailable(f"RPC error: {type(exc).__name__}") from None

    async def _call(self, contract: str, function: str, *args: Any) -> Any:
        fn = getattr(self.contracts[contract].functions, function)(*args)
        return await self._rpc(fn.call())

    # ------------------------------------------------------------------ reads

    async def fee_schedule(self) -> FeeSchedule:
        """The settlement's protocol fees (cached per head: the owner may change them)."""

        async def load() -> FeeSchedule:
            bps_c, floor_c, bps_l, floor_l = await self._call("settlement", "fees")
            return FeeSchedule(int(bps_c), int(floor_c), int(bps_l), int(floor_l))

        return await self._cached("fees", load)

    async def reserves(self) -> PoolReserves:
        async def load() -> PoolReserves:
            usdc, kvcm = await self._call("pool", "getReserves")
            return PoolReserves(int(usdc), int(kvcm))

        return await self._cached("reserves", load)

    async def credit(self, token_id: int) -> CreditInfo:
        """Credit metadata (cached: it never changes)."""
        cached = self._credits.get(token_id)
        if cached is None:
            project, vintage, registry, whole, meta = await self._call(
                "carbonCredits", "creditInfo", token_id
            )
            cached = CreditInfo(token_id, project, int(vintage), registry, bool(whole), bool(meta))
            self._credits[token_id] = cached
        return cached

    async def classes(self) -> list[ClassInfo]:
        """All carbon classes with their credits' liquidity (cached per head)."""
        return await self._cached("classes", self._load_classes)

    async def _load_classes(self) -> list[ClassInfo]:
        infos, token_ids, available = await self._call("carbonClasses", "allClasses")
        return [
            ClassInfo(
                class_id=i + 1,
                symbol=info[0],
                name=info[1],
                price_kvcm_per_tonne=int(info[2]),
                min_retirement_units=int(info[3]),
                credits=tuple((int(t), int(a)) for t, a in zip(ids, avail, strict=True)),
            )
            for i, (info, ids, avail) in enumerate(zip(infos, token_ids, available, strict=True))
        ]

    async def listing(self, listing_id: int) -> ListingInfo | None:
        """A listing, or None when no listing has this id (cached per head)."""
        return await self._cached(f"listing:{listing_id}", lambda: self._load_listing(listing_id))

    async def _load_listing(self, listing_id: int) -> ListingInfo | None:
        try:
            raw = await self._call("marketplace", "getListing", listing_id)
        except ChainRevert as exc:
            if exc.info["decoded"]["errorName"] == "ListingNotFound":
                return None
            raise
        return _listing(listing_id, raw)

    async def listings(self) -> list[ListingInfo]:
        """All listings (cached per head)."""
        return await self._cached("listings", self._load_listings)

    async def _load_listings(self) -> list[ListingInfo]:
        out: list[ListingInfo] = []
        while True:  # bounded by listingCount: each page moves `first` forward or ends
            page = await self._call("marketplace", "getListings", len(out) + 1, LISTING_PAGE)
            out.extend(_listing(len(out) + i + 1, raw) for i, raw in enumerate(page))
            if len(page) < LISTING_PAGE:
                return out

    async def permit_nonce(self, owner: str) -> int:
        return int(await self._call("kvcm", "nonces", owner))

    async def authorization_used(self, authorizer: str, nonce: bytes) -> bool:
        """EIP-3009 authorizationState: the chain's own single-use guard."""
        return bool(await self._call("usdc", "authorizationState", authorizer, nonce))

    async def token_balance(self, token: str, owner: str) -> int:
        return int(await self._call(token, "balanceOf", owner))

    async def eth_balance(self, address: str) -> int:
        return int(await self._rpc(self.w3.eth.get_balance(to_checksum_address(address))))

    async def chain_hash_retirement(self, retirement: Retirement, salt: bytes) -> bytes:
        """The settlement's own authorizationNonce(r, salt) (a cross-check for tests)."""
        return bytes(await self._call("settlement", "authorizationNonce", retirement.as_tuple(), salt))

    # ------------------------------------------------------------------ encoding

    def encode(self, contract: str, function: str, *args: Any) -> bytes:
        data = self.contracts[contract].encode_abi(function, args=list(args))
        return bytes.fromhex(data[2:])

    # ------------------------------------------------------------------ executor side

    async def estimate_gas(self, sender: str, to: str, data: bytes, function: str | None = None) -> int:
        """Simulate the call and return its gas (one ``eth_estimateGas``).

        Raises:
            ChainRevert: the simulation reverted (decoded custom error).
            ChainUnavailable: the node did not answer.
        """
        params = {"from": sender, "to": to, "data": "0x" + data.hex()}
        try:
            response = await self.w3.provider.make_request(RPCEndpoint("eth_estimateGas"), [params])
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            raise ChainUnavailable(f"RPC unavailable: {type(exc).__name__}") from None
        error = response.get("error")
        if error:
            err_data = error.get("data") if isinstance(error, dict) else None
            if isinstance(err_data, str) and err_data.startswith("0x") and len(err_data) >= 10:
                raise ChainRevert(decode_revert(bytes.fromhex(err_data[2:])), function)
            message = str(error.get("message", "")) if isinstance(error, dict) else str(error)
            if "revert" in message.lower():
                raise ChainRevert(
                    {
                        "selector": None,
                        "decoded": {"errorName": None, "args": {}},
                        "contract": None,
                        "reason": message[:200],
                    },
                    function,
                )
            raise ChainUnavailable("gas estimation failed")
        return int(response["result"], 16)

    async def base_fee(self) -> int:
        """Base fee per gas of the latest block (wei; cached per head)."""

        async def load() -> int:
            block = await self._rpc(self.w3.eth.get_block("latest"))
            return int(block.get("baseFeePerGas", 0))

        return await self._cached("base_fee", load)

    async def pending_nonce(self, address: str) -> int:
        return int(
            await self._rpc(self.w3.eth.get_transaction_count(to_checksum_address(address), "pending"))
        )

    async def send_raw(self, raw: bytes) -> str:
        """Broadcast signed bytes. Returns "sent", "known" (the node already has it) or
        "stale" (its nonce is already used on-chain: mined earlier or replaced).

        Raises:
            ChainUnavailable: any other failure (retry later with the same bytes).
        """
        try:
            response = await self.w3.provider.make_request(
                RPCEndpoint("eth_sendRawTransaction"), ["0x" + raw.hex()]
            )
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            raise ChainUnavailable(f"RPC unavailable: {type(exc).__name__}") from None
        error = response.get("error")
        if not error:
            return "sent"
        message = str(error.get("message", "") if isinstance(error, dict) else error).lower()
        if "already known" in message or "already imported" in message:
            return "known"
        if "nonce too low" in message:
            return "stale"
        raise ChainUnavailable(f"broadcast refused: {message[:120]}")

    async def head(self) -> int:
        """Latest block number; a change drops the cached reads."""
        number = int(await self._rpc(self.w3.eth.block_number))
        self.observe_head(number)
        return number

    async def block_hash(self, number: int) -> bytes:
        block = await self._rpc(self.w3.eth.get_block(number))
        return _hexbytes(block["hash"])

    async def block_receipts(self, number: int) -> list[Receipt]:
        """All receipts of one block (one ``eth_getBlockReceipts``)."""
        receipts = await self._rpc(self.w3.eth.get_block_receipts(number))
        return [
            Receipt(
                tx_hash=_hexbytes(r["transactionHash"]),
                block_number=int(r["blockNumber"]),
                block_hash=_hexbytes(r["blockHash"]),
                status=int(r["status"]),
                gas_used=int(r["gasUsed"]),
            )
            for r in receipts
        ]

    async def settled_logs(self, from_block: int, to_block: int) -> list[SettledLog]:
        """RetirementSettled events of the settlement in a block range (one ``eth_getLogs``)."""
        topic = self._settled_event.topic
        logs = await self._rpc(
            self.w3.eth.get_logs(
                {
                    "address": to_checksum_address(self.addresses["settlement"]),
                    "fromBlock": from_block,
                    "toBlock": to_block,
                    "topics": [topic],
                }
            )
        )
        out = []
        for entry in logs:
            ev = self._settled_event.process_log(entry)
            args = ev["args"]
            out.append(
                SettledLog(
                    tx_hash=_hexbytes(ev["transactionHash"]),
                    block_number=int(ev["blockNumber"]),
                    block_hash=_hexbytes(ev["blockHash"]),
                    log_index=int(ev["logIndex"]),
                    payer=args["payer"],
                    beneficiary=args["beneficiary"],
                    retirement_index=int(args["retirementIndex"]),
                    value=int(args["value"]),
                    fee=int(args["fee"]),
                    retirement_cost=int(args["retirementCost"]),
                    refunded=int(args["refunded"]),
                    authorization_nonce=bytes(args["authorizationNonce"]),
                    retirement=dict(args["retirement"]),
                )
            )
        return out

    async def block_timestamps(self, numbers: set[int]) -> dict[int, int]:
        blocks = await asyncio.gather(*(self._rpc(self.w3.eth.get_block(n)) for n in sorted(numbers)))
        return {int(b["number"]): int(b["timestamp"]) for b in blocks}


def _listing(listing_id: int, raw: Any) -> ListingInfo:
    seller, token, token_id, price, total, left, min_fill, expiration, active = raw
    return ListingInfo(
        listing_id=listing_id,
        seller=seller,
        credit_token=token,
        token_id=int(token_id),
        unit_price=int(price),
        total_amount=int(total),
        left_to_sell=int(left),
        min_fill=int(min_fill),
        expiration=int(expiration),
        active=bool(active),
    )
