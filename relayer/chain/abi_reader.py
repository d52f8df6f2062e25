"""Strict reads of ABI-encoded data, word by word, for the answers the relay decodes on every
retirement: its own settlement's ``RetirementSettled`` log (:mod:`relayer.chain.blocks`), the
batch prober's outcomes (:mod:`relayer.chain.prober`) and Multicall3's results
(:mod:`relayer.chain.multicall`). eth_abi's general decoder costs several hundred µs for one
``RetirementSettled`` (a nested struct of seven strings); these read the layouts those
callers know. Each read checks what eth_abi checks (the data is long enough, padding is zero,
an offset points inside the data) and raises eth_abi's own errors, so callers keep catching
:class:`~eth_abi.exceptions.DecodingError`. tests/unit/test_abi_reader.py holds each layout
against eth_abi over random values and damaged data."""

from __future__ import annotations

from typing import Final

from eth_abi.exceptions import InsufficientDataBytes, InvalidPointer, NonEmptyPaddingBytes

from relayer.domain.addresses import checksum_address

_ZERO: Final = bytes(32)


class AbiReader:
    """Reads of ``data`` at byte positions (a head's slot, or a position an offset gave)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def word(self, at: int) -> bytes:
        """The 32 bytes at ``at``.

        Raises:
            InsufficientDataBytes: the data ends before them.
        """
        if at < 0 or at + 32 > len(self.data):
            raise InsufficientDataBytes(f"no word at {at} of {len(self.data)} bytes")
        return self.data[at : at + 32]

    def uint(self, at: int, bits: int = 256) -> int:
        """A ``uint<bits>`` at ``at``.

        Raises:
            InsufficientDataBytes: no word there.
            NonEmptyPaddingBytes: its high bytes past ``bits`` are not zero.
        """
        word = self.word(at)
        pad = 32 - bits // 8
        if pad and word[:pad] != _ZERO[:pad]:
            raise NonEmptyPaddingBytes(f"uint{bits} at {at} has non-zero padding")
        return int.from_bytes(word, "big")

    def boolean(self, at: int) -> bool:
        """A ``bool`` at ``at`` (0 or 1).

        Raises:
            InsufficientDataBytes: no word there.
            NonEmptyPaddingBytes: another value.
        """
        value = self.uint(at, 8)
        if value > 1:
            raise NonEmptyPaddingBytes(f"bool at {at} is {value}")
        return value == 1

    def address(self, at: int) -> str:
        """An ``address`` at ``at``, checksummed.

        Raises:
            InsufficientDataBytes: no word there.
            NonEmptyPaddingBytes: its 12 high bytes are not zero.
        """
        word = self.word(at)
        if word[:12] != _ZERO[:12]:
            raise NonEmptyPaddingBytes(f"address at {at} has non-zero padding")
        return checksum_address("0x" + word[12:].hex())

    def offset(self, base: int, at: int, head: int) -> int:
        """The position an offset word at ``at`` points to: ``base`` (the start of the
        enclosing tuple's or array's head, ``head`` bytes long) plus the offset, past that
        head and inside the data.

        Raises:
            InsufficientDataBytes: no word at ``at``.
            InvalidPointer: the position is inside the head or past the data's end.
        """
        target = base + self.uint(at)
        if target < base + head or target >= len(self.data):
            raise InvalidPointer(f"offset at {at} points inside its head or past the data")
        return target

    def dynamic_bytes(self, at: int) -> bytes:
        """A ``bytes`` (or ``string``'s bytes) whose length word is at ``at``.

        Raises:
            InsufficientDataBytes: the data ends before its padded end.
            NonEmptyPaddingBytes: the padding after it is not zero.
        """
        size = self.uint(at)
        start = at + 32
        end = start + size
        padded = start + -(-size // 32) * 32
        if padded > len(self.data):
            raise InsufficientDataBytes(f"bytes at {at} run past the data")
        if self.data[end:padded] != _ZERO[: padded - end]:
            raise NonEmptyPaddingBytes(f"bytes at {at} have non-zero padding")
        return self.data[start:end]

    def array(self, at: int) -> tuple[int, int]:
        """(length, position of its first element's head) of a dynamic array whose length
        word is at ``at``; the elements' heads are ``length`` words from there (each an
        offset, relative to that position, for dynamic elements).

        Raises:
            InsufficientDataBytes: the data ends before the heads do.
        """
        length = self.uint(at)
        start = at + 32
        if start + 32 * length > len(self.data):
            raise InsufficientDataBytes(f"array at {at} of {length} runs past the data")
        return length, start
