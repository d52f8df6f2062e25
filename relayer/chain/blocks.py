"""The JSON-RPC block reader: heads (with their transaction hashes), headers by number (one
batch), the node's ``safe``/``finalized`` heads, block hashes, receipts by block (one
``eth_getBlockReceipts`` by block hash per block, one batch; one ``eth_getTransactionReceipt``
each on a node that refuses that method) and by transaction hash (one batch), an account's
nonce at a block, ``RetirementSettled`` logs (one ``eth_getLogs`` per range, shared with the
catalogue indexer's through the node's :class:`~relayer.chain.logfeed.LogFeed`, decoded with
the ABI codec into domain types) and block timestamps, for the chain follower and the
catalogue indexer. A new head clears the node's read cache.

The head is read once per ``node.head_every_s`` (the poll cadence) for every reader of the
node (:meth:`BlockReader.head_block`); the hash of that head and of its parent come with it,
and the tagged heads are read once per head."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final, TypeVar

from eth_abi.exceptions import DecodingError

from relayer.chain import calls, codec
from relayer.chain.abi_reader import AbiReader
from relayer.chain.errors import ChainUnavailable
from relayer.chain.logfeed import pick
from relayer.chain.node import ChainNode
from relayer.chain.types import BlockHeader, Receipt, SettledLog
from relayer.domain.confirmation import measured_block_time_ms

log = logging.getLogger(__name__)

BLOCK_RECEIPTS_REFUSALS: Final = frozenset({-32601, -32600, -32602})
"""JSON-RPC error codes that answer ``eth_getBlockReceipts`` with a refusal of the method as
asked, not a failure of the moment: -32601 (method not found: a node that predates it, e.g.
geth before 1.13, or a provider that does not serve it), -32600 (invalid request: how some
providers, Alchemy among them, refuse a method they do not serve) and -32602 (invalid params:
a node that takes only a block number there, not the block hash asked). The same call would
be refused again, so the reader falls back to one ``eth_getTransactionReceipt`` per
transaction for the rest of its life (the same guarantees, more calls). Any other error (a
lagging node's "header not found", a rate limit, a failed batch) is the node's failure of the
moment: the call fails and is asked again on the next step. A load balancer that mixes nodes
may refuse it on one backend only: then the process reads receipts one by one until it
restarts, which costs calls, never correctness."""

# Strings in the event are decoded as bytes (the same ABI encoding): anyone can settle a
# retirement whose details hold invalid UTF-8, and the index must still move past it.
_SETTLED: Final = codec.event("RetirementSettlement", "RetirementSettled").with_strings_as_bytes()


class BlockReader:
    """Block, receipt and log reads that follow the chain block by block, parsed straight from the node's JSON
    (only the fields they use; web3's result formatters cost more than the rest of the
    follower under load).

    Every method raises ``ChainUnavailable`` when the node fails or answers a malformed or
    missing block, receipt or log.
    """

    def __init__(self, node: ChainNode) -> None:
        self.node = node
        self.block_receipts_refused: dict[str, Any] | None = None
        """The node's refusal of ``eth_getBlockReceipts`` (its error object), once it refused:
        from then on :meth:`receipts_in` reads one receipt per transaction."""

    async def head(self) -> int:
        """Latest block number: :meth:`head_block`'s (shared); a change drops the node's
        cached reads."""
        return (await self.head_block()).number

    async def head_block(self, max_age_s: float | None = None) -> BlockHeader:
        """The latest block's number, hash, parent hash and transaction hashes (one
        ``eth_getBlockByNumber``, without transaction bodies), read at most once per
        ``max_age_s`` (seconds; default ``node.head_every_s``) for every reader of the node
        (the follower, the indexers, the gauges: one read within the poll cadence serves them
        all); a new head drops the node's cached reads."""
        age = self.node.head_every_s if max_age_s is None else max_age_s
        return await self.node.recent(_HEAD, self._read_head, age)

    async def _read_head(self) -> BlockHeader:
        asked = time.monotonic()
        header = _parsed(_header, await self._block("latest"))
        self.node.observe_read_head(header.number, asked)
        return header

    async def headers(self, numbers: Sequence[int]) -> list[BlockHeader]:
        """The headers (with transaction hashes) of blocks ``numbers`` on the node's chain now,
        in the order asked (one JSON-RPC batch of ``eth_getBlockByNumber``); a block the node
        does not hold, or an error, is the node's failure."""
        if not numbers:
            return []
        answers = await self.node.batch([("eth_getBlockByNumber", [hex(n), False]) for n in numbers])
        if any("error" in answer or answer.get("result") is None for answer in answers):
            raise ChainUnavailable(detail="eth_getBlockByNumber answered an error or no block")
        return [_parsed(_header, answer["result"]) for answer in answers]

    async def block_time_ms(self, count: int = 64) -> int | None:
        """The chain's block interval measured from the timestamps of the newest ``count``
        blocks (one ``eth_blockNumber`` and one batch of ``eth_getBlockByNumber``, bounded;
        :func:`~relayer.domain.confirmation.measured_block_time_ms`), milliseconds; None when
        the chain holds too few blocks or no time passed over them. Raises ``ChainUnavailable``."""
        head = await self.head()
        numbers = range(max(0, head - count + 1), head + 1)
        answers = await self.node.batch([("eth_getBlockByNumber", [hex(n), False]) for n in numbers])
        blocks = [a["result"] for a in answers if "error" not in a and a.get("result") is not None]
        stamps = _parsed(lambda bs: [(_int(b["number"]), _int(b["timestamp"])) for b in bs], blocks)
        return measured_block_time_ms(stamps)

    async def finalized(self) -> int | None:
        """The node's finalized block number; None when the node keeps no finalized tag (it
        answers an error or null for it). Raises ``ChainUnavailable`` when the node fails."""
        return await self.tagged("finalized")

    async def tagged(self, tag: str) -> int | None:
        """The number of the node's ``tag`` block (``safe``, ``finalized``); None when the node
        keeps no such tag (it answers an error or null). Read once per head for every reader
        of the node (the node's per-head cache). Raises ``ChainUnavailable`` when the node
        fails."""

        async def load() -> int | None:
            answer = (await self.node.batch([("eth_getBlockByNumber", [tag, False])]))[0]
            block = answer.get("result")
            if "error" in answer or block is None:
                return None
            return _parsed(lambda b: _int(b["number"]), block)

        return await self.node.cached(f"tag:{tag}", load)

    async def block_hash(self, number: int) -> bytes:
        """The hash of block ``number`` on the node's chain now (32 bytes): from the head read
        within the poll cadence (:meth:`head_block`) when ``number`` is that head or its
        parent, at no cost; else one ``eth_getBlockByNumber``."""
        head = self.node.recent_result(_HEAD, self.node.head_every_s)
        if isinstance(head, BlockHeader):
            if number == head.number:
                return head.hash
            if number == head.number - 1:
                return head.parent_hash
        return _parsed(lambda b: _bytes(b["hash"], 32), await self._block(hex(number)))

    async def block_timestamps(self, numbers: set[int]) -> dict[int, int]:
        """Unix timestamps of the given blocks (one ``eth_getBlockByNumber`` each, concurrently)."""
        blocks = await asyncio.gather(*(self._block(hex(n)) for n in sorted(numbers)))
        return _parsed(lambda bs: {_int(b["number"]): _int(b["timestamp"]) for b in bs}, blocks)

    async def stamps_of(self, logs: Sequence[SettledLog]) -> dict[int, int]:
        """Unix timestamps of the blocks holding ``logs``: the one each log carries (a node
        that writes ``blockTimestamp`` in its logs), else read (:meth:`block_timestamps`, for
        the blocks whose logs carry none)."""
        stamps = {e.block_number: e.block_timestamp for e in logs if e.block_timestamp is not None}
        missing = {e.block_number for e in logs} - stamps.keys()
        return stamps | (await self.block_timestamps(missing) if missing else {})

    async def _block(self, tag: str) -> Any:
        return await self.node.request("eth_getBlockByNumber", [tag, False])

    async def block_receipts(self, number: int) -> list[Receipt]:
        """All receipts of one block (one ``eth_getBlockReceipts``)."""
        receipts = await self.node.request("eth_getBlockReceipts", [hex(number)])
        return _parsed(lambda rs: [_receipt(r) for r in rs], receipts)

    async def transaction_count(self, account: str, number: int) -> int:
        """How many transactions of ``account`` the chain holds through block ``number``: its
        lowest nonce still free at that block (one ``eth_getTransactionCount``)."""
        return _parsed(_int, await self.node.request("eth_getTransactionCount", [account, hex(number)]))

    async def receipts_in(self, listed: Mapping[bytes, Collection[bytes]]) -> dict[bytes, Receipt]:
        """The receipts of the transactions ``listed[block_hash]`` (32-byte hashes), by their
        hash: one ``eth_getBlockReceipts`` of each block's hash, all in one JSON-RPC batch (the
        receipts of exactly the blocks asked, whether or not still the node's chain), of which
        only the listed transactions' receipts are parsed. A block the node does not hold
        (null), or a transaction it does not hold, is left out; the caller checks each
        receipt's block. Once the node refuses the method (:data:`BLOCK_RECEIPTS_REFUSALS`),
        this reader reads them as :meth:`receipts` does (one ``eth_getTransactionReceipt``
        each, of the node's chain now) from then on.

        Raises:
            ChainUnavailable: the node failed, answered another error or a malformed
                receipt of a listed transaction.
        """
        blocks = [(block, {"0x" + t.hex() for t in txs}) for block, txs in listed.items() if txs]
        if not blocks:
            return {}
        if self.block_receipts_refused is None:
            answers = await self.node.batch([("eth_getBlockReceipts", ["0x" + b.hex()]) for b, _ in blocks])
            refusal = next((a["error"] for a in answers if refuses_block_receipts(a.get("error"))), None)
            if refusal is None:
                return _in_blocks(answers, [ours for _, ours in blocks])
            self.block_receipts_refused = refusal
            log.warning(
                "the node refuses eth_getBlockReceipts: receipts are read one transaction each "
                "from now on (until the daemon restarts)",
                extra={"code": refusal.get("code"), "error": str(refusal.get("message"))[:200]},
            )
        return await self.receipts([t for txs in listed.values() for t in txs])

    async def receipts(self, tx_hashes: Sequence[bytes]) -> dict[bytes, Receipt]:
        """The receipts the node's chain holds now of these transactions (one
        ``eth_getTransactionReceipt`` each, in one JSON-RPC batch); a transaction it holds
        none of is left out. Any call that fails fails them all: a missing receipt is known,
        never guessed."""
        answers = await self.node.batch(
            [("eth_getTransactionReceipt", ["0x" + tx_hash.hex()]) for tx_hash in tx_hashes]
        )
        if any("error" in answer for answer in answers):
            raise ChainUnavailable(detail="eth_getTransactionReceipt answered an error")
        found = [_parsed(_receipt, a["result"]) for a in answers if a.get("result") is not None]
        return {r.tx_hash: r for r in found}

    async def settled_logs(
        self, from_block: int, to_block: int, to_hash: bytes | None = None
    ) -> list[SettledLog]:
        """``RetirementSettled`` events of the settlement in a block range (one ``eth_getLogs``,
        shared with the catalogue indexer's read of the same range when ``to_hash``, the hash
        of ``to_block`` on the chain the caller follows, is given: the node's
        :class:`~relayer.chain.logfeed.LogFeed`)."""
        pairs = self.node.logs.want([self.node.contracts.settlement], [_SETTLED.topic])
        entries = await self.node.logs.read(pairs, from_block, to_block, to_hash)
        return _parsed(lambda es: [_settled(e) for e in pick(es, pairs)], entries)


T = TypeVar("T")
_HEAD: Final = "head_block"
"""The node's :meth:`~relayer.chain.node.ChainNode.recent` key of the shared head read."""


def _parsed(parse: Callable[[Any], T], value: Any) -> T:
    """``parse(value)``, a malformed answer being the node's failure."""
    try:
        return parse(value)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, DecodingError) as exc:
        raise ChainUnavailable(detail=f"malformed answer: {type(exc).__name__}") from None


def _int(value: Any) -> int:
    """A JSON-RPC quantity ("0x1a")."""
    if not isinstance(value, str) or not value.startswith("0x") or len(value) < 3:
        raise ValueError("not a quantity")
    return int(value, 16)


def _bytes(value: Any, size: int | None = None) -> bytes:
    """JSON-RPC data ("0x..."), of ``size`` bytes when given."""
    if not isinstance(value, str) or not value.startswith("0x"):
        raise ValueError("not data")
    data = bytes.fromhex(value[2:])
    if size is not None and len(data) != size:
        raise ValueError("wrong size")
    return data


def _header(b: Any) -> BlockHeader:
    """A block without transaction bodies: its foreign transactions stay unparsed strings."""
    transactions = b.get("transactions", [])
    if not isinstance(transactions, list):
        raise ValueError("not a list of transactions")
    return BlockHeader(
        _int(b["number"]), _bytes(b["hash"], 32), _bytes(b["parentHash"], 32), frozenset(transactions)
    )


def refuses_block_receipts(error: object) -> bool:
    """Whether a JSON-RPC ``error`` member answered to ``eth_getBlockReceipts`` refuses the
    method as asked (:data:`BLOCK_RECEIPTS_REFUSALS`); False for any other error, or none."""
    return (
        isinstance(error, dict)
        and type(error.get("code")) is int
        and error["code"] in BLOCK_RECEIPTS_REFUSALS
    )


def _in_blocks(answers: list[dict[str, Any]], ours: list[set[str]]) -> dict[bytes, Receipt]:
    """Of the answers to a batch of ``eth_getBlockReceipts``, the receipts of ``ours[i]`` in
    the ``i``-th block, by transaction hash.

    Raises:
        ChainUnavailable: an answer is an error, or malformed (:func:`_ours`).
    """
    if any("error" in answer for answer in answers):
        raise ChainUnavailable(detail="eth_getBlockReceipts answered an error")
    found = [r for answer, txs in zip(answers, ours, strict=True) for r in _ours(answer.get("result"), txs)]
    return {r.tx_hash: r for r in found}


def _ours(receipts: Any, ours: Collection[str]) -> list[Receipt]:
    """Of a block's receipts (``eth_getBlockReceipts``'s JSON result; None for a block the
    node does not hold), those of transactions ``ours`` ("0x…" hashes), parsed; the others
    are left as the JSON decoded them (only their ``transactionHash`` is looked at).

    Raises:
        ChainUnavailable: not a list of receipt objects, or one of ours is malformed.
    """
    if receipts is None:
        return []
    if not isinstance(receipts, list) or not all(isinstance(r, dict) for r in receipts):
        raise ChainUnavailable(detail="malformed answer: eth_getBlockReceipts not a list of receipts")
    return [_parsed(_receipt, r) for r in receipts if _hash_in(r.get("transactionHash"), ours)]


def _hash_in(tx_hash: object, ours: Collection[str]) -> bool:
    return isinstance(tx_hash, str) and tx_hash in ours


def _receipt(r: Any) -> Receipt:
    return Receipt(
        tx_hash=_bytes(r["transactionHash"], 32),
        block_number=_int(r["blockNumber"]),
        block_hash=_bytes(r["blockHash"], 32),
        status=_int(r["status"]),
        gas_used=_int(r["gasUsed"]),
        effective_gas_price=_int(r.get("effectiveGasPrice", "0x0")),
        l1_fee=_quantity(r.get("l1Fee")) + _operator_fee(r),
    )


def _settled(entry: Any) -> SettledLog:
    (payer, beneficiary, index), (value, fee, cost, refunded, nonce, retirement) = decode_settled(
        [_bytes(t, 32) for t in entry["topics"]], _bytes(entry["data"])
    )
    return SettledLog(
        tx_hash=_bytes(entry["transactionHash"], 32),
        block_number=_int(entry["blockNumber"]),
        block_hash=_bytes(entry["blockHash"], 32),
        log_index=_int(entry["logIndex"]),
        payer=payer,
        beneficiary=beneficiary,
        retirement_index=int(index),
        value=int(value),
        fee=int(fee),
        retirement_cost=int(cost),
        refunded=int(refunded),
        bound_nonce=bytes(nonce),
        retirement=calls.retirement_from_tuple(retirement),
        block_timestamp=None if entry.get("blockTimestamp") is None else _int(entry["blockTimestamp"]),
    )


def decode_settled(topics: Sequence[bytes], data: bytes) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """What ``_SETTLED.decode(topics, data)`` gives (the indexed payer, beneficiary and
    retirement index; value, fee, retirement cost, refund, bound nonce and the retirement
    tuple, its strings as bytes, addresses checksummed), read word by word
    (:class:`~relayer.chain.abi_reader.AbiReader`: eth_abi takes about ten times as long).

    Raises:
        ValueError: topic 0 is not ``RetirementSettled``'s, or not three indexed topics.
        eth_abi.exceptions.DecodingError: the topics or the data do not decode.
    """
    if len(topics) != 4 or topics[0] != _SETTLED.topic:
        raise ValueError("not a RetirementSettled log")
    head = AbiReader(b"".join(topics[1:]))
    indexed = (head.address(0), head.address(32), head.uint(64))
    r = AbiReader(data)
    at = r.offset(0, 160, 192)  # the retirement tuple (dynamic: it holds strings)
    details_at = r.offset(at, at + 224, 256)
    details = (
        r.address(details_at),
        r.address(details_at + 32),
        *(r.dynamic_bytes(r.offset(details_at, details_at + 64 + 32 * i, 288)) for i in range(7)),
    )
    retirement = (
        r.uint(at, 8), r.uint(at + 32), r.address(at + 64), r.uint(at + 96), r.uint(at + 128),
        r.address(at + 160), r.uint(at + 192), details,
    )  # fmt: skip
    return indexed, (r.uint(0), r.uint(32), r.uint(64), r.uint(96), r.word(128), retirement)


def _quantity(value: object) -> int:
    """An OP-stack receipt extra such as ``l1Fee``: a hex quantity ("0x" is 0), an int, or
    absent (0)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, bytes):
        return int.from_bytes(value, "big")
    digits = str(value).removeprefix("0x")  # a JSON-RPC quantity is hex
    return int(digits, 16) if digits else 0


def _operator_fee(receipt: Any) -> int:
    """The operator fee an OP-stack receipt implies (Isthmus: ``gasUsed * operatorFeeScalar
    / 1e6 + operatorFeeConstant``); 0 when it carries no operator-fee fields."""
    scalar, constant = receipt.get("operatorFeeScalar"), receipt.get("operatorFeeConstant")
    if scalar is None and constant is None:
        return 0
    return _quantity(receipt["gasUsed"]) * _quantity(scalar) // 10**6 + _quantity(constant)
