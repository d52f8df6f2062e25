"""A chain reset with the database kept: the daemon recognises the database belongs to
another chain (genesis hash) and refuses to start, naming the fix; the dev tooling gives the
new chain a database of its own, on which a retirement settles again."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from relayer.app import open_runtime
from relayer.config import ConfigError, Settings
from relayer.store.migrations import migrate
from relayer_dev import devdb, devnet
from relayer_dev.demo import run_demo
from relayer_dev.deploy import deploy_and_seed
from relayer_dev.settings import chain_database, dev_settings
from tests.conftest import PROJECTS, free_port

pytestmark = pytest.mark.integration


def _chain(state: Path, port: int) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """A chain deployed afresh, not from the run's template (tests/helpers/stacks.py): a reset
    is a new genesis hash on the same port, which a loaded state would not give."""
    proc = devnet.start_anvil(state, port, 84532)
    info = deploy_and_seed(devnet.rpc_url(port), 84532, PROJECTS)
    info["deploymentFile"] = str(state / "devnet.json")
    (state / "devnet.json").write_text(json.dumps(info))
    return proc, info


@pytest.mark.timeout(180)
async def test_a_reset_chain_is_refused_by_the_old_database_and_settles_on_a_new_one(
    tmp_path: Path, admin_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    dsn = devdb.create_scratch_database(admin_database_url, prefix="relayer_reset")
    migrate(dsn)
    proc, first = _chain(tmp_path / "first", port)
    try:
        settings = Settings(
            database_url=dsn,
            rpc_url=first["rpcUrl"],
            deployment_file=Path(first["deploymentFile"]),
            executor_private_key=first["executor"]["privateKey"],
        )
        async with open_runtime(settings, workers=False):
            pass  # the database now belongs to the first chain
        proc.terminate()
        proc.wait(timeout=10)
        # anvil's genesis is its start second: a chain restarted within the same second would
        # be the same chain. (A real `make devnet-down && make devnet` takes longer than that.)
        time.sleep(1.05 - time.time() % 1)
        proc, second = _chain(tmp_path / "second", port)  # same port, same chain id, new genesis
        assert second["genesisHash"] != first["genesisHash"]
        moved = settings.model_copy(update={"deployment_file": Path(second["deploymentFile"])})
        with pytest.raises(ConfigError) as refused:
            async with open_runtime(moved, workers=False):
                pytest.fail("a database must not serve two chains")
        assert first["genesisHash"][2:] in refused.value.message
        assert "fresh database" in refused.value.message
        # The dev tooling names a database after each chain instance's genesis.
        assert chain_database(first) != chain_database(second)
        monkeypatch.delenv("RELAYER_DATABASE_URL", raising=False)
        http = free_port()
        fresh = dev_settings(
            second,
            Settings(http_port=http, public_base_url=f"http://127.0.0.1:{http}", settle_wait_s=30),
        )
        assert fresh.database_url is not None
        assert fresh.database_url.get_secret_value().endswith("/" + chain_database(second))
        fresh_dsn = fresh.database_url.get_secret_value()
        migrate(fresh_dsn)
        try:
            result = await run_demo(fresh, second, amount="0.1", carbon_class="RE")
        finally:
            devdb.drop_database(fresh_dsn.rsplit("/", 1)[0] + "/postgres", chain_database(second))
        assert result["status"] == "settled", result
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])
