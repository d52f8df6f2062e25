"""JSON-RPC over HTTP for the daemon's AsyncWeb3: one keep-alive aiohttp session per provider.

web3's own AsyncHTTPProvider opens a new TCP connection per request (``force_close``) and
takes a process-wide threading lock on every request, which can deadlock against any
synchronous web3 use in the same thread; this transport does neither.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

import aiohttp
from web3.exceptions import BadResponseFormat
from web3.providers.async_base import AsyncJSONBaseProvider
from web3.types import RPCEndpoint, RPCResponse

from relayer.chain.errors import ChainUnavailable

# The shape a healthy node's result has, per method the daemon calls. Anything else (null,
# "0x" for a number, a bare value for a list) is a broken or lagging node: web3's formatters
# would fail on it with a TypeError or ValueError, which would look like a bug.
_QUANTITY: Final = re.compile(r"0x[0-9a-fA-F]+")
_HEX: Final = re.compile(r"0x[0-9a-fA-F]*")  # data: this and an even length (a repeated pair is 6x slower)
_HASH: Final = re.compile(r"0x[0-9a-fA-F]{64}")
RESULT_SHAPES: Final[dict[str, Callable[[Any], bool]]] = {
    **dict.fromkeys(
        ("eth_chainId", "eth_blockNumber", "eth_estimateGas", "eth_getTransactionCount", "eth_getBalance"),
        lambda r: isinstance(r, str) and _QUANTITY.fullmatch(r) is not None,
    ),
    "eth_call": lambda r: isinstance(r, str) and len(r) % 2 == 0 and _HEX.fullmatch(r) is not None,
    "eth_sendRawTransaction": lambda r: isinstance(r, str) and _HASH.fullmatch(r) is not None,
    "eth_getLogs": lambda r: isinstance(r, list),
    "eth_feeHistory": lambda r: isinstance(r, dict) and isinstance(r.get("baseFeePerGas"), list),
    "eth_getBlockReceipts": lambda r: r is None or isinstance(r, list),
    "eth_getBlockByNumber": lambda r: r is None or isinstance(r, dict),
}


class BatchRefused(ChainUnavailable):
    """The node answered a JSON-RPC batch with something else (one error object: a node or
    provider that does not take batches): the caller falls back to one request per call;
    should it leave the chain layer, it is the node being unavailable."""


class KeepAliveHTTPProvider(AsyncJSONBaseProvider):
    """An async JSON-RPC provider with a bounded, kept-alive connection pool.

    Args:
        endpoint: the node's HTTP JSON-RPC URL.
        timeout_s: total time a request may take, seconds.
        max_connections: connection pool size.
    """

    def __init__(self, endpoint: str, timeout_s: float = 10.0, max_connections: int = 32) -> None:
        super().__init__()
        self.endpoint = endpoint
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"KeepAliveHTTPProvider({self.endpoint})"

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, connector=aiohttp.TCPConnector(limit=self._max_connections)
            )
        return self._session

    async def _post(self, body: bytes) -> bytes:
        """POST a JSON-RPC body; the raw answer (an HTTP error status raises)."""
        async with self._client().post(
            self.endpoint, data=body, headers={"content-type": "application/json"}
        ) as response:
            response.raise_for_status()
            return await response.read()

    async def make_request(self, method: RPCEndpoint, params: Any) -> RPCResponse:
        """Send one JSON-RPC request.

        Raises:
            aiohttp.ClientError, TimeoutError: the transport failed.
            BadResponseFormat: the answer is not a JSON-RPC object.
        """
        raw = await self._post(self.encode_rpc_request(method, params))
        try:
            decoded = self.decode_rpc_response(raw)
        except ValueError:  # JSONDecodeError, UnicodeDecodeError: an HTML page, an empty body
            raise BadResponseFormat("the node's answer is not JSON") from None
        if not isinstance(decoded, dict):
            raise BadResponseFormat("the node's answer is not a JSON-RPC object")
        shape = RESULT_SHAPES.get(method)
        if shape is not None and "error" not in decoded and not shape(decoded.get("result")):
            raise BadResponseFormat(f"the node answered {method} with a malformed result")
        return decoded

    async def batch(self, calls: Sequence[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
        """Send ``calls`` (method, params) as one JSON-RPC batch: one HTTP round trip, and
        each call's response (``result`` or ``error``) in the order of ``calls``. A result of
        the wrong shape is returned as an ``error`` entry (code -32603), not raised.

        Raises:
            aiohttp.ClientError, TimeoutError: the transport failed.
            BatchRefused: the answer is not a JSON-RPC batch (the node takes no batches).
            BadResponseFormat: the answer is not JSON, or misses a call.
        """
        if not calls:
            return []
        raw = await self._post(
            json.dumps(
                [{"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(calls)]
            ).encode()
        )
        try:
            decoded = json.loads(raw)
        except ValueError:
            raise BadResponseFormat("the node's answer is not JSON") from None
        if not isinstance(decoded, list):
            raise BatchRefused(detail="the node's answer to a batch is not a JSON-RPC batch")
        by_id = {r["id"]: r for r in decoded if isinstance(r, dict) and type(r.get("id")) is int}
        answers: list[dict[str, Any]] = []
        for i, (method, _params) in enumerate(calls):
            answer = by_id.get(i)
            if answer is None:
                raise BadResponseFormat("the node's batch answer misses a call")
            shape = RESULT_SHAPES.get(method)
            if "error" not in answer and shape is not None and not shape(answer.get("result")):
                answer = {"id": i, "error": {"code": -32603, "message": f"malformed {method} result"}}
            answers.append(answer)
        return answers

    async def is_connected(self, show_traceback: bool = False) -> bool:
        try:
            response = await self.make_request(RPCEndpoint("web3_clientVersion"), [])
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False
        return "result" in response

    async def disconnect(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
