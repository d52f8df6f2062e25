"""The word-by-word reads of relayer/chain/abi_reader.py and the layouts read with them
(``RetirementSettled``; the prober's and Multicall3's answers) against eth_abi, over random
values (eth_abi's own hypothesis strategies) and damaged data: a valid encoding reads as
eth_abi decodes it, and what eth_abi refuses is refused."""

from __future__ import annotations

import random
from typing import Any

import pytest
from eth_abi.abi import decode, encode
from eth_abi.exceptions import DecodingError
from eth_abi.tools import get_abi_strategy
from hypothesis import given, settings
from hypothesis import strategies as st

from relayer.chain import codec, multicall, prober
from relayer.chain.blocks import _SETTLED, decode_settled

SETTLED_DATA = "(" + ",".join(_SETTLED.data) + ")"
SETTLED_INDEXED = [get_abi_strategy(t) for t in _SETTLED.indexed]


def _outcome(call: Any) -> Any:
    try:
        return ("ok", call())
    except (DecodingError, ValueError, OverflowError) as exc:
        return ("refused", type(exc).__name__)


def _damaged(data: bytes, rng: random.Random) -> bytes:
    """``data`` with one of: a byte changed, a word changed to a small or huge number, cut
    short, or lengthened."""
    if not data:
        return b"\x01"
    kind = rng.randrange(5)
    at = rng.randrange(len(data))
    if kind == 0:
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]
    word = at - at % 32
    if kind == 1:
        return data[:word] + rng.randrange(2048).to_bytes(32, "big") + data[word + 32 :]
    if kind == 2:
        return data[:word] + rng.getrandbits(256).to_bytes(32, "big") + data[word + 32 :]
    if kind == 3:
        return data[:at]
    return data + bytes(rng.randrange(1, 64))


@settings(max_examples=150, deadline=None)
@given(
    st.tuples(*SETTLED_INDEXED),
    get_abi_strategy(SETTLED_DATA),
    st.randoms(use_true_random=False),
)
def test_a_retirement_settled_log_reads_as_eth_abi_decodes_it(
    indexed: tuple[Any, ...], values: tuple[Any, ...], rng: random.Random
) -> None:
    topics = [_SETTLED.topic] + [encode([t], [v]) for t, v in zip(_SETTLED.indexed, indexed, strict=True)]
    data = encode(list(_SETTLED.data), list(values))
    assert decode_settled(topics, data) == _SETTLED.decode(topics, data)
    for _ in range(8):
        damaged = _damaged(data, rng)
        expected = _outcome(lambda: _SETTLED.decode(topics, damaged))  # noqa: B023
        got = _outcome(lambda: decode_settled(topics, damaged))  # noqa: B023
        if expected[0] == "refused":  # eth_abi's error class may differ: both are DecodingErrors
            assert got[0] == "refused", (damaged.hex(), got)
        else:
            assert got == expected, (damaged.hex(), got, expected)
    bad_topic = [*topics[:1], b"\x01" + topics[1][1:], *topics[2:]]
    assert _outcome(lambda: decode_settled(bad_topic, data))[0] == "refused"
    with pytest.raises(ValueError):
        decode_settled(topics[:3], data)


def _against_eth_abi(
    types: list[str], values: tuple[Any, ...], read: Any, shape: Any, rng: random.Random
) -> None:
    """``read`` of the encoding of ``values`` is eth_abi's decoding (given the reader's shape
    by ``shape``), and of damaged encodings refuses what eth_abi refuses and reads the rest
    as it does."""
    data = encode(types, list(values))
    assert read(data) == shape(decode(types, data))
    for _ in range(8):
        damaged = _damaged(data, rng)
        expected = _outcome(lambda: shape(decode(types, damaged)))  # noqa: B023
        got = _outcome(lambda: read(damaged))  # noqa: B023
        if expected[0] == "refused":
            assert got[0] == "refused", (damaged.hex(), got)
        else:
            assert got == expected, (damaged.hex(), got, expected)


@settings(max_examples=150, deadline=None)
@given(get_abi_strategy("(uint8,uint256,bytes)[]"), st.randoms(use_true_random=False))
def test_the_probers_answer_reads_as_eth_abi_decodes_it(outcomes: list[Any], rng: random.Random) -> None:
    outcomes = [(s % 3, g, d) for s, g, d in outcomes]  # the statuses the prober answers

    def shape(decoded: Any) -> Any:  # a status none of Status's is refused (ValueError) too
        return [(prober.Status(s).value, g, d) for s, g, d in decoded[0]]

    def read(data: bytes) -> Any:
        return [(o.status.value, o.gas_used, o.data) for o in prober._outcomes(data)]

    _against_eth_abi(["(uint8,uint256,bytes)[]"], (outcomes,), read, shape, rng)


@settings(max_examples=150, deadline=None)
@given(
    get_abi_strategy("uint256"),
    get_abi_strategy("bytes32"),
    get_abi_strategy("(bool,bytes)[]"),
    st.randoms(use_true_random=False),
)
def test_multicalls_answer_reads_as_eth_abi_decodes_it(
    number: int, block_hash: bytes, results: list[Any], rng: random.Random
) -> None:
    def shape(decoded: Any) -> Any:
        return decoded[0], decoded[1], [tuple(r) for r in decoded[2]]

    types = ["uint256", "bytes32", "(bool,bytes)[]"]
    read = multicall.decode_try_block_and_aggregate
    _against_eth_abi(types, (number, block_hash, results), read, shape, rng)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(get_abi_strategy("address"), get_abi_strategy("bytes"), get_abi_strategy("uint256"))),
    st.booleans(),
    st.lists(st.tuples(get_abi_strategy("address"), get_abi_strategy("bytes"))),
)
def test_probes_and_multicall_calls_encode_as_eth_abi_encodes_them(
    probes: list[tuple[str, bytes, int]], require: bool, calls: list[tuple[str, bytes]]
) -> None:
    probe_all = codec.function("BatchProber", "probeAll")
    assert prober.encode_probes(probes) == probe_all.selector + encode(
        ["(address,bytes,uint256)[]"], [probes]
    )
    aggregate = multicall._TRY_AGGREGATE_AT
    assert multicall.encode_try_block_and_aggregate(require, calls) == aggregate.selector + encode(
        ["bool", "(address,bytes)[]"], [require, calls]
    )
