"""The marketplace's catalogue snapshot: served up to a second old while a rebuild runs in the
background, carried over with its rendered answers when nothing changed, and not served once
its rebuilds have failed for STALE_LIMIT_S (the request waits for a rebuild and fails)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from relayer.chain.types import Contracts
from relayer.domain.errors import Unavailable
from relayer.service.market.snapshot import REFRESH_S, STALE_LIMIT_S, CatalogueSnapshots, IndexedChain
from relayer.service.project_records import ProjectRecords
from tests.helpers.records import project_record

ADDRESS = "0x" + "11" * 20


class Down(Unavailable):
    code = "gas_estimate_unavailable"


class FakeStore:
    """Stands in for CatalogueStore's reads (pure logic under test: no database here)."""

    def __init__(self) -> None:
        self.down = False
        self.builds = 0

    async def version(self) -> tuple[int, int]:
        if self.down:
            raise Down(detail="database down")
        self.builds += 1
        return (1, 1)

    async def projects(self) -> list[Any]:
        from relayer.store.catalogue import ProjectRow

        return [ProjectRow(project_record(), 1)]

    async def credits(self) -> list[Any]:
        return []

    async def credit_totals(self) -> dict[Any, Any]:
        return {}

    async def live_listings(self, now: int) -> list[Any]:
        return []

    async def holder_balances(self, holders: Any) -> dict[Any, Any]:
        return {}


async def _rebuilt(market: CatalogueSnapshots) -> None:
    """Wait for the background rebuild, if one runs (its failure is logged, not raised)."""
    task = market._refreshing
    if task is not None:
        await asyncio.wait([task])


def _market(store: FakeStore, clock: list[float]) -> CatalogueSnapshots:
    contracts = Contracts(*([ADDRESS] * 7))
    return CatalogueSnapshots(
        cast(Any, store),
        ProjectRecords(cast(Any, store)),
        [IndexedChain(84532, contracts)],
        clock=lambda: clock[0],
    )


async def test_stale_snapshot_is_served_while_rebuilding_and_refused_past_the_limit() -> None:
    store, clock = FakeStore(), [1000.0]
    market = _market(store, clock)
    first = await market.snapshot()
    assert store.builds == 1 and "VCS-10" in first.records
    first.cache["k"] = ({}, b"[]")
    clock[0] += REFRESH_S + 0.1
    assert await market.snapshot() is first  # served while the rebuild runs
    await _rebuilt(market)
    second = await market.snapshot()
    assert store.builds == 2 and second is not first
    assert second.cache is first.cache  # nothing changed: rendered answers kept
    store.down = True
    clock[0] += REFRESH_S + 0.1
    assert await market.snapshot() is second  # a failing rebuild: the last one still served
    await _rebuilt(market)
    assert await market.snapshot() is second
    await _rebuilt(market)
    clock[0] += STALE_LIMIT_S
    with pytest.raises(Down):
        await market.snapshot()
