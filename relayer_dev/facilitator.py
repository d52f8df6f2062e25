"""The devnet's facilitator credentials (design: docs/design/x402-v2.md, C7): a dev API key
for ``/facilitator/verify`` and ``/facilitator/settle``, created once per devnet database and
recorded in ``.devdata/devnet.json`` as ``facilitatorApiKey`` beside ``facilitatorUrl`` and
``usdc``, so a standard x402 resource server or client on the devnet reads all it needs from
one file. :func:`create_facilitator_key` is the one place the dev tooling and the tests make
such a key."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Final

from relayer.admin import create_api_key
from relayer.config import Settings
from relayer.store.migrations import migrate

DEV_KEY_NAME: Final = "devnet facilitator"


async def create_facilitator_key(settings: Settings, name: str = DEV_KEY_NAME) -> str:
    """A new API key (``mk_…`` bearer token, shown once; only its SHA-256 is stored) in the
    (migrated) database of ``settings``, of scope ``facilitator`` (verify and settle), with
    the settings' default rate limit and daily gas budget.

    Raises:
        StoreUnavailable: the database failed.
    """
    return await create_api_key(settings, name, ["facilitator"])


def record_facilitator_key(devnet_file: Path, settings: Settings) -> dict[str, Any]:
    """``devnet_file``'s description with ``facilitatorApiKey``: the one it records (kept:
    ``up`` reuses the chain and its database), else a new key from
    :func:`create_facilitator_key` (the database migrated first), written into the file
    atomically with mode 0600 (it holds a secret).

    Raises:
        OSError: the file cannot be read or written.
        StoreUnavailable: the database failed.
    """
    described: dict[str, Any] = json.loads(devnet_file.read_text())
    if isinstance(described.get("facilitatorApiKey"), str):
        return described
    assert settings.database_url is not None
    migrate(settings.database_url.get_secret_value())
    described["facilitatorApiKey"] = asyncio.run(create_facilitator_key(settings))
    tmp = devnet_file.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(described, indent=2) + "\n")
    os.replace(tmp, devnet_file)
    return described
