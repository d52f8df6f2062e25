"""A chain swapped under a running daemon (issue 18): the node behind ``RELAYER_RPC_URL`` is
reset (a new genesis, the same chain id and contract addresses) while the workers run. No
worker takes it for a deep reorg: nothing settled is rewound, no retirement deleted, no no-op
signed, nothing sent; the chain identity metric and one log line say why; when the recorded
chain is back, work resumes and a new retirement settles. And a nonce gap larger than the
lane's in-flight window halts the lane (no no-ops) until it closes."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account

from relayer.domain.lane import IN_FLIGHT_WINDOW
from relayer.workers.chain_guard import RECHECK_S
from relayer_dev import devnet
from relayer_dev.deploy import deploy_and_seed
from tests.conftest import PROJECTS, Daemon, free_port
from tests.helpers.jobs import job_row
from tests.helpers.relay import signed_retirement
from tests.private import Anvil, daemon_settings, private_chain, private_daemon, serving
from tests.processes import RpcProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

OLD_NONCE = 100
"""The executor's nonce on the first chain: the new chain's is 0, a gap of 100."""
SWAPPED_FOR_S = 2 * RECHECK_S + 0.5
"""How long the node answers the other chain once the daemon has seen it: two of the guard's
re-checks (each finding the other chain again, one log line for all) and longer than the
lane's patience (1 s)."""


async def _counts(d: Daemon) -> dict[str, int]:
    db = d.runtime.db
    sent = sum(
        s.value
        for m in d.runtime.metrics.broadcasts.collect()
        for s in m.samples
        if s.name.endswith("_total")
    )
    return {
        "settled": int(await db.fetchval("SELECT count(*) FROM relay_jobs WHERE state = 'indexed'")),
        "retirements": int(await db.fetchval("SELECT count(*) FROM retirements")),
        "noops": int(await db.fetchval("SELECT count(*) FROM relay_transactions WHERE kind = 'noop'")),
        "sends": int(sent),
    }


def _gauge(d: Daemon, name: str) -> float:
    for metric in d.runtime.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0


def _second_chain(state: Path) -> tuple[Any, dict[str, Any]]:
    """A chain deployed afresh, not from the run's template (tests/helpers/stacks.py): its
    genesis hash must differ from the first chain's, which is the swap."""
    state.mkdir(parents=True, exist_ok=True)
    port = free_port()
    proc = devnet.start_anvil(state, port, 84532)
    return proc, deploy_and_seed(devnet.rpc_url(port), 84532, PROJECTS)


async def test_a_chain_swapped_under_a_running_daemon_halts_the_workers_until_it_is_back(
    tmp_path: Path, admin_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with private_chain(tmp_path / "first", admin_database_url) as (info, dsn):
        first = Anvil(info["rpcUrl"])
        executor = info["executor"]["address"]
        first.rpc("anvil_setNonce", executor, hex(OLD_NONCE))  # the old chain's lane is far ahead
        time.sleep(1.05 - time.time() % 1)  # anvil's genesis is its start second
        proc, other = _second_chain(tmp_path / "second")
        try:
            assert other["genesisHash"] != info["genesisHash"]
            assert other["contracts"] == info["contracts"]  # the same addresses, another chain
            second = Anvil(other["rpcUrl"])
            async with RpcProxy(info["rpcUrl"]) as proxy:
                settings = daemon_settings(
                    info, dsn, free_port(), rpc_url=proxy.url, hole_after_s=1.0, resend_after_s=1.0
                )
                async with serving(settings, info) as d:
                    await _swap_and_back(d, proxy, first, second, info, other, caplog)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def _swap_and_back(
    d: Daemon,
    proxy: RpcProxy,
    first: Anvil,
    second: Anvil,
    info: dict[str, Any],
    other: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    hashes = []
    for payer in range(3):
        status, answer = await d.post(await signed_retirement(d, payer))
        assert (status, answer["status"]) == (200, "settled"), answer
        hashes.append(answer["transactionHash"])
    before = await _counts(d)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        proxy.upstream = other["rpcUrl"]  # the node is reset under the running daemon
        deadline = time.monotonic() + 10
        while _gauge(d, "relayer_chain_identity_mismatch") != 1.0:
            assert time.monotonic() < deadline, "the other chain was not seen"
            await asyncio.sleep(0.05)
        await asyncio.sleep(SWAPPED_FOR_S)
        during = await _counts(d)
        undone = [r for r in caplog.records if "reorg: undid" in r.getMessage()]
        rewound = sum(int(getattr(r, "jobs", 0)) for r in undone)
        deleted = sum(int(getattr(r, "retirements", 0)) for r in undone)
        replayed = sum(1 for h in hashes if second.rpc("eth_getTransactionByHash", h) is not None)
        mismatch = _gauge(d, "relayer_chain_identity_mismatch")
        halted = _gauge(d, "relayer_halted_steps_total")
        why = [r for r in caplog.records if "another chain" in r.getMessage()]
        print(
            "\nchain swapped under the daemon for "
            f"{SWAPPED_FOR_S:.1f} s after it was seen: reorgs undone {len(undone)}, jobs rewound {rewound}, "
            f"retirements deleted {deleted}, "
            f"no-ops signed {during['noops'] - before['noops']}, sends {during['sends'] - before['sends']}, "
            f"old transactions on the new chain {replayed}; mismatch gauge {mismatch}, "
            f"halted steps {halted}, log lines {len(why)}"
        )
        assert (undone, rewound, deleted) == ([], 0, 0), "nothing settled is rewound"
        assert during["settled"] == before["settled"], "no settled job is rewound"
        assert during["retirements"] == before["retirements"], "no retirement is deleted"
        assert during["noops"] == before["noops"], "no no-op is signed"
        assert during["sends"] == before["sends"], "nothing is sent"
        assert replayed == 0
        assert mismatch == 1.0 and halted > 0
        assert len(why) == 1, [r.getMessage() for r in why]
        assert info["genesisHash"][2:] in why[0].getMessage() or info["genesisHash"] in str(why[0].__dict__)

        proxy.upstream = info["rpcUrl"]  # the recorded chain is back
        deadline = time.monotonic() + 15
        while _gauge(d, "relayer_chain_identity_mismatch") != 0.0:
            assert time.monotonic() < deadline, "work did not resume"
            await asyncio.sleep(0.1)
    status, answer = await d.post(await signed_retirement(d, 0))
    assert (status, answer["status"]) == (200, "settled"), answer
    after = await _counts(d)
    assert after["settled"] == before["settled"] + 1
    assert after["retirements"] == before["retirements"] + 1
    assert after["noops"] == before["noops"]
    assert (
        int(first.rpc("eth_getTransactionCount", info["executor"]["address"], "latest"), 16) == OLD_NONCE + 4
    )


def _fill_from_outside(anvil: Anvil, key: str, count: int) -> None:
    """Mine ``count`` zero-value self-transfers from the executor key at nonces 0.. (not
    journaled: as if the lane's missing transactions had come from elsewhere)."""
    account = Account.from_key(key)
    for nonce in range(count):
        tx = {
            "to": account.address,
            "value": 0,
            "gas": 21_000,
            "maxFeePerGas": 10**10,
            "maxPriorityFeePerGas": 10**9,
            "nonce": nonce,
            "chainId": 84532,
            "type": 2,
        }
        signed = account.sign_transaction(tx)
        anvil.rpc("eth_sendRawTransaction", "0x" + bytes(signed.raw_transaction).hex())


async def test_a_nonce_gap_beyond_the_in_flight_window_halts_the_lane_until_it_closes(
    tmp_path: Path, admin_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    gap = IN_FLIGHT_WINDOW + 8
    fast = {"resend_after_s": 1.0, "replace_after_s": 1.0, "hole_after_s": 1.0}
    async with private_daemon(tmp_path, admin_database_url, **fast) as (d, anvil):
        executor = d.chain["executor"]["address"]
        bump = (
            "UPDATE executor_nonces SET next_nonce = next_nonce + $2 WHERE executor = $1 RETURNING next_nonce"
        )
        deadline = time.monotonic() + 10
        while await d.runtime.db.fetchval(bump, executor, gap) is None:  # not reconciled yet
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        with caplog.at_level(logging.INFO):
            body = await signed_retirement(d, 0)
            answer = asyncio.create_task(d.post(body))
            deadline = time.monotonic() + 15
            while d.runtime.metrics.nonce_gap.labels("0")._value.get() != 1:
                assert time.monotonic() < deadline, "the lane did not halt"
                await asyncio.sleep(0.1)
            await asyncio.sleep(2.0)  # a few upkeeps more: still no no-op
            noops = int(
                await d.runtime.db.fetchval("SELECT count(*) FROM relay_transactions WHERE kind = 'noop'")
            )
            why = [r for r in caplog.records if r.getMessage().startswith("nonce gap: the lane halts")]
            print(
                f"\nnonce gap of {gap} (window {IN_FLIGHT_WINDOW}): "
                f"no-ops signed {noops}, log lines {len(why)}"
            )
            assert noops == 0 and len(why) == 1 and getattr(why[0], "gap", None) == gap
            assert d.runtime.metrics.halted_steps.labels("broadcaster", "nonce_gap")._value.get() > 0
            _fill_from_outside(anvil, d.chain["executor"]["privateKey"], gap)  # the gap closes
            deadline = time.monotonic() + 30
            while (await job_row(d, body))["state"] != "indexed":  # the lane resumed: it settles
                assert time.monotonic() < deadline, "the lane did not resume"
                anvil.mine()
                await asyncio.sleep(0.5)
            await answer
        deadline = time.monotonic() + 10
        while d.runtime.metrics.nonce_gap.labels("0")._value.get() != 0:  # the next upkeep
            assert time.monotonic() < deadline, "the lane stayed halted"
            await asyncio.sleep(0.1)
