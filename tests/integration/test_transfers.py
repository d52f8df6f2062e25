"""The ``transfer`` job kind end to end on real anvil and Postgres: a payer (USDC, no ETH)
signs an EIP-3009 TransferWithAuthorization to some payTo; the relay's typed entry
(``Relay.accept_transfer``) and the running workers carry it to ``confirmed`` (final: never
indexed); one authorization is one job and one transaction; an expired one is refused; a
front-runner who submits the same authorization first makes ours revert, and the answer is
success with the front-runner's transaction."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from web3 import Web3

from relayer.chain import calls
from relayer.chain.errors import ChainRevert
from relayer.domain import eip712
from relayer.domain.chains import usdc_domain_name
from relayer.domain.errors import Rejection
from relayer.domain.states import JobState
from relayer.domain.verify import (
    Refusal,
    TokenDomain,
    TransferAuthorization,
    TransferRequirement,
    VerifiedTransfer,
    verify_transfer,
)
from relayer.service.outcome import TransferOutcome
from relayer.service.relay import Relay
from relayer.store.relay_jobs import Job
from tests.chain_helpers import eth_balance, token_balance
from tests.conftest import Daemon
from tests.helpers.relay import challenge, signed_request

pytestmark = pytest.mark.integration

PAYER_INDEX = 2  # the relay tests use it mostly for kVCM: its USDC is spare


def domain(d: Daemon) -> TokenDomain:
    return TokenDomain(
        d.chain["chainId"], d.chain["contracts"]["usdc"], usdc_domain_name(d.chain["chainId"]), "2"
    )


def authorize(
    d: Daemon, value: int, pay_to: str, *, valid_before: int | None = None
) -> TransferAuthorization:
    """The payer's signed TransferWithAuthorization (a random nonce, as x402 clients make)."""
    payer = d.chain["payers"][PAYER_INDEX]
    now = int(time.time())
    auth = TransferAuthorization(
        payer["address"], pay_to, value, 0, valid_before or now + 3600, os.urandom(32), b""
    )
    dom = domain(d)
    typed = eip712.transfer_with_authorization(
        chain_id=dom.chain_id,
        usdc=dom.address,
        payer=auth.payer,
        to=auth.to,
        value=auth.value,
        valid_after=auth.valid_after,
        valid_before=auth.valid_before,
        nonce=auth.nonce,
        name=dom.name,
        version=dom.version,
    )
    signature = Account.sign_message(encode_typed_data(full_message=typed), payer["privateKey"]).signature
    return TransferAuthorization(
        auth.payer, auth.to, auth.value, auth.valid_after, auth.valid_before, auth.nonce, bytes(signature)
    )


def verified(d: Daemon, auth: TransferAuthorization) -> VerifiedTransfer:
    requirement = TransferRequirement(d.chain["contracts"]["usdc"], auth.to, auth.value)
    out = verify_transfer(auth, requirement, domain(d), int(time.time()))
    assert isinstance(out, VerifiedTransfer), out
    return out


def relay_of(d: Daemon) -> Relay:
    return d.runtime.services.relay


def fresh_address() -> str:
    return str(Account.create().address)


async def transactions_of(d: Daemon, job: Job) -> int:
    return int(
        await d.runtime.db.fetchval("SELECT count(*) FROM relay_transactions WHERE job_id = $1", job.id)
    )


async def test_a_signed_transfer_is_relayed_to_confirmed_and_the_usdc_moves(daemon: Daemon) -> None:
    pay_to, value = fresh_address(), 1_250_000
    usdc, payer = daemon.chain["contracts"]["usdc"], daemon.chain["payers"][PAYER_INDEX]["address"]
    before = await token_balance(daemon.runtime.node, "usdc", payer)
    v = verified(daemon, authorize(daemon, value, pay_to))
    job = await relay_of(daemon).accept_transfer(v, int(time.time()))
    assert job.kind == "transfer" and job.settlement == usdc and job.gas_allowance == 0
    outcome = await relay_of(daemon).outcomes.wait_transfer(job.id, 30)
    assert isinstance(outcome, TransferOutcome)
    assert (outcome.success, outcome.final, outcome.front_run) == (True, True, False), outcome
    assert outcome.job.state is JobState.CONFIRMED and outcome.tx_hash == outcome.job.tx_hash
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == value
    assert before - await token_balance(daemon.runtime.node, "usdc", payer) == value
    assert await eth_balance(daemon.runtime.node, payer) == 0  # the payer paid no gas
    # Confirmed is final for a transfer: the indexer never moves it to indexed.
    await asyncio.sleep(1.0)
    assert (await daemon.runtime.jobs.get(job.id)).state is JobState.CONFIRMED  # type: ignore[union-attr]
    calldata = calls.transfer_with_authorization(
        v.payer, v.to, v.value, v.valid_after, v.valid_before, v.nonce, v.signature
    )
    assert job.call_data == calldata


async def test_one_authorization_is_one_job_and_one_transaction(daemon: Daemon) -> None:
    v = verified(daemon, authorize(daemon, 10_000, fresh_address()))
    relay, now = relay_of(daemon), int(time.time())
    jobs = await asyncio.gather(*(relay.accept_transfer(v, now) for _ in range(4)))
    assert len({j.id for j in jobs}) == 1
    early = await relay.outcomes.wait_transfer(jobs[0].id, 0)  # no wait: pending unless confirmed
    assert early.success if early.final else early.job.state is not JobState.CONFIRMED
    outcome = await relay.outcomes.wait_transfer(jobs[0].id, 30)
    assert outcome.success and outcome.final
    again = await relay.accept_transfer(v, int(time.time()))
    assert again.id == jobs[0].id and again.tx_hash == outcome.tx_hash
    assert await transactions_of(daemon, again) == 1


async def test_an_expired_authorization_is_refused(daemon: Daemon) -> None:
    auth = authorize(daemon, 10_000, fresh_address(), valid_before=int(time.time()) + 10)
    requirement = TransferRequirement(daemon.chain["contracts"]["usdc"], auth.to, auth.value)
    refusal = verify_transfer(auth, requirement, domain(daemon), int(time.time()))
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "invalid_exact_evm_payload_authorization_valid_before"
    # Verified earlier, taken in too late: the relay refuses it before recording anything.
    early = verify_transfer(auth, requirement, domain(daemon), int(time.time()) - 3600)
    assert isinstance(early, VerifiedTransfer)
    with pytest.raises(Rejection) as caught:
        await relay_of(daemon).accept_transfer(early, int(time.time()))
    assert caught.value.code == "invalid_auth_payload"
    assert await daemon.runtime.jobs.find_by_salt(daemon.chain["chainId"], early.salt) is None


async def test_a_payer_who_cannot_pay_is_refused_before_anything_is_recorded(daemon: Daemon) -> None:
    held = await token_balance(daemon.runtime.node, "usdc", daemon.chain["payers"][PAYER_INDEX]["address"])
    v = verified(daemon, authorize(daemon, held + 1, fresh_address()))
    with pytest.raises(ChainRevert) as caught:
        await relay_of(daemon).accept_transfer(v, int(time.time()))
    assert caught.value.code == "contract_revert"
    assert await daemon.runtime.jobs.find_by_salt(daemon.chain["chainId"], v.salt) is None


async def _when_submitted(daemon: Daemon, job: Job) -> Job:
    for _ in range(200):
        current = await daemon.runtime.jobs.get(job.id)
        assert current is not None
        if current.state is JobState.SUBMITTED:
            return current
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job.id} never submitted")


async def test_a_front_run_transfer_answers_success_with_the_front_runners_transaction(
    daemon: Daemon,
) -> None:
    pay_to, value = fresh_address(), 20_000
    v = verified(daemon, authorize(daemon, value, pay_to))
    w3 = Web3(Web3.HTTPProvider(daemon.chain["rpcUrl"]))
    executor = daemon.chain["executor"]["address"]
    spent_before = await _transfer_ledger(daemon)
    w3.provider.make_request("evm_setAutomine", [False])  # type: ignore[arg-type]
    try:
        job = await relay_of(daemon).accept_transfer(v, int(time.time()))
        job = await _when_submitted(daemon, job)
        copier = Account.from_key(daemon.chain["deployer"]["privateKey"])
        tx = {
            "type": 2,
            "chainId": daemon.chain["chainId"],
            "to": job.settlement,
            "data": job.call_data,
            "value": 0,
            "gas": 200_000,
            "nonce": w3.eth.get_transaction_count(copier.address, "pending"),
            "maxFeePerGas": 100 * 10**9,
            "maxPriorityFeePerGas": 50 * 10**9,
        }
        copied = w3.eth.send_raw_transaction(copier.sign_transaction(tx).raw_transaction)
        w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    finally:
        w3.provider.make_request("evm_setAutomine", [True])  # type: ignore[arg-type]
    outcome = await relay_of(daemon).outcomes.wait_transfer(job.id, 30)
    assert (outcome.success, outcome.final, outcome.front_run) == (True, True, True), outcome
    assert outcome.tx_hash == bytes(copied)
    assert outcome.job.state is JobState.REVERTED and outcome.job.tx_hash != bytes(copied)
    assert await token_balance(daemon.runtime.node, "usdc", pay_to) == value  # paid once
    # The executor paid for one reverted attempt at most, and nothing else for this job.
    assert await transactions_of(daemon, job) == 1
    spent_after = await _transfer_ledger(daemon)
    assert spent_after.get(False, (0, 0))[0] - spent_before.get(False, (0, 0))[0] <= 1
    receipt = w3.eth.get_transaction_receipt(job.tx_hash)  # type: ignore[arg-type]
    assert receipt["status"] == 0 and receipt["from"] == executor


async def _transfer_ledger(daemon: Daemon) -> dict[bool, tuple[int, int]]:
    rows = await daemon.runtime.lane.ledger()
    return {r.succeeded: (r.transactions, r.paid_wei) for r in rows if r.kind == "transfer"}


async def test_a_retirement_still_settles_to_indexed_beside_transfers(daemon: Daemon) -> None:
    payer = daemon.chain["payers"][PAYER_INDEX]
    ch = await challenge(daemon, payer, carbonClass="NBO", amount="0.2", inputToken="USDC")
    transfer = relay_of(daemon).accept_transfer(
        verified(daemon, authorize(daemon, 5_000, fresh_address())), int(time.time())
    )
    (status, result), job = await asyncio.gather(
        daemon.post(signed_request(ch, payer["privateKey"])), transfer
    )
    assert status == 200 and result["status"] == "settled", result
    retire = await daemon.runtime.db.fetchrow(
        "SELECT state, kind FROM relay_jobs WHERE tx_hash = $1", bytes.fromhex(result["transactionHash"][2:])
    )
    assert (retire["state"], retire["kind"]) == ("indexed", "retire")
    done = await relay_of(daemon).outcomes.wait_transfer(job.id, 30)
    assert done.success and done.job.state is JobState.CONFIRMED
