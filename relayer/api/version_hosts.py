"""Which API major each ``Host`` serves (the v1 host pins major 1, the v0 host the previous
major 0, any other the latest), and what the x402 self-description documents say of this
daemon for a request's host."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from aiohttp import web

from relayer.api.x402_versions import LATEST_VERSION, X402Info
from relayer.config import Settings
from relayer.service.supply import Supply


def version_hosts(settings: Settings) -> dict[str, int]:
    """``Host`` (``host[:port]``, lower case) -> the API major it serves: the v1 host pins
    major 1, the v0 host serves the previous major 0 (any other host, the latest)."""
    hosts = settings.x402_hosts()
    return {urlsplit(hosts["v1"]).netloc.lower(): 1, urlsplit(hosts["v0"]).netloc.lower(): 0}


def x402_info(
    settings: Settings, supply: Supply, others: Sequence[Supply] = ()
) -> Callable[[web.Request, int], X402Info]:
    """What the x402 self-description documents say of this daemon, per request: the major
    its host serves and that host's base URL; the chains served (``supply``'s first, then
    ``others``, the other relayed chains')."""
    hosts = settings.x402_hosts()
    tokens = [
        {"symbol": t.symbol, "address": t.address, "decimals": t.decimals, "scheme": t.scheme}
        for t in supply.tokens.values()
    ]
    pinned = {urlsplit(url).netloc.lower(): url for url in hosts.values()}

    def info(request: web.Request, major: int) -> X402Info:
        return X402Info(
            api_version=LATEST_VERSION,
            major=major,
            base_url=pinned.get(request.host.lower(), hosts["latest"]),
            versioned_hosts={"latest": hosts["latest"], "current": hosts["v1"], "v0": hosts["v0"]},
            chain_id=supply.chain_id,
            settlement=supply.contracts.settlement,
            input_tokens=tokens,
            security_contact=settings.security_contact,
            served=tuple((s.chain_id, s.contracts.settlement) for s in (supply, *others)),
        )

    return info
