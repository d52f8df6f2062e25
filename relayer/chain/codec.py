"""ABI encoding and decoding of the reference protocol's calls and events, straight from the
committed ABIs with eth_abi: no web3 contract object and no client instance. Selectors,
topics and canonical types are derived once per function or event and cached."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache, partial
from typing import Any, Final

from eth_abi.abi import decode as abi_decode
from eth_abi.abi import encode
from eth_abi.exceptions import DecodingError
from eth_abi.grammar import ABIType, BasicType, TupleType, parse
from eth_utils.crypto import keccak

from relayer.chain.abi import abi, canonical_type
from relayer.chain.abi_reader import AbiReader
from relayer.domain.abi_words import ENCODED_KINDS, Kind, encode_tuple
from relayer.domain.addresses import checksum_address


def decode(types: Sequence[str], data: bytes) -> tuple[Any, ...]:
    """eth_abi decoding with every address checksummed (eth_abi gives lower case).

    Raises:
        eth_abi.exceptions.DecodingError: ``data`` does not decode as ``types``.
    """
    values = abi_decode(list(types), data)
    return tuple(_checksummed(parse(t), v) for t, v in zip(types, values, strict=True))


WordRead = Callable[[AbiReader, int], Any]
"""A read of one static value from its word (:class:`AbiReader`, position in bytes)."""

_WORD_READS: Final[dict[str, WordRead]] = {
    "address": AbiReader.address,
    "bool": AbiReader.boolean,
    "bytes32": AbiReader.word,
}
_UINT_BITS: Final = frozenset(str(b) for b in range(8, 257, 8))


def word_reads(types: Sequence[str]) -> tuple[WordRead, ...] | None:
    """One word read per type of ``types`` (canonical ABI types), or None when one is not a
    one-word static type read as is (``uint<N>``, ``address``, ``bool``, ``bytes32``)."""
    reads: list[WordRead] = []
    for t in types:
        if t in _WORD_READS:
            reads.append(_WORD_READS[t])
        elif t.startswith("uint") and t[4:] in _UINT_BITS:
            reads.append(partial(AbiReader.uint, bits=int(t[4:])))
        else:
            return None
    return tuple(reads)


def decode_words(reads: tuple[WordRead, ...] | None, types: Sequence[str], data: bytes) -> tuple[Any, ...]:
    """:func:`decode` of ``data`` as ``types``, word by word when ``reads`` (their
    :func:`word_reads`) has them and ``data`` is exactly their words: about ten times faster
    than eth_abi. Anything else, and any data the word reads refuse, goes to eth_abi, so the
    answer or the refusal is always eth_abi's (tests/unit/test_chain_codec.py).

    Raises:
        eth_abi.exceptions.DecodingError: ``data`` does not decode as ``types``.
    """
    if reads is not None and len(data) == 32 * len(reads):
        reader = AbiReader(data)
        try:
            return tuple(read(reader, 32 * i) for i, read in enumerate(reads))
        except DecodingError:
            pass  # eth_abi's refusal, below
    return decode(types, data)


def _checksummed(kind: ABIType, value: Any) -> Any:
    if kind.is_array:
        return tuple(_checksummed(kind.item_type, v) for v in value)
    if isinstance(kind, TupleType):
        return tuple(_checksummed(c, v) for c, v in zip(kind.components, value, strict=True))
    if isinstance(kind, BasicType) and kind.base == "address":
        return checksum_address(value)
    return value


@dataclass(frozen=True, slots=True)
class FunctionAbi:
    """One contract function: 4-byte selector and canonical input and output types."""

    contract: str
    name: str
    selector: bytes
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    kinds: tuple[Kind, ...] | None = None  # the inputs as abi_words encodes them, if it can
    reads: tuple[WordRead, ...] | None = None  # the outputs' word reads, if they are words

    def encode(self, *args: Any) -> bytes:
        """Call data: selector + ABI-encoded ``args`` (tuples for structs, bytes for bytesN).
        Inputs of the kinds :func:`~relayer.domain.abi_words.encode_tuple` takes are encoded
        by it (the settlement's calls: about four times faster); whatever it does not take
        as given goes to eth_abi, which encodes it or refuses it, so the answer is always
        eth_abi's (tests/unit/test_abi_words.py).

        Raises:
            eth_abi.exceptions.EncodingError: an argument does not fit its type.
        """
        if self.kinds is not None:
            try:
                return self.selector + encode_tuple(self.kinds, args)
            except ValueError:
                pass  # eth_abi's answer: its encoding of a form it takes, or its refusal
        return self.selector + encode(list(self.inputs), list(args))

    def decode(self, data: bytes) -> tuple[Any, ...]:
        """The return values of an ``eth_call`` (addresses as checksummed strings).

        Raises:
            eth_abi.exceptions.DecodingError: ``data`` does not decode as the outputs.
        """
        return decode_words(self.reads, self.outputs, data)


@dataclass(frozen=True, slots=True)
class EventAbi:
    """One event: topic 0 and the canonical types of its indexed and data fields."""

    contract: str
    name: str
    topic: bytes
    indexed: tuple[str, ...]
    data: tuple[str, ...]
    indexed_reads: tuple[WordRead, ...] | None = None  # word reads of the indexed fields
    data_reads: tuple[WordRead, ...] | None = None  # and of the data's, if they are words

    def with_strings_as_bytes(self) -> EventAbi:
        """The same event with every ``string`` decoded as ``bytes`` (their ABI encoding is
        the same), for logs whose strings may not be valid UTF-8."""
        data = tuple(t.replace("string", "bytes") for t in self.data)
        return replace(self, data=data, data_reads=word_reads(data))

    def decode(self, topics: Sequence[bytes], data: bytes) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """(indexed values, data values) of one log of this event.

        Raises:
            ValueError: topic 0 is not this event's, or the topics do not match.
            eth_abi.exceptions.DecodingError: the data does not decode.
        """
        if len(topics) != 1 + len(self.indexed) or topics[0] != self.topic:
            raise ValueError(f"not a {self.name} log")
        return self._indexed(topics[1:]), decode_words(self.data_reads, self.data, data)

    def _indexed(self, topics: Sequence[bytes]) -> tuple[Any, ...]:
        """The indexed fields' values: each topic word by word when it can (as
        :func:`decode_words`), else eth_abi's answer or refusal."""
        if self.indexed_reads is not None and all(len(t) == 32 for t in topics):
            try:
                return tuple(
                    read(AbiReader(t), 0) for read, t in zip(self.indexed_reads, topics, strict=True)
                )
            except DecodingError:
                pass  # eth_abi's refusal, below
        return tuple(decode([t], topic)[0] for t, topic in zip(self.indexed, topics, strict=True))


def _item(contract: str, kind: str, name: str) -> dict[str, Any]:
    found = [i for i in abi(contract) if i.get("type") == kind and i.get("name") == name]
    if len(found) != 1:
        raise LookupError(f"{contract} has {len(found)} {kind}s named {name}")
    return found[0]


@cache
def function(contract: str, name: str) -> FunctionAbi:
    """The (not overloaded) function ``name`` of ``contract`` (a name in contracts_abi/).

    Raises:
        LookupError: no such function, or it is overloaded.
    """
    item = _item(contract, "function", name)
    inputs = tuple(canonical_type(p) for p in item["inputs"])
    outputs = tuple(canonical_type(p) for p in item.get("outputs", ()))
    selector = keccak(text=f"{name}({','.join(inputs)})")[:4]
    return FunctionAbi(contract, name, selector, inputs, outputs, fast_kinds(inputs), word_reads(outputs))


def fast_kinds(types: Sequence[str]) -> tuple[Kind, ...] | None:
    """``types`` (canonical ABI types) as :func:`~relayer.domain.abi_words.encode_tuple`'s
    kinds, or None when one is a type it does not encode (an array, a fixed-size bytes other
    than bytes32, an int, a uint other than uint8 and uint256)."""
    try:
        return tuple(_kind(parse(t)) for t in types)
    except LookupError:
        return None


def _kind(kind: ABIType) -> Kind:
    if kind.is_array:
        raise LookupError("arrays are left to eth_abi")
    if isinstance(kind, TupleType):
        return tuple(_kind(c) for c in kind.components)
    if not isinstance(kind, BasicType) or isinstance(kind.sub, tuple):
        raise LookupError("left to eth_abi")
    name = str(kind.base) + ("" if kind.sub is None else str(kind.sub))
    if name in ENCODED_KINDS:
        return name
    raise LookupError(f"{name} is left to eth_abi")


@cache
def event(contract: str, name: str) -> EventAbi:
    """The event ``name`` of ``contract``.

    Raises:
        LookupError: no such event, or it is overloaded.
    """
    item = _item(contract, "event", name)
    params = item["inputs"]
    signature = f"{name}({','.join(canonical_type(p) for p in params)})"
    indexed = tuple(canonical_type(p) for p in params if p["indexed"])
    data = tuple(canonical_type(p) for p in params if not p["indexed"])
    return EventAbi(
        contract, name, keccak(text=signature), indexed, data, word_reads(indexed), word_reads(data)
    )
