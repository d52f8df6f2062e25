"""One read shared by every caller that asks for it while it runs (the node's per-head and
recent reads, the shared ``eth_getLogs``): each caller awaits it shielded, and a read that
failed is dropped from its cache so the next caller reads again."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any, TypeVar

T = TypeVar("T")


async def shared(cache: MutableMapping[Any, Any], key: Any, read: asyncio.Future[T], slot: int) -> T:
    """``read``'s result, awaited shielded (one caller's cancellation leaves it running for
    the others); when it fails, ``cache[key]`` is removed if its entry still holds ``read`` at
    index ``slot``, and the failure raised.

    Raises:
        BaseException: what ``read`` raised (or this caller's cancellation).
    """
    try:
        return await asyncio.shield(read)
    except BaseException:
        if key in cache and cache[key][slot] is read:
            del cache[key]
        raise
