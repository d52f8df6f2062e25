"""The chain layer's pure parts: call data from domain types equals web3's own contract
encoding, the settled event decodes into domain types, and web3's typed exceptions translate
into the error tree (one module, no message matching except the node's broadcast refusals)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from eth_abi.abi import encode
from eth_abi.exceptions import DecodingError
from web3 import Web3
from web3.exceptions import (
    BadResponseFormat,
    BlockNotFound,
    ContractCustomError,
    ContractLogicError,
    InvalidAddress,
    Web3RPCError,
    Web3TypeError,
)

from relayer.chain import calls, codec
from relayer.chain.abi import abi
from relayer.chain.errors import ChainRevert, ChainUnavailable, SendOutcome, refusal, translate
from relayer.chain.types import Contracts
from relayer.domain.eip712 import Signature
from relayer.domain.errors import RelayerError
from relayer.domain.retirement import Retirement, RetirementDetails

PAYER = "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed"
OTHER = "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359"
TOKEN = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
DETAILS = RetirementDetails(
    PAYER, OTHER, "Bénéficiaire ✓", "", "m" * 300, "Oslo", "NO", "2025-01-01", "2025-12-31"
)
RETIREMENT = Retirement(1, 7, OTHER, 3, 12_345, TOKEN, 999, DETAILS)
SALT = bytes(range(32))
SIG = Signature(28, 2**200 + 5, 2**100 + 7)


def _web3(contract: str, function: str, *args: Any) -> bytes:
    c = Web3().eth.contract(address=OTHER, abi=abi(contract))  # type: ignore[call-overload]
    return bytes.fromhex(c.encode_abi(function, args=list(args))[2:])


def test_retire_with_authorization_matches_web3() -> None:
    ours = calls.retire_with_authorization(RETIREMENT, SALT, PAYER, 10**7, 0, 2**256 - 1, SIG)
    auth = (PAYER, 10**7, 0, 2**256 - 1, 28, SIG.r_bytes, SIG.s_bytes)
    assert ours == _web3("RetirementSettlement", "retireWithAuthorization", RETIREMENT.as_tuple(), SALT, auth)


def test_retire_with_permit_matches_web3() -> None:
    ours = calls.retire_with_permit(RETIREMENT, SALT, PAYER, 10**20, 2**200 + 99, SIG)
    permit = (PAYER, 10**20, 2**200 + 99, 28, SIG.r_bytes, SIG.s_bytes)
    assert ours == _web3("RetirementSettlement", "retireWithPermit", RETIREMENT.as_tuple(), SALT, permit)


def test_approve_and_retire_match_web3() -> None:
    plain = Retirement(0, 2, OTHER, 3, 1000, TOKEN, 0, DETAILS)
    assert calls.retire(plain, 5 * 10**6) == _web3(
        "RetirementSettlement", "retire", plain.as_tuple(), 5 * 10**6
    )
    for contract in ("UsdcEip3009", "KlimaVcm"):
        assert calls.approve(contract, PAYER, 77) == _web3(contract, "approve", PAYER, 77)


def test_function_outputs_decode_with_checksummed_addresses() -> None:
    listing = codec.function("Marketplace", "getListing")
    raw = encode(list(listing.outputs), [(PAYER.lower(), OTHER.lower(), 3, 4, 5, 6, 7, 8, True)])
    assert listing.decode(raw) == ((PAYER, OTHER, 3, 4, 5, 6, 7, 8, True),)


def test_settled_event_decodes_into_domain_types() -> None:
    event = codec.event("RetirementSettlement", "RetirementSettled")
    assert event.topic == Web3.keccak(
        text="RetirementSettled(address,address,uint256,uint256,uint256,uint256,uint256,bytes32,"
        "(uint8,uint256,address,uint256,uint256,address,uint256,"
        "(address,address,string,string,string,string,string,string,string)))"
    )
    topics = [
        event.topic,
        encode(["address"], [PAYER]),
        encode(["address"], [OTHER]),
        encode(["uint256"], [2]),
    ]
    data = encode(list(event.data), [10, 1, 8, 1, b"\x09" * 32, RETIREMENT.as_tuple()])
    (payer, beneficiary, index), (value, fee, cost, refunded, nonce, r) = event.decode(topics, data)
    assert (payer, beneficiary, index, value, fee, cost, refunded, nonce) == (
        PAYER,
        OTHER,
        2,
        10,
        1,
        8,
        1,
        b"\x09" * 32,
    )
    assert calls.retirement_from_tuple(r) == RETIREMENT
    with pytest.raises(ValueError):
        event.decode([b"\x00" * 32, *topics[1:]], data)


def test_unknown_or_overloaded_names_are_lookup_errors() -> None:
    with pytest.raises(LookupError):
        codec.function("RetirementSettlement", "noSuchFunction")
    with pytest.raises(LookupError):
        codec.event("RetirementSettlement", "NoSuchEvent")


def test_contracts_from_a_deployment() -> None:
    deployment = {
        k: OTHER.lower()
        for k in ("usdc", "kvcm", "carbonCredits", "carbonClasses", "pool", "marketplace", "settlement")
    }
    contracts = Contracts.from_deployment(deployment)
    assert contracts.carbon_credits == OTHER
    assert contracts.eth_usd_feed is None
    assert Contracts.from_deployment({**deployment, "ethUsdFeed": OTHER.lower()}).eth_usd_feed == OTHER
    with pytest.raises(ValueError, match="lacks"):
        Contracts.from_deployment({k: v for k, v in deployment.items() if k != "pool"})
    with pytest.raises(ValueError, match="malformed"):
        Contracts.from_deployment({**deployment, "pool": "0x1234"})


# ------------------------------------------------------------------ error translation


def test_a_custom_error_revert_is_decoded() -> None:
    data = "0x" + (Web3.keccak(text="ListingNotFound(uint256)")[:4] + encode(["uint256"], [9])).hex()
    err = translate(ContractCustomError(data, data=data), "getListing")
    assert isinstance(err, ChainRevert)
    assert err.code == "contract_revert" and err.error_name == "ListingNotFound"
    assert err.context["decoded"]["args"] == {"listingId": "9"}
    assert err.context["function"] == "getListing" and err.context["contract"] == "Marketplace"


def test_a_revert_without_data_keeps_the_reason() -> None:
    err = translate(ContractLogicError("execution reverted: nope", data="0x"))
    assert isinstance(err, ChainRevert)
    assert err.error_name is None and err.context["reason"] == "execution reverted: nope"


@pytest.mark.parametrize(
    "exc",
    [
        aiohttp.ClientConnectionError("refused"),
        ConnectionRefusedError(),
        TimeoutError(),
        Web3RPCError(
            "boom", rpc_response={"jsonrpc": "2.0", "id": 1, "error": {"code": -32000, "message": "x"}}
        ),
        BadResponseFormat("not json"),
        BlockNotFound("not yet"),
    ],
    ids=["aiohttp", "refused", "timeout", "rpc-error", "bad-response", "block-not-found"],
)
def test_transport_and_node_failures_are_unavailable(exc: Exception) -> None:
    err = translate(exc)
    assert isinstance(err, ChainUnavailable)
    assert (err.code, err.transient, err.spec.http_status) == ("gas_estimate_unavailable", True, 503)
    assert err.context == {"upstream": "chain node"}
    assert err.detail == type(exc).__name__  # for logs; never in the body


@pytest.mark.parametrize(
    "bug",
    [
        ValueError("a bug"),
        Web3TypeError("a bug"),
        InvalidAddress("a bug"),
        FileNotFoundError(),
        KeyError("x"),
    ],
    ids=["ValueError", "Web3TypeError", "InvalidAddress", "FileNotFoundError", "KeyError"],
)
def test_programming_errors_are_not_hidden_as_outages(bug: Exception) -> None:
    assert translate(bug) is None


def test_other_exceptions_are_not_translated() -> None:
    own = RelayerError("not_found")
    assert translate(own) is own


@pytest.mark.parametrize(
    ("message", "outcome"),
    [
        ("already known", SendOutcome.KNOWN),
        ("ALREADY IMPORTED", SendOutcome.KNOWN),
        ("transaction already imported", SendOutcome.KNOWN),
        ("nonce too low", SendOutcome.NONCE_USED),
        ("nonce too high", SendOutcome.NONCE_AHEAD),
        ("replacement transaction underpriced", SendOutcome.UNDERPRICED),
        ("transaction underpriced", SendOutcome.UNDERPRICED),
        ("max fee per gas less than block base fee", SendOutcome.FEE_BELOW_BASE),
        ("insufficient funds for gas * price + value", SendOutcome.NO_FUNDS),
        ("intrinsic gas too low", None),
    ],
)
def test_broadcast_refusals(message: str, outcome: SendOutcome | None) -> None:
    assert refusal({"code": -32003, "message": message}) is outcome
    assert refusal(message) is outcome  # a bare string error member


def test_settled_event_strings_decode_leniently_as_stored_text() -> None:
    event = codec.event("RetirementSettlement", "RetirementSettled").with_strings_as_bytes()
    raw = (*RETIREMENT.as_tuple()[:7], (PAYER, OTHER, b"a\x00b", b"\xff\xfeok", b"", b"", b"", b"", b""))
    raw_types = [t.replace("string", "bytes") for t in event.data]
    topics = [
        event.topic,
        encode(["address"], [PAYER]),
        encode(["address"], [OTHER]),
        encode(["uint256"], [0]),
    ]
    _, (*_, r) = event.decode(topics, encode(raw_types, [1, 2, 3, 4, b"\x01" * 32, raw]))
    details = calls.retirement_from_tuple(r).details
    assert (details.beneficiary_string, details.retiring_entity_string) == ("a\ufffdb", "\ufffd\ufffdok")
    assert details.retiring_address == PAYER
    assert calls.stored_text("plain ✓") == "plain ✓"


def _word_typed() -> list[tuple[str, tuple[str, ...]]]:
    """(what, types) of every output list and event field list of the committed ABIs that
    codec reads word by word."""
    found = []
    for path in sorted((Path(codec.__file__).parents[2] / "contracts_abi").glob("*.json")):
        name = path.stem
        for item in abi(name):
            if item.get("type") == "function":
                f = codec.function(name, item["name"]) if _single(name, item) else None
                if f is not None and f.reads is not None and f.outputs:
                    found.append((f"{name}.{f.name} outputs", f.outputs))
            elif item.get("type") == "event" and _single(name, item):
                e = codec.event(name, item["name"])
                if e.indexed_reads is not None and e.indexed:
                    found.append((f"{name}.{e.name} indexed", e.indexed))
                if e.data_reads is not None and e.data:
                    found.append((f"{name}.{e.name} data", e.data))
    return found


def _single(contract: str, item: dict[str, Any]) -> bool:
    same = [i for i in abi(contract) if i.get("type") == item["type"] and i.get("name") == item["name"]]
    return len(same) == 1


WORD_TYPED = _word_typed()


def _value(kind: str, rng: random.Random) -> Any:
    if kind == "address":
        return Web3.to_checksum_address(rng.randbytes(20))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "bytes32":
        return rng.randbytes(32)
    bits = int(kind[4:])
    return rng.choice([0, 1, 2**bits - 1, rng.getrandbits(bits)])


def _eth_abi(types: tuple[str, ...], data: bytes) -> tuple[str, Any]:
    try:
        return "ok", codec.decode(types, data)
    except DecodingError:
        return "refused", "DecodingError"


def test_word_reads_cover_the_protocols_events_and_views() -> None:
    names = {what for what, _ in WORD_TYPED}
    assert {
        "CarbonCredits.TransferSingle indexed",
        "CarbonCredits.TransferSingle data",
        "Marketplace.ListingFilled data",
        "Marketplace.ListingUpdated data",
    } <= names, names


@pytest.mark.parametrize(("what", "types"), WORD_TYPED, ids=[w for w, _ in WORD_TYPED])
def test_word_reads_answer_as_eth_abi_does(what: str, types: tuple[str, ...]) -> None:
    """Over random values and damaged words (every byte of a word's padding, a short or a
    long data), :func:`codec.decode_words` returns or refuses exactly as eth_abi does."""
    rng = random.Random(what)
    reads = codec.word_reads(types)
    assert reads is not None
    for _ in range(200):
        data = encode(list(types), [_value(t, rng) for t in types])
        damaged = bytearray(data)
        damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
        for candidate in (data, bytes(damaged), data[:-1], data + bytes(32)):
            expected = _eth_abi(types, candidate)
            try:
                got: tuple[str, Any] = ("ok", codec.decode_words(reads, types, candidate))
            except DecodingError:
                got = ("refused", "DecodingError")
            assert got == expected, (what, candidate.hex())


def test_event_topics_are_read_word_by_word_as_eth_abi_reads_them() -> None:
    single = codec.event("CarbonCredits", "TransferSingle")
    assert single.indexed_reads is not None and single.data_reads is not None
    rng = random.Random(3)
    for _ in range(200):
        values = [_value(t, rng) for t in single.indexed]
        topics = [single.topic, *(encode([t], [v]) for t, v in zip(single.indexed, values, strict=True))]
        data = encode(list(single.data), [_value(t, rng) for t in single.data])
        slow = codec.EventAbi(single.contract, single.name, single.topic, single.indexed, single.data)
        assert single.decode(topics, data) == slow.decode(topics, data)
        assert tuple(single.decode(topics, data)[0]) == tuple(values)
        bad = [*topics[:-1], b"\x01" * 12 + topics[-1][12:]]  # an address with padding
        with pytest.raises(DecodingError):
            slow.decode(bad, data)
        with pytest.raises(DecodingError):
            single.decode(bad, data)
