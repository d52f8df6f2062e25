"""The shared reader of the catalogue's project records (service/project_records.py): parsed
once per catalogue version, the version asked at most once per ``max_age_s``, a malformed row
left out, and x402 discover's filters reading the same records (pure logic: a fake store)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from relayer.domain.errors import Unavailable
from relayer.service.project_records import ProjectRecords
from relayer.store.catalogue import ProjectRow
from tests.helpers.records import project_record


class Down(Unavailable):
    code = "gas_estimate_unavailable"


class FakeStore:
    """Stands in for CatalogueStore's two reads of the projects."""

    def __init__(self) -> None:
        self.rows = [ProjectRow(project_record(), 5)]
        self.revision = 1
        self.versions = self.loads = 0
        self.down = False

    async def version(self) -> tuple[int, int]:
        if self.down:
            raise Down(detail="database down")
        self.versions += 1
        await asyncio.sleep(0)
        return (len(self.rows), self.revision)

    async def projects(self) -> list[ProjectRow]:
        self.loads += 1
        return list(self.rows)


def _reader(store: FakeStore, clock: list[float]) -> ProjectRecords:
    return ProjectRecords(cast(Any, store), clock=lambda: clock[0])


async def test_records_are_parsed_once_per_version() -> None:
    store, clock = FakeStore(), [100.0]
    reader = _reader(store, clock)
    assert dict(reader.latest) == {}
    first = await reader.current()
    assert first.records["VCS-10"].country == "Brazil" and first.loaded_at == {"VCS-10": 5}
    assert await reader.current() is first and (store.versions, store.loads) == (2, 1)
    store.rows[0].record["country"] = "Chile"
    store.revision += 1
    second = await reader.current()
    assert second.records["VCS-10"].country == "Chile" and store.loads == 2
    assert reader.latest is second.records


async def test_the_version_is_asked_at_most_once_per_max_age() -> None:
    store, clock = FakeStore(), [100.0]
    reader = _reader(store, clock)
    await asyncio.gather(*(reader.current(1.0) for _ in range(5)))
    assert (store.versions, store.loads) == (1, 1)  # concurrent callers shared one check
    store.revision += 1
    clock[0] += 0.5
    await reader.current(1.0)
    assert store.versions == 1  # within the age: no question asked
    clock[0] += 0.6
    await reader.current(1.0)
    assert (store.versions, store.loads) == (2, 2)


async def test_a_failing_database_is_raised_and_asked_again() -> None:
    store, clock = FakeStore(), [100.0]
    reader = _reader(store, clock)
    first = await reader.current(1.0)
    store.down = True
    clock[0] += 2
    with pytest.raises(Down):
        await reader.current(1.0)
    assert reader.latest is first.records  # what was read stays readable
    store.down = False
    assert await reader.current(1.0) is first


async def test_a_malformed_row_is_left_out() -> None:
    store = FakeStore()
    store.rows.append(ProjectRow(project_record(key="VCS-11", category="Unknown"), 6))
    records = await _reader(store, [0.0]).current()
    assert list(records.records) == ["VCS-10"]
