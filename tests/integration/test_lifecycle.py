"""The runtime's life cycle: resources opened before a failure are closed in reverse order,
and the failure itself comes out (nothing swallowed)."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from relayer import app
from relayer.app import open_runtime
from relayer.chain.node import ChainNode
from relayer.config import ConfigError
from tests.conftest import Daemon, free_port

pytestmark = pytest.mark.integration


async def test_a_failure_after_the_node_opened_closes_the_node(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[ChainNode] = []

    class RecordingNode(ChainNode):
        async def close(self) -> None:
            closed.append(self)
            await super().close()

    monkeypatch.setattr(app, "ChainNode", RecordingNode)
    unreachable = SecretStr(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere")
    settings = daemon.runtime.settings.model_copy(update={"database_url": unreachable})
    with pytest.raises(ConfigError) as refused:
        async with open_runtime(settings, workers=False):
            pytest.fail("the runtime must not open without its database")
    assert refused.value.message == (
        f"RELAYER_DATABASE_URL {unreachable.get_secret_value()}: connection refused; "
        "is Postgres running, and listening on that port?"
    )
    assert len(closed) == 1


async def test_an_error_inside_the_runtime_comes_out_after_everything_closed(daemon: Daemon) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with open_runtime(daemon.runtime.settings, workers=True) as rt:
            assert {t.get_name() for t in rt.tasks} == {
                "broadcaster",
                "catalogue-84532",
                "follower",
                "gauges",
                "listener",
                "order-keeper",
                "sweeper",
            }
            tasks = list(rt.tasks)
            raise Boom
    assert all(t.done() for t in tasks)
    assert not any(t.cancelled() for t in tasks), "every task stops by itself when asked, none is cancelled"
    assert rt.db.pool.is_closing()
