"""Fixtures several test modules share, registered for the whole suite by ``pytest_plugins``
in ``tests/conftest.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.private import private_chain


@pytest.fixture(scope="module")
async def chain_and_db(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, admin_database_url: str
) -> AsyncIterator[tuple[dict[str, Any], str]]:
    """A private chain and migrated scratch database for one test module (the devnet
    description, with its treasury, and the database URL), shared by its tests: what the
    x402 resource, the payment proofs, the SDK-paid retirements and the orders start their
    daemons on (its state in a temporary directory named after the module)."""
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    async with private_chain(tmp_path_factory.mktemp(name), admin_database_url) as made:
        yield made
