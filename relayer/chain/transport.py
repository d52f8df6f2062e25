"""JSON-RPC over HTTP for the daemon's AsyncWeb3: one keep-alive aiohttp session per provider.

web3's own AsyncHTTPProvider opens a new TCP connection per request (``force_close``) and
takes a process-wide threading lock on every request, which can deadlock against any
synchronous web3 use in the same thread; this transport does neither.
"""

from __future__ import annotations

from typing import Any

import aiohttp
from web3.providers.async_base import AsyncJSONBaseProvider
from web3.types import RPCEndpoint, RPCResponse


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

    async def make_request(self, method: RPCEndpoint, params: Any) -> RPCResponse:
        """Send one JSON-RPC request; raises aiohttp/OS errors on transport failure."""
        body = self.encode_rpc_request(method, params)
        async with self._client().post(
            self.endpoint, data=body, headers={"content-type": "application/json"}
        ) as response:
            response.raise_for_status()
            raw = await response.read()
        return self.decode_rpc_response(raw)

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
