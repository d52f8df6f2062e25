"""One project model (issue 17): x402 discover's country, category and methodology filters and
the marketplace read the same catalogue in the database, so ``relayer catalogue load`` with a
changed projects file moves both while the daemon runs (the start-up file no longer decides
discover's filters). Runs on its own scratch database: the catalogue is changed here.

Naming: discover's ``projectId`` is the credit's project key (``VCS-10``); the marketplace's
``projectID`` is the registry's number (``10``), its ``key`` the project key."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from relayer.app import open_runtime, web_runner
from relayer.config import Settings
from relayer.store.catalogue import CatalogueStore
from relayer.store.migrations import migrate
from relayer_dev import devdb
from tests.conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
PROJECTS: list[dict[str, Any]] = json.loads((ROOT / "data" / "carbon-projects.json").read_text())
COUNTRY = "Atlantis (test)"  # no project of the data set names it
METHODOLOGY = {"id": "TEST-0001", "name": "test methodology"}
ADDED = {
    **copy.deepcopy(PROJECTS[0]),
    "key": "VCS-999999",
    "projectID": "999999",
    "name": "Added by the catalogue load test",
    "country": COUNTRY,
    "methodologies": [],
    "description": "",
}


@dataclass
class Site:
    base: str
    dsn: str
    session: aiohttp.ClientSession

    async def get(self, path: str, **params: Any) -> tuple[int, Any, Any]:
        async with self.session.get(f"{self.base}{path}", params=params) as r:
            return r.status, await r.json(content_type=None), r.headers

    async def discovered(self, **filters: str) -> set[str]:
        """The project keys (discover's ``projectId``) of the credits discover lists."""
        status, body, _ = await self.get("/api/discover", **filters)
        assert status == 200, body
        keys = {c["projectId"] for cls in body["carbonClasses"] for c in cls["creditsDetailed"]}
        return keys | {li["projectId"] for li in body["marketplaceListings"]}


@pytest.fixture(scope="module")
async def site(chain: dict[str, Any], admin_database_url: str) -> AsyncIterator[Site]:
    """The daemon's API (no workers) on its own database, seeded with the packaged catalogue."""
    dsn = devdb.create_scratch_database(admin_database_url)
    migrate(dsn)
    port = free_port()
    settings = Settings(
        database_url=dsn,
        rpc_url=chain["rpcUrl"],
        chain_id=chain["chainId"],
        deployment_file=Path(chain["deploymentFile"]),
        executor_private_key=chain["spareExecutors"][0]["privateKey"],
        http_port=port,
        public_base_url=f"http://127.0.0.1:{port}",
        rate_limit="off",
    )
    async with open_runtime(settings, workers=False) as rt:
        runner = web_runner(rt)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            yield Site(f"http://127.0.0.1:{port}", dsn, session)
        await runner.cleanup()
    devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])


async def _catalogue_load(dsn: str, records: list[dict[str, Any]], path: Path) -> str:
    """``relayer catalogue load --file path`` as the operator runs it (this worktree's code)."""
    path.write_text(json.dumps(records))
    env = {**os.environ, "RELAYER_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "relayer",
        "catalogue",
        "load",
        "--file",
        str(path),
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, (out, err)
    return out.decode()


async def _eventually(check: Callable[[], Awaitable[bool]], within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not await check():
        assert time.monotonic() < deadline, "the change did not show within the time limit"
        await asyncio.sleep(0.2)


async def test_catalogue_load_moves_discover_filters_and_the_marketplace(site: Site, tmp_path: Path) -> None:
    listed = sorted(await site.discovered())
    assert listed, "discover lists no credit"
    by_key = {p["key"]: p for p in PROJECTS}
    moved = by_key[listed[0]]
    old_country, old_category = moved["country"], moved["category"]
    new_category = next(
        c for c in ("Blue Carbon", "Other Nature Based", "Industrial Processing") if c != old_category
    )
    assert moved["key"] in await site.discovered(country=old_country, category=old_category)
    assert await site.discovered(country=COUNTRY) == set()
    assert await site.discovered(methodology=METHODOLOGY["id"]) == set()

    changed = copy.deepcopy(PROJECTS)
    for record in changed:
        if record["key"] == moved["key"]:
            record.update(country=COUNTRY, category=new_category, methodologies=[METHODOLOGY])
    out = await _catalogue_load(site.dsn, [*changed, ADDED], tmp_path / "projects.json")
    assert "649 projects read, 2 inserted or changed" in out

    async def discover_follows() -> bool:
        return await site.discovered(country=COUNTRY) == {moved["key"]}

    await _eventually(discover_follows)
    assert moved["key"] in await site.discovered(category=new_category)
    assert moved["key"] not in await site.discovered(category=old_category)
    assert moved["key"] not in await site.discovered(country=old_country)
    assert await site.discovered(methodology=METHODOLOGY["id"].lower()) == {moved["key"]}

    async def marketplace_follows() -> bool:
        status, body, _ = await site.get("/carbonProjects", country=COUNTRY, limit=100)
        return status == 200 and sorted(p["key"] for p in body) == sorted([moved["key"], ADDED["key"]])

    await _eventually(marketplace_follows)
    status, _, headers = await site.get("/carbonProjects", limit=1)
    assert status == 200 and headers["X-Total-Count"] == str(len(PROJECTS) + 1)
    status, project, _ = await site.get(f"/carbonProjects/{moved['key']}")
    assert status == 200 and project["country"] == COUNTRY
    assert project["methodologies"] == [{**METHODOLOGY, "category": new_category}]
    status, added, _ = await site.get(f"/carbonProjects/{ADDED['key']}")
    assert status == 200
    assert added["methodologies"] == [{"id": "", "category": ADDED["category"], "name": ""}]


async def test_the_catalogue_version_moves_with_every_change(site: Site, db_of: Any) -> None:
    """Readers reload when the version moves: a change loaded in the same second as the one
    before (same ``loaded_at``) moves it too; a load that changes nothing does not."""
    store = CatalogueStore(await db_of(site.dsn))
    record = {**ADDED, "key": "VCS-999998", "projectID": "999998"}
    assert await store.load_projects([record], 1_700_000_000) == 1
    first = await store.version()
    assert await store.load_projects([{**record, "country": "Elsewhere (test)"}], 1_700_000_000) == 1
    second = await store.version()
    assert second != first
    assert await store.load_projects([{**record, "country": "Elsewhere (test)"}], 1_700_000_000) == 0
    assert await store.version() == second
