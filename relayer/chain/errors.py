"""The chain layer's errors, and the one place where web3's and the transport's exceptions
are translated into them: a revert becomes :class:`ChainRevert` (its custom error decoded
from the ABIs), anything else that fails on the way to or at the node becomes
:class:`ChainUnavailable`. Nothing above this layer catches a web3 or aiohttp type."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Awaitable
from enum import StrEnum
from typing import Any, Final, TypeVar

import aiohttp
from eth_abi.abi import encode
from eth_utils.crypto import keccak
from web3.exceptions import (
    BadResponseFormat,
    ContractLogicError,
    ProviderConnectionError,
    TimeExhausted,
    TooManyRequests,
    Web3RPCError,
)

from relayer.chain.abi import decode_revert
from relayer.domain.errors import RelayerError, Unavailable

T = TypeVar("T")


class ChainUnavailable(Unavailable):
    """The node could not be reached, timed out, or answered with an error that is not a
    revert (transient: retry later). ``cause`` says why in words, with the remedy
    (:func:`node_cause`), for the operator's start-up line; it never reaches an error body."""

    upstream = "chain node"
    cause: tuple[str, str] = ("it failed", "is the node up?")


# (what happened, what to do): the start-up line's words for each way a node fails.
NODE_REFUSED: Final = ("connection refused", "is the node running, and listening on that port?")
NODE_NO_HOST: Final = ("no such host", "check the host name")
NODE_TLS: Final = ("the TLS handshake failed", "use http:// for a node that does not serve TLS")
NODE_NOT_RPC: Final = ("its answer is not JSON-RPC", "give the node's JSON-RPC URL")
NODE_TIMEOUT: Final = ("no answer in time", "is the node up, and reachable from here?")


def node_cause(exc: BaseException) -> tuple[str, str]:
    """Why a node could not be used, and the remedy, from the exception (or what it was
    raised from): refused, no such host, TLS, not a JSON-RPC answer (an HTTP error status or a
    body that is not JSON-RPC), no answer in time, or the exception's class name."""
    current: BaseException | None = exc
    for _ in range(8):  # bounded: a cause chain is short
        if current is None:
            break
        if isinstance(current, (aiohttp.ClientConnectorDNSError, socket.gaierror)):
            return NODE_NO_HOST
        if isinstance(current, (aiohttp.ClientSSLError, ssl.SSLError)):
            return NODE_TLS
        os_error = current.os_error if isinstance(current, aiohttp.ClientConnectorError) else current
        if isinstance(os_error, ConnectionRefusedError):
            return NODE_REFUSED
        if isinstance(current, aiohttp.ClientResponseError):
            return (f"it answers HTTP {current.status}, not JSON-RPC", NODE_NOT_RPC[1])
        if isinstance(current, BadResponseFormat):
            return NODE_NOT_RPC
        if isinstance(current, TimeoutError):
            return NODE_TIMEOUT
        current = current.__cause__ or current.__context__
    return (f"it failed ({type(exc).__name__})", "is the node up?")


class ChainRevert(RelayerError):
    """A call or gas estimate reverted (``contract_revert``). ``info`` is the decoded revert,
    with the fields the spec names (Errors: contract_revert): ``{selector, decoded:
    {errorName, args}, contract, function, args}`` (``args`` repeats ``decoded.args``)."""

    default_code = "contract_revert"

    def __init__(self, data: bytes | None, function: str | None = None, reason: str | None = None) -> None:
        if data:
            info = decode_revert(data)
        else:
            info = {"selector": None, "decoded": {"errorName": None, "args": {}}, "contract": None}
            if reason:
                info["reason"] = reason[:200]
        self.info: dict[str, Any] = {**info, "function": function, "args": info["decoded"]["args"]}
        super().__init__(**self.info)

    @classmethod
    def insufficient_balance(cls, payer: str, balance: int, needed: int, function: str) -> ChainRevert:
        """The revert the token would give when ``payer`` holds ``balance`` (atomic units)
        and the settlement pulls ``needed``: OpenZeppelin's ``ERC20InsufficientBalance``, as
        ``eth_estimateGas`` would report it, without asking the node (a predicted revert)."""
        selector = keccak(text="ERC20InsufficientBalance(address,uint256,uint256)")[:4]
        return cls(selector + encode(["address", "uint256", "uint256"], [payer, balance, needed]), function)

    @property
    def error_name(self) -> str | None:
        """The decoded custom error's name (``ListingNotFound``), if the selector is known."""
        name = self.info["decoded"]["errorName"]
        return None if name is None else str(name)


class SendOutcome(StrEnum):
    """What broadcasting signed bytes came to. Each refusal gets its own handling by the
    broadcaster; none is retried blindly."""

    SENT = "sent"
    KNOWN = "known"  # the node already holds this very transaction: nothing to do
    NONCE_USED = "nonce_used"  # its nonce is taken on-chain: the follower finds by what
    NONCE_AHEAD = "nonce_ahead"  # a nonce below it is missing: the lane has a hole to fill
    UNDERPRICED = "underpriced"  # a same-nonce transaction with higher fees is pending
    FEE_BELOW_BASE = "fee_below_base"  # its fee cap is under the base fee: replace it now
    NO_FUNDS = "no_funds"  # the executor cannot pay for it


# The node's words for each refusal (geth, reth, op-geth and anvil agree on these; JSON-RPC
# gives them no distinct codes). First match wins: "underpriced" is checked after the rest.
_REFUSALS: Final = (
    (("already known", "already imported", "known transaction"), SendOutcome.KNOWN),
    (("nonce too low", "nonce has already been used"), SendOutcome.NONCE_USED),
    (("nonce too high",), SendOutcome.NONCE_AHEAD),
    (("less than block base fee", "fee cap less than block base fee"), SendOutcome.FEE_BELOW_BASE),
    (("insufficient funds",), SendOutcome.NO_FUNDS),
    (("underpriced",), SendOutcome.UNDERPRICED),
)


# Failures of the node or of the way to it. web3's other exceptions (Web3TypeError,
# InvalidAddress, validation errors...) and any other OSError are bugs: left to propagate.
NODE_FAILURES: Final = (
    Web3RPCError,  # the node answered with an error (incl. block or transaction not found yet)
    BadResponseFormat,  # the node's answer is not JSON-RPC (see transport.py)
    ProviderConnectionError,
    TooManyRequests,
    TimeExhausted,
    aiohttp.ClientError,
    ConnectionError,
    TimeoutError,
)


def translate(exc: BaseException, function: str | None = None) -> RelayerError | None:
    """The chain error for an exception raised by web3 or the transport, or None for an
    exception that is neither (a programming error, left to propagate)."""
    if isinstance(exc, RelayerError):
        return exc
    if isinstance(exc, ContractLogicError):
        data = exc.data if isinstance(exc.data, str) and exc.data.startswith("0x") else None
        return ChainRevert(bytes.fromhex(data[2:]) if data else None, function, exc.message)
    if isinstance(exc, NODE_FAILURES):
        unavailable = ChainUnavailable(detail=type(exc).__name__)
        unavailable.cause = node_cause(exc)
        return unavailable
    return None


def refusal(error: Any) -> SendOutcome | None:
    """The refusal a JSON-RPC ``error`` member answering ``eth_sendRawTransaction`` means,
    or None for any other error (then the node is unavailable)."""
    message = str(error.get("message", "") if isinstance(error, dict) else error).lower()
    for words, outcome in _REFUSALS:
        if any(w in message for w in words):
            return outcome
    return None


async def rpc(awaitable: Awaitable[T], function: str | None = None) -> T:
    """Await one web3 request, translating its failure (see :func:`translate`).

    Raises:
        ChainRevert: the call reverted.
        ChainUnavailable: the node failed or was unreachable.
    """
    try:
        return await awaitable
    except Exception as exc:
        mapped = translate(exc, function)
        if mapped is None or mapped is exc:
            raise
        raise mapped from None
