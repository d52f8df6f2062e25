"""Settling at the node's ``safe`` or ``finalized`` head (``RELAYER_CONFIRMATION=safe|finalized``,
issue 20, item 2), on a real anvil and Postgres through the daemon's own workers.

anvil (1.7.1, the pinned ``@foundry-rs/anvil``) derives both tags from the latest block:
``safe`` = latest - ``--slots-in-an-epoch`` (default 32), ``finalized`` = latest - 2 x slots
(64), both at least 0; the first test checks that premise on the chain itself. The test mines
every block (``evm_mine``) and after each one waits until the follower has indexed through the
tag's block (its ``relayer_indexed_block`` gauge): proof that it judged that head. Only then
does it look at the job, so "not settled yet" is observed at every head, never inferred from
a sleep. A relayed retirement mined in block B stays ``mined`` (no retirement row, no answer,
no ``confirmed`` transition) at every head whose tag is below B, and is settled (``indexed``,
one row, the answer ``settled``) at the first head whose tag is B. The catalogue indexer of the
chain never indexes past the tag. Under ``safe``, a reorg taking B while B is above the safe
head is undone once (the job back to ``submitted``), nothing is settled on the lost chain, and
the re-sent transaction settles once its new block is at the safe head."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from relayer.chain.blocks import BlockReader
from relayer.chain.node import ChainNode
from relayer.chain.reads import ChainReads
from relayer.chain.types import Contracts
from relayer.domain.confirmation import ConfirmationPolicy
from relayer.workers.reorg import Confirmed
from relayer_dev import devnet
from tests.conftest import Daemon, free_port
from tests.helpers.jobs import job_row, wait_for_job
from tests.helpers.relay import signed_retirement
from tests.helpers.reorgs import LAG, Tag, halted, head_block, on_chain, retirements_of, tagged_block
from tests.private import Anvil, private_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _transitions(d: Daemon, state: str) -> float:
    value: float = d.runtime.metrics.job_transitions.labels(state)._value.get()
    return value


async def _judged(d: Daemon, anvil: Anvil, tag: Tag, timeout_s: float = 10.0) -> int:
    """Until the follower has indexed through the node's ``tag`` block at the current head
    (it judged this head: it confirms before it indexes); that block's number. Also checks
    the catalogue indexer is not past the tag."""
    tagged = tagged_block(anvil, tag)
    assert tagged == max(0, head_block(anvil) - LAG[tag]), "anvil's tag is latest - slots (x2 finalized)"
    deadline = time.monotonic() + timeout_s
    while d.runtime.metrics.indexed_block.labels(str(d.runtime.settings.chain_id))._value.get() < tagged:
        assert time.monotonic() < deadline, f"the follower did not index through the {tag} block {tagged}"
        await asyncio.sleep(0.02)
    assert d.runtime.metrics.indexed_block.labels(str(d.runtime.settings.chain_id))._value.get() == tagged, (
        "the follower indexed past the tag"
    )
    catalogue = d.runtime.metrics.catalogue_block.labels(str(d.runtime.settings.chain_id))._value.get()
    assert catalogue <= tagged, f"the catalogue indexer indexed block {catalogue}, past the {tag} block"
    return tagged


async def _settles_at_tag(
    d: Daemon, anvil: Anvil, tag: Tag, body: dict[str, Any], answer: asyncio.Task[Any], block: int
) -> None:
    """Mine one block at a time: while the ``tag`` block is below ``block`` the job (mined in
    ``block``) is not settled; at the first head whose tag block is ``block`` it is."""
    confirmed, indexed = _transitions(d, "confirmed"), _transitions(d, "indexed")
    steps = 0
    while (tagged := await _judged(d, anvil, tag)) < block:
        job = await job_row(d, body)
        assert (job["state"], job["block_number"]) == ("mined", block), (tagged, dict(job))
        assert not answer.done() and await retirements_of(d, "0x" + bytes(job["tx_hash"]).hex()) == 0
        assert (_transitions(d, "confirmed"), _transitions(d, "indexed")) == (confirmed, indexed)
        anvil.mine()
        steps += 1
    assert tagged == block and steps >= 1
    job = await wait_for_job(d, body, {"indexed"})
    status, result = await asyncio.wait_for(answer, 10)
    assert (status, result["status"]) == (200, "settled"), result
    assert head_block(anvil) == block + LAG[tag], "settled at the head whose tag reached the block"
    assert await retirements_of(d, result["transactionHash"]) == 1
    assert (_transitions(d, "confirmed"), _transitions(d, "indexed")) == (confirmed + 1, indexed + 1)
    catalogue = d.runtime.metrics.catalogue_block.labels(str(d.runtime.settings.chain_id))
    deadline = time.monotonic() + 10
    while catalogue._value.get() < block:  # the catalogue indexer reaches the tag, no further
        assert time.monotonic() < deadline, "the catalogue indexer did not index through the tag"
        await asyncio.sleep(0.02)
    assert catalogue._value.get() == block


async def _warmed(d: Daemon, anvil: Anvil, tag: Tag) -> None:
    """Mine until the tag block is past the deployment block, so that the follower indexes
    (and shows it judged) every head from here on."""
    assert d.runtime.settings.confirmation_policy().tag == tag
    while tagged_block(anvil, tag) <= d.runtime.deploy_block:
        anvil.mine()
    await _judged(d, anvil, tag)


@pytest.mark.parametrize("tag", ["safe", "finalized"])
async def test_a_retirement_settles_when_its_block_reaches_the_tag_and_not_a_block_earlier(
    tmp_path: Path, admin_database_url: str, tag: Tag
) -> None:
    async with private_daemon(
        tmp_path,
        admin_database_url,
        confirmations=None,
        confirmation=tag,
        resend_after_s=1.0,
        settle_wait_s=60,
    ) as (d, anvil):
        await _warmed(d, anvil, tag)
        body = await signed_retirement(d, 0)
        answer = asyncio.create_task(d.post(body))
        job = await wait_for_job(d, body, {"mined"})  # automine: its own block, the head
        block = job["block_number"]
        assert block == head_block(anvil) == on_chain(anvil, "0x" + bytes(job["tx_hash"]).hex())
        await _settles_at_tag(d, anvil, tag, body, answer, block)
        print(
            f"\n{tag}: mined in {block}, not settled at heads {block}..{block + LAG[tag] - 1}, "
            f"settled at {block + LAG[tag]}"
        )


async def test_under_safe_a_reorg_above_the_safe_head_is_undone_once_and_never_settled(
    tmp_path: Path, admin_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    depth = 6  # the block with it and five over it: all above the safe head (32 under the head)
    async with private_daemon(
        tmp_path,
        admin_database_url,
        confirmations=None,
        confirmation="safe",
        resend_after_s=1.0,
        settle_wait_s=60,
    ) as (d, anvil):
        await _warmed(d, anvil, "safe")
        body = await signed_retirement(d, 0)
        answer = asyncio.create_task(d.post(body))
        job = await wait_for_job(d, body, {"mined"})
        tx_hash, mined_in = "0x" + bytes(job["tx_hash"]).hex(), job["block_number"]
        for _ in range(depth - 1):
            anvil.mine()
        assert await _judged(d, anvil, "safe") < mined_in  # the follower saw the head over it
        assert (await job_row(d, body))["state"] == "mined"
        anvil.automine(False)  # hold the re-sent transaction until the test mines it
        with caplog.at_level(logging.INFO):
            anvil.rpc("anvil_reorg", depth, [])  # the block with it, and those over it, are gone
            assert on_chain(anvil, tx_hash) is None
            job = await wait_for_job(d, body, {"submitted"})
            assert job["block_number"] is None and not answer.done()
            assert await retirements_of(d, tx_hash) == 0
            assert (_transitions(d, "confirmed"), _transitions(d, "indexed")) == (0, 0), "never settled"
            deadline = time.monotonic() + 15
            while tx_hash not in anvil.pool():  # the same bytes, re-sent
                assert time.monotonic() < deadline, "not re-sent"
                await asyncio.sleep(0.05)
            anvil.mine()
            again_in = on_chain(anvil, tx_hash)
            assert again_in == head_block(anvil)
            await wait_for_job(d, body, {"mined"})
            await _settles_at_tag(d, anvil, "safe", body, answer, again_in)
            undone = [
                r for r in caplog.records if r.name.endswith("follower") and "reorg: undid" in r.getMessage()
            ]
        assert [(r.ancestor, r.jobs) for r in undone] == [(mined_in - 1, 1)], "undone exactly once"  # type: ignore[attr-defined]
        assert (_transitions(d, "confirmed"), _transitions(d, "indexed")) == (1, 1)
        assert halted(d) == 0.0
        print(f"\nsafe: mined in {mined_in}, reorg of {depth} undone once, settled again from {again_in}")


async def test_the_tag_under_a_head_read_past_the_cache_is_read_at_that_head(tmp_path: Path) -> None:
    """A fresh head read (``ChainReads.latest_block``, as the facilitator's front-run check
    makes) is news of the head: the tag confirmed under it is read at that head, not the
    node's earlier head still within its cache (stop 28's CI: a settle right after a new
    block answered pending at the head whose safe block held the front-runner's transfer)."""
    port = free_port()
    process = devnet.start_anvil(tmp_path, port, 84532)
    node = ChainNode(devnet.rpc_url(port), 84532, Contracts(*["0x" + "00" * 20] * 7))
    node.read_ttl_s = 3600.0  # the earlier head's reads stay cached for the whole test
    try:
        anvil = Anvil(devnet.rpc_url(port))
        anvil.rpc("anvil_mine", hex(LAG["safe"] + 2))
        confirmed = Confirmed(BlockReader(node), ConfirmationPolicy.at_tag("safe", 2000))
        head = await node.head()
        assert await confirmed.through(head) == head - LAG["safe"] == tagged_block(anvil, "safe")
        anvil.mine()
        newer = await ChainReads(node).latest_block()
        assert newer == head + 1
        assert await confirmed.through(newer) == newer - LAG["safe"] == tagged_block(anvil, "safe")
    finally:
        await node.close()
        process.terminate()
        process.wait(timeout=10)
