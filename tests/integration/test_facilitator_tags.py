"""A front-runner's transfer under ``RELAYER_CONFIRMATION=safe`` (issue 20): the facilitator's
settle of a payment whose authorization another sender used first answers success only once
that sender's block is at or below the node's ``safe`` block, the same block the follower
settles our own transactions at; before that, ``settlement_pending`` with the front-runner's
transaction. On a real anvil (``safe`` = latest - 32, see test_confirmation_tags.py) and
Postgres, with a daemon of its own; the test mines every block (``evm_mine``) and asks at every
head, so "pending" is observed at each head whose safe block is below the front-runner's, never
inferred. The tag's horizon (900 s of blocks: 45 at the 20 s block time set here) is deeper
than anvil's 32: a settle judged by that block count would still be pending at the head whose
safe block reaches it (the test first mines that many blocks over the deployment, so that such
a count reads the token at a block where it exists)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from relayer.admin import create_api_key
from tests.chain_helpers import token_balance
from tests.helpers.facilitator import call, fresh_address, payment, submit_directly
from tests.helpers.reorgs import LAG, head_block, tagged_block
from tests.private import private_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_under_safe_a_front_runners_transfer_is_success_once_its_block_is_safe(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(
        tmp_path,
        admin_database_url,
        confirmations=None,
        confirmation="safe",
        block_time_ms=20_000,  # the horizon: 900 s = 45 blocks, few to mine, more than anvil's 32
        facilitator_settle_wait_s=0.1,  # a pending answer waits this long before it answers (32 of them)
    ) as (d, anvil):
        policy = d.runtime.settings.confirmation_policy()
        assert policy.tag == "safe" and policy.depth > LAG["safe"] + 1, (
            "the horizon is deeper than anvil's safe lag"
        )
        # Bury the deployment under the horizon: a settle judged by that block count reads the
        # token at a block where it exists, and answers pending, not a node failure.
        anvil.rpc("anvil_mine", hex(policy.depth))
        key = await create_api_key(d.runtime.settings, f"fronttag-{uuid.uuid4().hex[:6]}", ["facilitator"])
        pay_to, value = fresh_address(), 6_543
        body = payment(d, pay_to, value)
        other = "0x" + submit_directly(d, body).hex()  # automine: its own block, the head
        block = head_block(anvil)
        pending_at = []
        while (safe := tagged_block(anvil, "safe")) < block:
            assert safe == max(0, head_block(anvil) - LAG["safe"]), "anvil's safe is latest - 32"
            status, answer = await call(d, "settle", body, key)
            assert status == 200, answer
            assert (answer["success"], answer["errorReason"], answer["transaction"]) == (
                False,
                "settlement_pending",
                other,
            ), (safe, answer)
            pending_at.append(head_block(anvil))
            anvil.mine()
        assert safe == block and pending_at == list(range(block, block + LAG["safe"]))
        status, answer = await call(d, "settle", body, key)
        assert status == 200 and (answer["success"], answer["transaction"]) == (True, other), (
            head_block(anvil),
            answer,
        )
        assert answer["amount"] == str(value)
        assert await token_balance(d.runtime.node, "usdc", pay_to) == value
        sent = await d.runtime.db.fetchval(
            "SELECT count(*) FROM relay_transactions t JOIN relay_jobs j ON j.id = t.job_id "
            "WHERE j.kind = 'transfer' AND j.summary->>'nonce' = $1",
            body["paymentPayload"]["payload"]["authorization"]["nonce"],
        )
        assert sent == 0, "nothing of ours was sent"
        print(
            f"\nsafe: front-run in {block}, pending at heads {block}..{block + LAG['safe'] - 1}, "
            f"success at {head_block(anvil)}"
        )
