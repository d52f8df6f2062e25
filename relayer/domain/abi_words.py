"""ABI words (32 bytes each) of the static values the relay hashes on every request (the
EIP-712 struct hashes and the bound nonce: ``abi.encode`` of static types is their words one
after another), and the arrays of tuples it sends on every batch (the batch prober's probes,
Multicall3's calls). Built by hand because eth_abi's general encoder costs about 100 µs for
ten words; tests/unit/test_abi_words.py holds each against eth_abi."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any, Final

from relayer.domain.addresses import checksum_address

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


Kind = str | tuple["Kind", ...]
"""An ABI type :func:`encode_tuple` encodes: "address", "bool", "bytes32", "uint8",
"uint256", "string", "bytes", or a tuple of kinds (a struct)."""

_UINT_BITS: Final = {"uint8": 8, "uint256": 256}
ENCODED_KINDS: Final = frozenset({"address", "bool", "bytes32", "uint8", "uint256", "string", "bytes"})
"""The ABI types :func:`encode_tuple` encodes (and structs of them)."""


@cache
def _dynamic(kind: Kind) -> bool:
    if isinstance(kind, tuple):
        return any(_dynamic(k) for k in kind)
    return kind in ("string", "bytes")


def encode_tuple(kinds: Sequence[Kind], values: Sequence[Any]) -> bytes:
    """``abi.encode`` of ``values`` as a tuple of ``kinds`` (a function's arguments after its
    selector): each static value in the head, each dynamic one (a string, bytes, or a struct
    holding one) as an offset in the head and its encoding in the tail, as eth_abi does.
    About ten times faster than eth_abi for the settlement's calls (tests/unit/test_abi_words.py
    holds it against eth_abi).

    Raises:
        ValueError: a value does not fit its kind (see :func:`address_word`,
            :func:`uint_word`, :func:`bytes32_word`; a string that is not text), the value
            count is not the kind count, or a kind is none of these.
    """
    if len(kinds) != len(values):
        raise ValueError(f"{len(values)} values for {len(kinds)} kinds")
    head_size = sum(32 if _dynamic(k) else 32 * _static_words(k) for k in kinds)
    head: list[bytes] = []
    tail: list[bytes] = []
    tail_size = 0
    for kind, value in zip(kinds, values, strict=True):
        if _dynamic(kind):
            encoded = _encode_dynamic(kind, value)
            head.append(uint_word(head_size + tail_size))
            tail.append(encoded)
            tail_size += len(encoded)
        else:
            head.append(_encode_static(kind, value))
    return b"".join(head + tail)


@cache
def _static_words(kind: Kind) -> int:
    return sum(_static_words(k) for k in kind) if isinstance(kind, tuple) else 1


def _encode_struct(kinds: tuple[Kind, ...], value: Any) -> bytes:
    if not isinstance(value, tuple | list):
        raise ValueError(f"not a tuple: {value!r}")
    return encode_tuple(kinds, value)


def _encode_static(kind: Kind, value: Any) -> bytes:
    if isinstance(kind, tuple):
        return _encode_struct(kind, value)
    if kind == "address":
        return _checked_address_word(value)
    if kind in _UINT_BITS:
        return uint_word(value, _UINT_BITS[kind])
    if kind == "bytes32":
        return bytes32_word(value)
    if kind == "bool":
        if type(value) is not bool:
            raise ValueError(f"not a bool: {value!r}")
        return bool_word(value)
    raise ValueError(f"not a kind encode_tuple encodes: {kind!r}")


def _checked_address_word(value: Any) -> bytes:
    """:func:`address_word` of an address as eth_abi takes one: ``0x``, and in one case or
    with a valid EIP-55 checksum."""
    if not isinstance(value, str) or value[:2] != "0x":
        raise ValueError(f"not an address: {value!r}")
    digits = value[2:]
    if digits != digits.lower() and digits != digits.upper() and checksum_address(value) != value:
        raise ValueError(f"not a valid checksum: {value!r}")
    return address_word(value)


def _encode_dynamic(kind: Kind, value: Any) -> bytes:
    if isinstance(kind, tuple):
        return _encode_struct(kind, value)
    if kind == "string":
        if not isinstance(value, str):
            raise ValueError(f"not a string: {value!r}")
        raw = value.encode("utf-8")
    elif isinstance(value, bytes | bytearray):
        raw = bytes(value)
    else:
        raise ValueError(f"not bytes: {value!r}")
    return uint_word(len(raw)) + raw + bytes(-len(raw) % 32)
