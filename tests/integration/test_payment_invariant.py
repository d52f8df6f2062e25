"""The payment invariant under a payer who works against us (issue 35, deliverable 7):
hypothesis draws runs of payments, each through the facilitator (``/settle`` to a merchant) or
the standard x402 resource (``PAYMENT-SIGNATURE`` to the treasury), each with one payer action
(nothing, cancel the nonce, spend it on a 1-unit transfer to itself, transfer the whole balance
away, front-run the payload) before or during our settle, and optionally a 1-block reorg after
it (an empty replacement block, or one holding the payer's cancel). Blocks come every 0.3 s
and the daemon confirms at depth 2, so every reorg is within its confirmation policy.

After each run, on the chain: every ``success: true`` the daemon ever answered names a
successful transaction holding the token's ``Transfer(payer, payTo, amount)``; a merchant holds
the amount exactly when the answer (asked again) is a success; every USDC the treasury sent
out for a payment (retirement, refund) is matched by USDC the chain shows it received for that
payment (``relayer ledger``'s rows agree, each received value is a proven transfer), and the
treasury's balance moved by exactly what the ledger says it received less what it paid out.

Hypothesis runs in a worker thread (the daemon serves in the test's loop); the chain actions
are synchronous web3 from that thread."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import pytest
from eth_account import Account
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from web3 import Web3

from relayer.admin import create_api_key
from relayer.chain.signer import TreasurySigner
from relayer.service.payments.quotes import payment_ledger
from relayer.store.x402_payments import X402Payments
from tests.chain_helpers import transact_as_deployer
from tests.conftest import Daemon
from tests.helpers import payer as payer_acts
from tests.helpers.facilitator import call, payment, submit_directly
from tests.helpers.x402 import (
    decode,
    nonce_of,
    post,
    required,
    resource,
    retire_body,
    sign_payload,
    submit_payload,
    usdc,
)
from tests.private import Anvil, private_chain

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

T = TypeVar("T")
ACTIONS: Final = ("nothing", "cancel", "self_transfer", "transfer_away", "front_run")
REORGS: Final = ("none", "drop", "cancel")
FACILITATOR_AMOUNT: Final = 1_000_000
TRANSFER_TOPIC: Final = Web3.keccak(text="Transfer(address,address,uint256)")
FINAL: Final = ("retired", "refunded", "failed")
EXAMPLES: Final = 12
EXPIRY_MARGIN_S: Final = 15  # past validBefore: the confirming blocks and a keeper turn


@dataclass(frozen=True)
class Step:
    surface: str  # "facilitator" | "resource"
    action: str  # one of ACTIONS
    during: bool  # the action while our settle is in flight (else before it)
    reorg: str  # one of REORGS


STEPS: Final = st.builds(
    Step,
    st.sampled_from(["facilitator", "resource"]),
    st.sampled_from(ACTIONS),
    st.booleans(),
    st.sampled_from(REORGS),
)


@dataclass
class Answer:
    """One success-or-failure answer: ``success``, the transaction it names, from whom to
    whom for how much (atomic USDC)."""

    success: bool
    transaction: str
    payer: str
    pay_to: str
    amount: int


@dataclass
class World:
    d: Daemon
    key: str
    loop: asyncio.AbstractEventLoop
    anvil: Anvil
    w3: Web3
    treasury_start: int
    answers: list[Answer] = field(default_factory=list)
    # facilitator payloads (body, merchant) and resource payloads (body, header) to ask again
    settles: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    posts: list[tuple[dict[str, Any], str, str]] = field(default_factory=list)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)


@contextlib.asynccontextmanager
async def ticking(anvil: Anvil, every_s: float = 0.3) -> AsyncIterator[None]:
    """A block every ``every_s`` seconds beside automining (so depth-2 confirmations come)."""

    async def tick() -> None:
        while True:
            await asyncio.sleep(every_s)
            with contextlib.suppress(Exception):  # a mine racing a reorg: the next one comes
                await asyncio.to_thread(anvil.mine)

    task = asyncio.create_task(tick())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def funded(info: dict[str, Any], usdc_atomic: int) -> dict[str, str]:
    account = Account.create()
    transact_as_deployer(info, info["contracts"]["usdc"], "UsdcEip3009", "mint", account.address, usdc_atomic)
    return {"address": account.address, "privateKey": "0x" + bytes(account.key).hex()}


def act(w: World, action: str, payer: dict[str, str], nonce: bytes, front_run: Any) -> None:
    """The payer's move against its own authorization (``front_run``: submits the payload)."""
    info = w.d.chain
    # while our settle is in flight, ours may have used the nonce first: the move then reverts
    if action == "cancel":
        payer_acts.send(info, payer_acts.cancel_call(info, payer["privateKey"], nonce))
    elif action == "self_transfer":
        own = Account.from_key(payer["privateKey"]).address
        payer_acts.send(info, payer_acts.spend_call(info, payer["privateKey"], own, 1, nonce))
    elif action == "transfer_away":
        held = int(w.run(usdc(w.d, payer["address"])))
        if held:  # ours may move some of it first: the drain of what was held then reverts
            away = str(Account.create().address)
            payer_acts.send(
                info, payer_acts.spend_call(info, payer["privateKey"], away, held, payer_acts.new_nonce())
            )
    elif action == "front_run":
        with contextlib.suppress(Exception):  # ours may have used the nonce already
            front_run()


def reorg(w: World, kind: str, payer: dict[str, str], nonce: bytes) -> None:
    """A 1-block reorg (within the depth-2 policy): an empty block, or one with the payer's
    cancel (sent by the seller, whose nonce no dropped transaction holds)."""
    if kind == "none":
        return
    time.sleep(0.4)  # the follower sees the head first
    blocks: list[Any] = []
    if kind == "cancel":
        call_data = payer_acts.cancel_call(w.d.chain, payer["privateKey"], nonce)
        blocks = [[payer_acts.send(w.d.chain, call_data, raw=True, role="seller"), 0]]
    w.anvil.rpc("anvil_reorg", 1, blocks)
    time.sleep(0.6)  # the follower rewinds before the next step


async def _in_flight(request: Coroutine[Any, Any, T], then: Any) -> T:
    task = asyncio.ensure_future(request)
    await asyncio.sleep(0.05)
    await asyncio.to_thread(then)
    return await task


def settle_step(w: World, step: Step) -> None:
    payer, merchant = funded(w.d.chain, 5_000_000), str(Account.create().address)
    body = payment(w.d, merchant, FACILITATOR_AMOUNT, key=payer["privateKey"], payer=payer["address"])
    nonce = bytes.fromhex(body["paymentPayload"]["payload"]["authorization"]["nonce"][2:])
    _, verdict = w.run(call(w.d, "verify", body, w.key))
    assert verdict["isValid"] is True, verdict

    def move() -> None:
        act(w, step.action, payer, nonce, lambda: submit_directly(w.d, body))

    if step.during:
        _, settled = w.run(_in_flight(call(w.d, "settle", body, w.key), move))
    else:
        move()
        _, settled = w.run(call(w.d, "settle", body, w.key))
    w.answers.append(_answer(settled, payer["address"], merchant, FACILITATOR_AMOUNT))
    w.settles.append((body, merchant))
    reorg(w, step.reorg, payer, nonce)


def post_step(w: World, step: Step) -> None:
    payer = funded(w.d.chain, 50_000_000)
    body = retire_body(payer["address"])
    pr = w.run(required(w.d, body))
    header = sign_payload(pr, payer["privateKey"])
    nonce = nonce_of(header)

    def front_run() -> None:
        submit_payload(w.d.chain, header)

    def move() -> None:
        act(w, step.action, payer, nonce, front_run)

    if step.during:
        _, _, headers = w.run(_in_flight(post(w.d, body, header), move))
    else:
        move()
        _, _, headers = w.run(post(w.d, body, header))
    response = decode(headers["PAYMENT-RESPONSE"])
    amount = int(pr["accepts"][0]["amount"])
    w.answers.append(_answer(response, payer["address"], w.d.chain["treasury"]["address"], amount))
    w.posts.append((body, header, payer["address"]))
    reorg(w, step.reorg, payer, nonce)


def _answer(settled: dict[str, Any], payer: str, pay_to: str, amount: int) -> Answer:
    return Answer(bool(settled.get("success")), str(settled.get("transaction") or ""), payer, pay_to, amount)


def holds_transfer(w: World, a: Answer) -> bool:
    """The chain holds ``a.transaction``, it succeeded, and it moved ``a.amount`` USDC from
    the payer to ``payTo``."""
    if len(a.transaction) != 66:
        return False
    try:
        receipt = w.w3.eth.get_transaction_receipt(a.transaction)  # type: ignore[arg-type]
    except Exception:
        return False
    if receipt["status"] != 1:
        return False
    usdc_address = w.d.chain["contracts"]["usdc"].lower()
    for log in receipt["logs"]:
        topics = [bytes(t) for t in log["topics"]]
        if (
            log["address"].lower() == usdc_address
            and len(topics) == 3
            and topics[0] == bytes(TRANSFER_TOPIC)
            and topics[1][12:] == bytes.fromhex(a.payer[2:])
            and topics[2][12:] == bytes.fromhex(a.pay_to[2:])
            and int.from_bytes(bytes(log["data"]), "big") == a.amount
        ):
            return True
    return False


async def _settled_payments(d: Daemon, timeout_s: float = 120) -> None:
    """Every payment of the resource final (retired, refunded or failed), within the bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        open_ = await d.runtime.db.fetch(
            "SELECT p.id, p.state, p.error, p.due_at, p.payload->'payload'->'authorization'->>'validBefore'"
            " AS valid_before, extract(epoch FROM now())::bigint AS now, j.state AS job_state,"
            " j.error AS job_error FROM x402_payments p LEFT JOIN relay_jobs j ON j.id = p.transfer_job_id"
            " WHERE p.state <> ALL($1::text[])",
            FINAL,
        )
        if not open_:
            return
        # A transfer that reverted with the nonce unused (the balance drained) stays open
        # until validBefore at the confirmed block: the product's bound, given a few blocks.
        expiry = max(int(r["valid_before"] or 0) for r in open_) + EXPIRY_MARGIN_S
        # (as text: pytest shortens a list's repr, and the transfer job's state is what tells)
        assert time.monotonic() < deadline or time.time() < expiry, "\n".join(str(dict(r)) for r in open_)
        await asyncio.sleep(0.3)


def check_invariant(w: World) -> None:
    d = w.d
    # asked again, each answer follows the chain
    for body, merchant in w.settles:
        for _ in range(20):  # a transfer still below the confirmed block: asked again shortly
            _, again = w.run(call(d, "settle", body, w.key))
            if again.get("errorReason") != "settlement_pending":
                break
            time.sleep(0.5)
        auth = body["paymentPayload"]["payload"]["authorization"]
        answer = _answer(again, auth["from"], merchant, FACILITATOR_AMOUNT)
        w.answers.append(answer)
        held = int(w.run(usdc(d, merchant)))
        assert held == (FACILITATOR_AMOUNT if answer.success else 0), (again, held)
    w.run(_settled_payments(d), 600)  # bounded inside: 120 s, or validBefore of an open one
    for body, header, payer in w.posts:
        _, _, headers = w.run(post(d, body, header))
        response = decode(headers["PAYMENT-RESPONSE"])
        amount = int(decode(header)["payload"]["authorization"]["value"])
        w.answers.append(_answer(response, payer, d.chain["treasury"]["address"], amount))
    false_successes = [a for a in w.answers if a.success and not holds_transfer(w, a)]
    assert false_successes == [], false_successes
    # the treasury: every payment's out matched by what arrived for it, on the chain
    settings_ = d.runtime.settings
    assert settings_.treasury_private_key is not None
    treasury = TreasurySigner(settings_.treasury_private_key.get_secret_value()).address
    rows = w.run(
        payment_ledger(X402Payments(d.runtime.db), settings_.chain_id, d.chain["contracts"]["usdc"], treasury)
    )
    assert [r for r in rows if not r.agrees] == [], rows
    for r in rows:
        if r.received:
            assert r.payment_tx is not None, r
            row = w.run(d.runtime.db.fetchrow("SELECT payer FROM x402_payments WHERE id = $1", r.id))
            proof = Answer(True, "0x" + r.payment_tx.hex(), row["payer"], treasury, r.received)
            assert holds_transfer(w, proof), r
    net = sum(r.received - r.paid_out for r in rows)
    assert int(w.run(usdc(d, treasury))) - w.treasury_start == net, rows


async def test_every_payment_out_is_matched_by_a_proven_payment_in(
    tmp_path_factory: pytest.TempPathFactory, admin_database_url: str
) -> None:
    async with private_chain(tmp_path_factory.mktemp("invariant"), admin_database_url) as (info, dsn):
        anvil = Anvil(info["rpcUrl"])
        async with ticking(anvil), resource(info, dsn, confirmations=2, settle_wait_s=20) as d:
            key = await create_api_key(d.runtime.settings, f"inv-{uuid.uuid4().hex[:6]}", ["facilitator"])
            start = await usdc(d, info["treasury"]["address"])
            world = World(
                d, key, asyncio.get_running_loop(), anvil, Web3(Web3.HTTPProvider(info["rpcUrl"])), start
            )
            runs, driven = 0, Counter[str]()

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                phases=(Phase.explicit, Phase.generate),
                report_multiple_bugs=False,
                print_blob=False,
                suppress_health_check=[HealthCheck.too_slow],
            )
            @given(st.lists(STEPS, min_size=1, max_size=4))
            def interleavings(steps: list[Step]) -> None:
                nonlocal runs
                runs += 1
                world.answers.clear()
                world.settles.clear()
                world.posts.clear()
                for step in steps:
                    driven.update(
                        [
                            step.surface,
                            step.action,
                            f"reorg {step.reorg}",
                            "during" if step.during else "before",
                        ]
                    )
                    (settle_step if step.surface == "facilitator" else post_step)(world, step)
                check_invariant(world)

            await asyncio.to_thread(interleavings)
            assert runs == EXAMPLES
            print(
                f"\n{runs} runs, {driven['facilitator'] + driven['resource']} steps: "
                + ", ".join(f"{k} {v}" for k, v in sorted(driven.items()))
            )
