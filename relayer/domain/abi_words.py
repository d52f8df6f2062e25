"""ABI words (32 bytes each) of the static values the relay hashes on every request (the
EIP-712 struct hashes and the bound nonce: ``abi.encode`` of static types is their words one
after another), and the arrays of tuples it sends on every batch (the batch prober's probes,
Multicall3's calls). Built by hand because eth_abi's general encoder costs about 100 µs for
ten words; tests/unit/test_abi_words.py holds each against eth_abi."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

_HEX: Final = frozenset("0123456789abcdefABCDEF")


def address_word(value: str) -> bytes:
    """``value`` (0x and 40 hex digits, either case; no checksum check: the bytes are what is
    hashed) as a word: 12 zero bytes, then its 20.

    Raises:
        ValueError: ``value`` is not such a string.
    """
    if (
        not isinstance(value, str)
        or len(value) != 42
        or value[:2] not in ("0x", "0X")
        or not _HEX.issuperset(value[2:])
    ):
        raise ValueError(f"not an address: {value!r}")
    return bytes(12) + bytes.fromhex(value[2:])


def uint_word(value: int, bits: int = 256) -> bytes:
    """``value`` as a ``uint<bits>`` word (big-endian).

    Raises:
        ValueError: ``value`` is not an int (a bool is not) in [0, 2**bits).
    """
    if type(value) is not int or not 0 <= value < 1 << bits:
        raise ValueError(f"not a uint{bits}: {value!r}")
    return value.to_bytes(32, "big")


def bytes32_word(value: bytes) -> bytes:
    """``value`` (exactly 32 bytes) as a word.

    Raises:
        ValueError: ``value`` is not 32 bytes.
    """
    if not isinstance(value, bytes | bytearray) or len(value) != 32:
        raise ValueError("not 32 bytes")
    return bytes(value)


def bool_word(value: bool) -> bytes:
    """``value`` as a ``bool`` word."""
    return uint_word(1 if value else 0)


def tuple_array(rows: Sequence[Sequence[Any]], kinds: Sequence[str]) -> bytes:
    """The ABI encoding of a dynamic array of tuples (its length, its elements' offsets,
    then each tuple) whose fields are ``kinds``: "address", "bool", "uint256" (one word each)
    and "bytes" (an offset in the tuple's head, its length and padded bytes in its tail): what
    eth_abi encodes for ``(kinds...)[]`` in a tail, one row a tuple.

    Raises:
        ValueError: a value does not fit its kind (see :func:`address_word`,
            :func:`uint_word`), or a kind is none of these.
    """
    head_size = 32 * len(kinds)
    tuples: list[bytes] = []
    for row in rows:
        head: list[bytes] = []
        tail: list[bytes] = []
        tail_size = 0
        for kind, value in zip(kinds, row, strict=True):
            if kind == "bytes":
                raw = bytes(value)
                head.append(uint_word(head_size + tail_size))
                padded = raw + bytes(-len(raw) % 32)
                tail += [uint_word(len(raw)), padded]
                tail_size += 32 + len(padded)
            elif kind == "address":
                head.append(address_word(value))
            elif kind == "uint256":
                head.append(uint_word(value))
            elif kind == "bool":
                head.append(bool_word(value))
            else:
                raise ValueError(f"not a kind tuple_array encodes: {kind}")
        tuples.append(b"".join(head + tail))
    offsets: list[bytes] = []
    position = 32 * len(tuples)
    for encoded in tuples:
        offsets.append(uint_word(position))
        position += len(encoded)
    return uint_word(len(tuples)) + b"".join(offsets) + b"".join(tuples)
