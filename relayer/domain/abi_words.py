"""ABI words (32 bytes each) of the static values the relay hashes on every request: the
EIP-712 struct hashes and the bound nonce (``abi.encode`` of static types is their words one
after another). Built by hand because eth_abi's general encoder costs about 100 µs for ten
words, on every request; tests/unit/test_abi_words.py holds each against eth_abi."""

from __future__ import annotations

from typing import Final

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
