"""The gasless relay end to end: real anvil, real Postgres, the daemon over HTTP."""

from __future__ import annotations

import asyncio
import copy
import re
from collections.abc import Sequence
from typing import Any

import pytest
from eth_account import Account

from relayer.domain.retirement import Retirement, RetirementDetails, bind_nonce
from tests.chain_helpers import chain_hash_retirement, eth_balance, token_balance, transact_as_deployer
from tests.conftest import Daemon
from tests.helpers.jobs import new_job
from tests.helpers.relay import challenge, sign, signed_request

pytestmark = pytest.mark.integration


async def balances(d: Daemon, token: str, *owners: str) -> list[int]:
    return [await token_balance(d.runtime.node, token, o) for o in owners]


async def executor_state(d: Daemon) -> tuple[int, int]:
    ex = d.chain["executor"]["address"]
    return await eth_balance(d.runtime.node, ex), await d.runtime.executor.pending_nonce(ex)


async def test_usdc_class_retirement_settles_with_exact_accounting(daemon: Daemon) -> None:
    payer = daemon.chain["payers"][0]
    fee_to = daemon.chain["feeRecipient"]["address"]
    executor = daemon.chain["executor"]["address"]
    ch = await challenge(daemon, payer, carbonClass="NBO", amount="1.5", inputToken="USDC")
    quote = ch["quote"]["quote"]
    before = await balances(daemon, "usdc", payer["address"], fee_to, executor)
    status, result = await daemon.post(signed_request(ch, payer["privateKey"]))
    assert status == 200, result
    assert result["status"] == "settled"
    [entry] = result["retirements"]
    assert entry["amountInTonnes"] == "1.5"
    assert entry["retirementId"] == f"84532-{result['transactionHash']}-0"
    after = await balances(daemon, "usdc", payer["address"], fee_to, executor)
    allowance = int(ch["gasAllowance"])
    # The payer spends exactly cost + fee + the signed gas allowance; the rest is refunded.
    assert before[0] - after[0] == int(quote["total"]) + allowance
    assert after[1] - before[1] == int(quote["fee"])
    assert after[2] - before[2] == allowance
    assert await eth_balance(daemon.runtime.node, payer["address"]) == 0
    status, cert = await daemon.get("/api/certificate", txHash=result["transactionHash"])
    assert status == 200 and cert["retirements"][0]["certificateUrl"].endswith("/certificate")


async def test_usdc_listing_fill_settles(daemon: Daemon) -> None:
    payer = daemon.chain["payers"][1]
    listing = next(li for li in daemon.chain["listings"] if int(li["minFill"]) <= 1000)
    seller = daemon.chain["seller"]["address"]
    ch = await challenge(daemon, payer, listingId=str(listing["listingId"]), amount="1", inputToken="USDC")
    assert int(ch["validBefore"]) - int(ch["typedData"]["message"]["validAfter"]) > 0
    before = await balances(daemon, "usdc", seller)
    status, result = await daemon.post(signed_request(ch, payer["privateKey"]))
    assert status == 200 and result["status"] == "settled", result
    after = await balances(daemon, "usdc", seller)
    assert after[0] - before[0] == int(ch["quote"]["quote"]["retirementCost"])
    fee = int(ch["quote"]["quote"]["fee"])
    assert fee == max(50_000, -(-int(ch["quote"]["quote"]["retirementCost"]) * 500 // 10_000))


async def test_kvcm_class_retirement_settles(daemon: Daemon) -> None:
    payer = daemon.chain["payers"][2]
    ch = await challenge(daemon, payer, carbonClass="RE", amount="2", inputToken="kVCM")
    assert ch["typedData"]["primaryType"] == "Permit"
    before = await balances(daemon, "kvcm", payer["address"])
    status, result = await daemon.post(signed_request(ch, payer["privateKey"]))
    assert status == 200 and result["status"] == "settled", result
    after = await balances(daemon, "kvcm", payer["address"])
    assert before[0] - after[0] == int(ch["quote"]["quote"]["total"]) + int(ch["gasAllowance"])


class SaltReads:
    """Counts the relay's reads of a job by its salt while the block runs."""

    def __init__(self, d: Daemon) -> None:
        self.jobs = d.runtime.services.relay.jobs
        self.count = 0

    def __enter__(self) -> SaltReads:
        real = self.jobs.find_by_salt

        async def counted(*args: Any) -> Any:
            self.count += 1
            return await real(*args)

        self.jobs.find_by_salt = counted
        return self

    def __exit__(self, *_exc: object) -> None:
        del self.jobs.find_by_salt  # the class's own again


async def test_identical_request_twice_and_concurrently_broadcasts_once(daemon: Daemon) -> None:
    """One job, one transaction; the reservation itself finds the identical request's job:
    no request reads its salt first (issue 20: one round trip fewer a retirement)."""
    payer = daemon.chain["payers"][0]
    ch = await challenge(daemon, payer, carbonClass="RE", amount="0.25", inputToken="USDC")
    body = signed_request(ch, payer["privateKey"])
    _, nonce_before = await executor_state(daemon)
    with SaltReads(daemon) as salt_reads:
        results = await asyncio.gather(*(daemon.post(body) for _ in range(4)))
        status, again = await daemon.post(body)
    assert salt_reads.count == 0
    hashes = {r[1]["transactionHash"] for r in [*results, (status, again)]}
    assert all(r[0] == 200 for r in results) and status == 200, results
    assert len(hashes) == 1
    _, nonce_after = await executor_state(daemon)
    assert nonce_after - nonce_before == 1
    rows = await daemon.runtime.db.fetchval(  # one signed transaction for the job
        "SELECT count(*) FROM relay_transactions t JOIN relay_jobs j ON j.id = t.job_id WHERE j.salt = $1",
        bytes.fromhex(body["salt"][2:]),
    )
    assert rows == 1


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.update(amount="2"),
        lambda b: b["details"].update(
            beneficiaryIsPayer=False, beneficiaryAddress="0x000000000000000000000000000000000000dEaD"
        ),
    ],
    ids=["amount", "beneficiary"],
)
async def test_changed_retirement_gives_params_mismatch(daemon: Daemon, change: Any) -> None:
    payer = daemon.chain["payers"][1]
    ch = await challenge(daemon, payer, carbonClass="NBO", amount="1", inputToken="USDC")
    body = signed_request(ch, payer["privateKey"])
    change(body)
    status, data = await daemon.post(body)
    assert status == 400, data
    assert data["error"] == "params_mismatch"
    assert data["receivedNonce"] == ch["actionsRetireRequest"]["authPayload"]["nonce"]
    assert data["expectedNonce"] != data["receivedNonce"]
    assert "submitted" in data


async def test_value_that_does_not_cover_gives_required_minimum(daemon: Daemon) -> None:
    payer = daemon.chain["payers"][1]
    ch = await challenge(daemon, payer, carbonClass="NBO", amount="1", inputToken="USDC")
    required = int(ch["quote"]["quote"]["total"]) + int(ch["gasAllowance"])
    ch["typedData"]["message"]["value"] = str(required - 1)
    ch["actionsRetireRequest"]["authPayload"]["value"] = str(required - 1)
    status, data = await daemon.post(signed_request(ch, payer["privateKey"]))
    assert status == 400, data
    assert data["error"] == "insufficient_authorized_value"
    assert int(data["requiredMinimum"]) == required


async def test_reverting_simulation_gives_contract_revert_and_costs_no_gas(daemon: Daemon) -> None:
    unfunded = Account.create()
    payer = {"address": unfunded.address, "privateKey": "0x" + bytes(unfunded.key).hex()}
    ch = await challenge(daemon, payer, carbonClass="NBO", amount="1", inputToken="USDC")
    before = await executor_state(daemon)
    body = signed_request(ch, payer["privateKey"])
    status, data = await daemon.post(body)
    assert status == 422, data
    assert data["error"] == "contract_revert"
    assert data["decoded"]["errorName"] == "ERC20InsufficientBalance"
    assert data["function"] == "retireWithAuthorization"
    assert await executor_state(daemon) == before
    # Nothing was signed, so the identical request stays retryable (and fails the same way).
    status, again = await daemon.post(body)
    assert (status, again["error"]) == (422, "contract_revert")


async def test_python_nonce_binding_matches_the_settlement_contract(daemon: Daemon) -> None:
    node = daemon.runtime.node
    details = RetirementDetails(
        retiring_address=daemon.chain["payers"][0]["address"],
        beneficiary_address="0x000000000000000000000000000000000000dEaD",
        beneficiary_string="Ünïcode name ✓",
        retirement_message="m" * 300,
        beneficiary_location="Oslo",
        consumption_country_code="NO",
        consumption_period_start="2025-01-01",
        consumption_period_end="2025-12-31",
    )
    r = Retirement(1, 7, node.contracts.carbon_credits, 3, 12_345, node.contracts.usdc, 999, details)
    salt = bytes(range(32))
    assert await chain_hash_retirement(node, r, salt) == bind_nonce(r, salt)


async def test_signature_from_another_key_is_invalid_auth_payload(daemon: Daemon) -> None:
    payer = daemon.chain["payers"][0]
    ch = await challenge(daemon, payer, carbonClass="NBO", amount="1", inputToken="USDC")
    body = copy.deepcopy(ch["actionsRetireRequest"])
    body["authPayload"]["signature"] = sign(ch["typedData"], daemon.chain["payers"][1]["privateKey"])
    status, data = await daemon.post(body)
    assert (status, data["error"]) == (400, "invalid_auth_payload")


async def test_metrics_expose_job_states_and_stage_histograms(daemon: Daemon) -> None:
    payer = daemon.chain["payers"][2]
    ch = await challenge(daemon, payer, carbonClass="RE", amount="0.5", inputToken="USDC")
    status, result = await daemon.post(signed_request(ch, payer["privateKey"]))
    assert (status, result["status"]) == (200, "settled")
    await asyncio.sleep(0.1)  # the follower observes mined->indexed right after answering
    async with daemon.session.get(f"{daemon.base_url}/metrics") as r:
        text = await r.text()
    assert r.status == 200
    assert re.search(r'^relayer_relay_jobs\{state="indexed"\} ', text, re.M)
    for stage in ("accepted_to_submitted", "submitted_to_mined", "mined_to_indexed"):
        count = re.search(
            rf'^relayer_relay_stage_duration_seconds_count\{{stage="{stage}"\}} (\S+)', text, re.M
        )
        assert count is not None and float(count.group(1)) >= 1, stage
    assert 'relayer_http_requests_total{action="actions/retire",code="payment_required"}' in text


async def _orphan(daemon: Daemon, payer_index: int, amount: str) -> tuple[dict[str, Any], bytes]:
    """A signed request whose job is left in ``accepted``, as if its process died between
    reserving the salt and simulating, and aged past the orphan threshold."""
    from relayer.service.simulate import ORPHAN_AFTER_S

    simulator = daemon.runtime.simulator
    payer = daemon.chain["payers"][payer_index]
    ch = await challenge(daemon, payer, carbonClass="IND", amount=amount, inputToken="USDC")
    body = signed_request(ch, payer["privateKey"])

    async def crash(*_args: Any) -> None:
        raise RuntimeError("process died between reserving the salt and simulating")

    real = simulator.simulate
    simulator.simulate = crash  # type: ignore[method-assign]
    try:
        status, data = await daemon.post(body)
    finally:
        simulator.simulate = real  # type: ignore[method-assign]
    daemon.expected_internal_errors += 1  # an unexpected exception, provoked: the only way to a 500
    assert (status, data["error"]) == (500, "internal_error")
    salt = bytes.fromhex(body["salt"][2:])
    db = daemon.runtime.db
    assert await db.fetchval("SELECT state FROM relay_jobs WHERE salt = $1", salt) == "accepted"
    await db.execute(
        "UPDATE relay_jobs SET accepted_at = now() - make_interval(secs => $2) WHERE salt = $1",
        salt,
        ORPHAN_AFTER_S + 1,
    )
    return body, salt


async def test_a_job_left_accepted_by_a_crash_is_resumed_by_the_identical_request(daemon: Daemon) -> None:
    body, _ = await _orphan(daemon, 0, "0.2")
    status, data = await daemon.post(body)  # no 500, no 202: taken over and settled
    assert (status, data["status"]) == (200, "settled"), data


async def test_a_job_left_accepted_by_a_crash_is_resumed_by_the_sweep(daemon: Daemon) -> None:
    body, salt = await _orphan(daemon, 1, "0.25")
    for _ in range(100):  # bounded: 10 s (the sweeper runs every 2 s)
        state = await daemon.runtime.db.fetchval("SELECT state FROM relay_jobs WHERE salt = $1", salt)
        if state != "accepted":
            break
        await asyncio.sleep(0.1)
    assert state != "accepted"
    status, data = await daemon.post(body)
    assert (status, data["status"]) == (200, "settled"), data


async def test_failed_broadcast_is_resent_with_the_same_bytes(daemon: Daemon) -> None:
    from relayer.chain.errors import ChainUnavailable, SendOutcome

    chain = daemon.runtime.executor
    payer = daemon.chain["payers"][1]
    ch = await challenge(daemon, payer, carbonClass="IND", amount="0.3", inputToken="USDC")
    body = signed_request(ch, payer["privateKey"])
    real_send = chain.send_raw_many
    sent: list[bytes] = []

    async def flaky_send(raws: Sequence[bytes]) -> list[SendOutcome | ChainUnavailable]:
        sent.extend(raws)
        if len(sent) == 1:
            return [ChainUnavailable()]
        return await real_send(raws)

    chain.send_raw_many = flaky_send  # type: ignore[method-assign]
    try:
        status, data = await daemon.post(body)
    finally:
        chain.send_raw_many = real_send  # type: ignore[method-assign]
    assert (status, data["status"]) == (200, "settled"), data
    assert len(sent) == 2 and sent[0] == sent[1]  # the same signed bytes, never a second transaction
    rows = await daemon.runtime.db.fetchval(
        "SELECT count(*) FROM relay_transactions t JOIN relay_jobs j ON j.id = t.job_id WHERE j.salt = $1",
        bytes.fromhex(body["salt"][2:]),
    )
    assert rows == 1


async def test_database_loss_cannot_spend_an_authorization_twice(daemon: Daemon) -> None:
    """With the job and salt rows gone, the chain's own EIP-3009 authorizationState refuses
    the replay in simulation: nothing is broadcast and the executor pays nothing."""
    payer = daemon.chain["payers"][2]
    ch = await challenge(daemon, payer, carbonClass="IND", amount="0.1", inputToken="USDC")
    body = signed_request(ch, payer["privateKey"])
    status, first = await daemon.post(body)
    assert (status, first["status"]) == (200, "settled")
    pool = daemon.runtime.db
    salt = bytes.fromhex(body["salt"][2:])
    async with pool.transaction() as conn:
        job_id = await conn.fetchval("SELECT id FROM relay_jobs WHERE salt = $1", salt)
        await conn.execute("DELETE FROM spent_salts WHERE job_id = $1", job_id)
        await conn.execute("DELETE FROM relay_transactions WHERE job_id = $1", job_id)
        await conn.execute("DELETE FROM relay_jobs WHERE id = $1", job_id)
    before = await executor_state(daemon)
    status, replay = await daemon.post(body)
    assert (status, replay["error"]) == (422, "contract_revert"), replay
    assert replay["decoded"]["errorName"] == "AuthorizationAlreadyUsed"
    assert await executor_state(daemon) == before


def set_class_price(chain: dict[str, Any], class_id: int, price: int) -> None:
    """As the protocol owner, move a class price on-chain."""
    transact_as_deployer(
        chain, chain["contracts"]["carbonClasses"], "CarbonClasses", "setPrice", class_id, price
    )


async def test_identical_request_after_prices_moved_returns_the_same_transaction(daemon: Daemon) -> None:
    payer = daemon.chain["payers"][1]
    ch = await challenge(daemon, payer, carbonClass="IND", amount="0.4", inputToken="USDC")
    body = signed_request(ch, payer["privateKey"])
    status, first = await daemon.post(body)
    assert (status, first["status"]) == (200, "settled")
    ind = next(c for c in daemon.chain["carbonClasses"] if c["symbol"] == "IND")
    price = int(ind["priceKvcmPerTonne"])
    set_class_price(daemon.chain, ind["classId"], price * 3)
    try:
        await asyncio.sleep(0.2)  # let the follower see the new head (drops cached reads)
        status, quote = await daemon.get("/api/quote", carbonClass="IND", amount="0.4")
        assert int(quote["quote"]["total"]) > int(body["authPayload"]["value"])  # would no longer cover
        with SaltReads(daemon) as salt_reads:
            status, again = await daemon.post(body)
        assert salt_reads.count == 1  # refused as new: the job that spent the salt answers
        assert (status, again["status"], again["transactionHash"]) == (
            200,
            "settled",
            first["transactionHash"],
        )
    finally:
        set_class_price(daemon.chain, ind["classId"], price)


async def test_kvcm_permit_is_bound_to_the_retirement(daemon: Daemon) -> None:
    """A signed permit cannot be re-aimed: another beneficiary, amount or gas allowance no
    longer matches the deadline's bound nonce (and the contract checks the same)."""
    payer = daemon.chain["payers"][2]
    ch = await challenge(daemon, payer, carbonClass="RE", amount="1", inputToken="kVCM")
    deadline = int(ch["actionsRetireRequest"]["authPayload"]["validBefore"])
    assert deadline & (2**64 - 1) == ch["validBefore"]
    assert deadline >> 64 == int(ch["onChainDetails"]["authorizationNonce"], 16) >> 64
    for change in (
        lambda b: b["details"].update(
            beneficiaryIsPayer=False, beneficiaryAddress="0x000000000000000000000000000000000000dEaD"
        ),
        lambda b: b.update(amount="3"),
        lambda b: b.update(gasAllowance="0"),
    ):
        body = signed_request(ch, payer["privateKey"])
        change(body)
        status, data = await daemon.post(body)
        assert (status, data["error"]) == (400, "params_mismatch"), data
    status, data = await daemon.post(signed_request(ch, payer["privateKey"]))
    assert (status, data["status"]) == (200, "settled"), data


async def test_rejected_kvcm_attempt_does_not_lock_the_permit_nonce(daemon: Daemon) -> None:
    unfunded = Account.create()
    payer = {"address": unfunded.address, "privateKey": "0x" + bytes(unfunded.key).hex()}
    first = await challenge(daemon, payer, carbonClass="RE", amount="1", inputToken="kVCM")
    status, data = await daemon.post(signed_request(first, payer["privateKey"]))
    assert (status, data["error"]) == (422, "contract_revert")
    second = await challenge(daemon, payer, carbonClass="RE", amount="1", inputToken="kVCM")
    assert second["typedData"]["message"]["nonce"] == first["typedData"]["message"]["nonce"]
    status, data = await daemon.post(signed_request(second, payer["privateKey"]))
    assert (status, data["error"]) == (422, "contract_revert")  # judged again, not "permit in use"


async def test_one_live_job_per_permit_nonce(daemon: Daemon) -> None:
    from relayer.domain.errors import Rejection
    from relayer.domain.states import JobState
    from relayer.store.relay_jobs import NewJob, PermitInUse

    jobs = daemon.runtime.jobs

    def job(salt: bytes) -> NewJob:
        """A kvcm job on the session chain holding permit ``permit-key-1``."""
        return new_job(
            salt,
            tag=b"k",
            chain_id=84532,
            permit_key=b"permit-key-1",
            scheme="eip2612",
            input_token="0xkvcm",
            request_hash=b"h" + salt,
        )

    first, owned = await jobs.reserve(job(b"\x01" * 31))
    assert owned
    with pytest.raises(PermitInUse):
        await jobs.reserve(job(b"\x02" * 31))
    await jobs.move(first.id, JobState.REJECTED, error=Rejection("contract_revert"))
    second, owned = await jobs.reserve(job(b"\x02" * 31))  # freed once nothing can spend it
    assert owned and second.id != first.id
    with pytest.raises(PermitInUse):  # and the rejected one cannot come back while it is live
        await jobs.reserve(job(b"\x01" * 31))


async def test_authorization_about_to_expire_is_never_signed(daemon: Daemon) -> None:
    import time

    from relayer.domain.errors import Rejection
    from relayer.domain.states import JobState
    from relayer.store.executor_lane import ExecutorLane
    from relayer.store.relay_jobs import NewJob

    jobs = daemon.runtime.jobs
    salt = b"\x07" * 32
    new = NewJob(
        chain_id=99,  # a chain no broadcaster serves, so only this test claims it
        bound_nonce=b"expiring" + salt,
        permit_key=None,
        salt=salt,
        scheme="eip3009",
        payer="0xpayer",
        input_token="0xusdc",
        auth_value=1,
        auth_expires_at=int(time.time()) + 10,
        gas_allowance=0,
        request_hash=b"h",
        settlement="0xsettlement",
        call_data=b"",
        summary={},
        quote_total=0,
    )
    job, _ = await jobs.reserve(new)
    assert await jobs.move(job.id, JobState.SIMULATED, gas_limit=100_000, max_fee_per_gas=1) is not None

    def must_not_sign(*_args: Any) -> Any:
        raise AssertionError("signed an authorization that expires before it can be mined")

    lane = ExecutorLane(daemon.runtime.db, 99)
    await daemon.runtime.db.execute(
        "INSERT INTO executor_leases (chain_id, executor, epoch, holder) VALUES (99, '0xexecutor', 1, 'test')"
    )
    expired = Rejection("invalid_auth_payload")
    assert await lane.sign_simulated("0xexecutor", 1, [job.id], must_not_sign, 20, expired) == []
    rejected = await jobs.get(job.id)
    assert rejected is not None and rejected.state is JobState.REJECTED and rejected.tx_hash is None


async def test_authorization_settled_by_another_sender_is_reported_settled(daemon: Daemon) -> None:
    """Anyone may submit a bound EIP-3009 authorization. If a copier's transaction settles it
    first, ours reverts, but the payer's retirement exists: answer settled with the copier's
    transaction, never "transaction_reverted … re-sign" (which would invite paying twice)."""
    from web3 import Web3

    payer = daemon.chain["payers"][0]
    ch = await challenge(daemon, payer, carbonClass="NBO", amount="0.3", inputToken="USDC")
    body = signed_request(ch, payer["privateKey"])
    w3 = Web3(Web3.HTTPProvider(daemon.chain["rpcUrl"]))
    w3.provider.make_request("evm_setAutomine", [False])  # type: ignore[arg-type]
    try:
        relay = asyncio.create_task(daemon.post(body))
        pool = daemon.runtime.db
        salt = bytes.fromhex(body["salt"][2:])
        for _ in range(200):
            row = await pool.fetchrow(
                "SELECT state, call_data, settlement FROM relay_jobs WHERE salt = $1", salt
            )
            if row is not None and row["state"] == "submitted":
                break
            await asyncio.sleep(0.05)
        assert row is not None and row["state"] == "submitted"
        copier = Account.from_key(daemon.chain["deployer"]["privateKey"])
        tx = {
            "type": 2,
            "chainId": daemon.chain["chainId"],
            "to": row["settlement"],
            "data": bytes(row["call_data"]),
            "value": 0,
            "gas": 1_500_000,
            "nonce": w3.eth.get_transaction_count(copier.address, "pending"),
            "maxFeePerGas": 100 * 10**9,
            "maxPriorityFeePerGas": 50 * 10**9,
        }
        copied = w3.eth.send_raw_transaction(copier.sign_transaction(tx).raw_transaction)
        w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
    finally:
        w3.provider.make_request("evm_setAutomine", [True])  # type: ignore[arg-type]
    status, result = await relay
    assert (status, result["status"]) == (200, "settled"), result
    assert result["transactionHash"] == "0x" + bytes(copied).hex()
    assert result["retirements"][0]["retiringAddress"] == payer["address"]
    ours = await pool.fetchval("SELECT state FROM relay_jobs WHERE salt = $1", salt)
    assert ours == "reverted"
    daemon.expected_reverts += 1  # the executor paid for a transaction the copier beat: in the ledger


async def test_a_retirement_with_nul_and_invalid_utf8_details_does_not_stall_the_index(
    daemon: Daemon,
) -> None:
    """Anyone can settle a retirement directly with any bytes in its details strings; the
    index stores them (NUL and invalid UTF-8 as U+FFFD) and moves on to the next block."""
    from eth_abi.abi import encode
    from web3 import Web3

    from relayer.chain import codec

    w3 = Web3(Web3.HTTPProvider(daemon.chain["rpcUrl"]))
    caller = Account.from_key(daemon.chain["deployer"]["privateKey"])
    contracts = daemon.chain["contracts"]
    nbo = next(c for c in daemon.chain["carbonClasses"] if c["symbol"] == "NBO")
    max_input = 50 * 10**6
    details = (caller.address, caller.address, b"nul\x00name", b"\xff\xfe bad utf-8", b"", b"", b"", b"", b"")
    retirement = (
        0,
        nbo["classId"],
        contracts["carbonCredits"],
        nbo["tokenIds"][0],
        10,
        contracts["usdc"],
        0,
        details,
    )
    retire = codec.function("RetirementSettlement", "retire")
    raw_types = [t.replace("string", "bytes") for t in retire.inputs]  # the same ABI encoding
    usdc = codec.function("UsdcEip3009", "mint"), codec.function("UsdcEip3009", "approve")
    nonce = w3.eth.get_transaction_count(caller.address, "pending")
    hashes = []
    for i, (to, data) in enumerate(
        [
            (contracts["usdc"], usdc[0].encode(caller.address, max_input)),
            (contracts["usdc"], usdc[1].encode(contracts["settlement"], max_input)),
            (contracts["settlement"], retire.selector + encode(raw_types, [retirement, max_input])),
        ]
    ):
        tx = {
            "type": 2,
            "chainId": daemon.chain["chainId"],
            "to": to,
            "data": data,
            "value": 0,
            "gas": 1_500_000,
            "nonce": nonce + i,
            "maxFeePerGas": 10**10,
            "maxPriorityFeePerGas": 10**9,
        }
        hashes.append(w3.eth.send_raw_transaction(caller.sign_transaction(tx).raw_transaction))
    receipt = w3.eth.wait_for_transaction_receipt(hashes[-1], timeout=30)
    assert receipt["status"] == 1
    # The quote below prices gas from that block's fee history (its 1 gwei tips), as the
    # simulation will: not from a head the daemon's cache had not yet moved past.
    daemon.runtime.node.observe_head(receipt["blockNumber"])
    # A relayed retirement after it settles and is indexed: the follower went past that block.
    payer = daemon.chain["payers"][0]
    ch = await challenge(daemon, payer, carbonClass="RE", amount="0.01", inputToken="USDC")
    status, result = await daemon.post(signed_request(ch, payer["privateKey"]))
    assert (status, result.get("status")) == (200, "settled"), result
    status, cert = await daemon.get("/api/certificate", txHash="0x" + bytes(hashes[-1]).hex())
    assert status == 200, cert
    assert cert["retirements"][0]["beneficiaryName"] == "nul\ufffdname"


async def _held_lane(db: Any, chain_id: int, executor: str, next_nonce: int) -> Any:
    """An executor lane of ``executor`` on ``chain_id`` (one no broadcaster serves) whose
    lease is held at epoch 1, its next nonce ``next_nonce``."""
    from relayer.store.executor_lane import ExecutorLane

    await db.execute(
        "INSERT INTO executor_leases (chain_id, executor, epoch, holder) VALUES ($1, $2, 1, 'test')",
        chain_id,
        executor,
    )
    lane = ExecutorLane(db, chain_id)
    await lane.reconcile_nonce(executor, next_nonce)
    return lane


async def _simulated(
    daemon: Daemon, chain_id: int, tag: bytes, count: int, expires_in: int = 3_600, **plan: int
) -> list[int]:
    """``count`` jobs reserved on ``chain_id`` and moved to simulated at ``plan`` (gas limit
    100,000 and max fee 1 unless given), their authorizations expiring in ``expires_in``
    seconds; their ids."""
    import time

    from relayer.domain.states import JobState
    from relayer.store.relay_jobs import NewJob

    ids = []
    for i in range(count):
        salt = tag + bytes([i]) * 31
        new = NewJob(
            chain_id=chain_id, bound_nonce=b"batch" + salt, permit_key=None, salt=salt,
            scheme="eip3009", payer="0xpayer", input_token="0xusdc", auth_value=1,
            auth_expires_at=int(time.time()) + expires_in, gas_allowance=0, request_hash=salt,
            settlement="0xsettlement", call_data=b"", summary={}, quote_total=0,
        )  # fmt: skip
        job, _ = await daemon.runtime.jobs.reserve(new)
        fields = {"gas_limit": 100_000, "max_fee_per_gas": 1, **plan}
        await daemon.runtime.jobs.move(job.id, JobState.SIMULATED, **fields)  # type: ignore[arg-type]
        ids.append(job.id)
    return ids


async def test_a_signing_batch_costs_the_same_statements_whatever_its_size(
    daemon: Daemon, database_url: str
) -> None:
    """Nonces allocated, transactions journaled and jobs marked per batch, not per job: the
    signing transaction's statements (one round trip each) do not grow with the batch: the
    fence, the rejection of expiring jobs, the claim and the nonces' allocation are one, the
    journal of the transactions and the jobs' move to signed another; the broadcast of the
    batch is recorded in one more."""
    from relayer.domain.errors import Rejection
    from relayer.domain.states import JobState
    from relayer.store.executor_lane import SignedTx
    from relayer.store.pool import Database
    from relayer.store.relay_jobs import Job

    chain_id, executor = 96, "0xbatchexecutor"  # a chain no broadcaster or other test uses
    db = await Database.connect(database_url, min_size=1, max_size=1)
    statements: list[str] = []
    try:
        async with db.connection() as conn:
            conn.add_query_logger(lambda record: statements.append(record.query))
        lane = await _held_lane(db, chain_id, executor, 40)

        async def simulated(count: int, tag: bytes) -> list[int]:
            return await _simulated(daemon, chain_id, tag, count)

        def sign(job: Job, nonce: int) -> SignedTx:
            tx_hash = bytes([job.id % 256, nonce % 256]) + b"\x00" * 30
            return SignedTx(job.id, tx_hash, b"raw", nonce, 100_000, 1, 0)

        counts, batches = [], []
        for size, tag in ((1, b"\x60"), (1, b"\x61"), (6, b"\x62")):  # the first prepares the statements
            ids = await simulated(size, tag)
            statements.clear()
            signed = await lane.sign_simulated(executor, 1, ids, sign, 20, Rejection("invalid_auth_payload"))
            assert [tx.job_id for tx in signed] == ids
            counts.append(len(statements))
            batches.append(signed)
        assert [tx.nonce for tx in signed] == list(range(42, 48))  # after the single jobs' 40 and 41
        states = await db.fetch(
            "SELECT state, executor_nonce FROM relay_jobs WHERE chain_id = $1 ORDER BY id", chain_id
        )
        assert [(r["state"], r["executor_nonce"]) for r in states] == [("signed", n) for n in range(40, 48)]
        assert counts[1] == counts[2] == 4, (counts, statements)  # BEGIN, 2 statements, COMMIT (6 before)
        await lane.mark_broadcast(batches[0])  # prepares the statement
        statements.clear()  # the broadcast of a batch: one statement, one round trip
        submitted = await lane.mark_broadcast(signed)
        assert len(statements) == 1, statements
        assert sorted(j.id for j in submitted) == ids
        assert {j.state for j in submitted} == {JobState.SUBMITTED}
        stamps = [j.timestamps for j in submitted]  # what the stage metric reads, and only that
        assert all(set(t) == {"accepted_at", "submitted_at"} and None not in t.values() for t in stamps)
        sent = await db.fetch(
            "SELECT job_id FROM relay_transactions WHERE chain_id = $1 AND broadcast_at IS NOT NULL", chain_id
        )
        assert sorted(r["job_id"] for r in sent) == [batches[0][0].job_id, *ids]
    finally:
        await db.close()


async def test_a_batch_signed_before_its_claim_is_one_statement_or_nothing_written(
    daemon: Daemon, database_url: str
) -> None:
    """The broadcaster's batch (jobs as it read them) is signed first at the lane's next nonce
    as the process last knew it, then journaled and moved to signed in one statement: one
    round trip. When anything differs (a job planned again or taken meanwhile, the next nonce
    moved, an expiring authorization) that statement writes nothing and the batch is signed
    the general way from the rows it claims; when the lease moved on, nothing is signed."""
    from relayer.domain.errors import Rejection
    from relayer.store.executor_lane import LeaseLost, SignedTx
    from relayer.store.pool import Database
    from relayer.store.relay_jobs import Job

    chain_id, executor = 94, "0xoneexecutor"  # a chain no broadcaster or other test uses
    expired = Rejection("invalid_auth_payload")
    db = await Database.connect(database_url, min_size=1, max_size=1)
    statements: list[str] = []
    try:
        async with db.connection() as conn:
            conn.add_query_logger(lambda record: statements.append(record.query))
        lane = await _held_lane(db, chain_id, executor, 40)

        async def simulated(count: int, tag: bytes, expires_in: int = 3_600) -> list[Job]:
            plan = {"max_fee_per_gas": 7, "max_priority_fee_per_gas": 1}
            await _simulated(daemon, chain_id, tag, count, expires_in, **plan)
            return await lane.next_simulated(32)  # as the broadcaster reads them

        def sign(job: Job, nonce: int) -> SignedTx:
            assert job.gas_limit is not None and job.max_fee_per_gas is not None
            tx_hash = bytes([job.id % 256, nonce % 256, job.gas_limit % 256]) + b"\x00" * 29
            tip = job.max_priority_fee_per_gas or 0
            return SignedTx(job.id, tx_hash, b"raw", nonce, job.gas_limit, job.max_fee_per_gas, tip)

        async def signed_rows() -> list[tuple[int, str, int | None]]:
            rows = await db.fetch(
                "SELECT id, state, executor_nonce FROM relay_jobs WHERE chain_id = $1 ORDER BY id", chain_id
            )
            return [(r["id"], r["state"], r["executor_nonce"]) for r in rows]

        async def journal() -> list[tuple[int, int, int]]:
            rows = await db.fetch(
                "SELECT job_id, nonce, gas_limit FROM relay_transactions WHERE chain_id = $1 ORDER BY nonce",
                chain_id,
            )
            return [(r["job_id"], r["nonce"], r["gas_limit"]) for r in rows]

        # the way it goes: one statement, the nonces from the reconciled 40
        await lane.sign_batch(executor, 1, await simulated(1, b"\x70"), sign, 20, expired)  # prepares it
        jobs = await simulated(3, b"\x71")
        statements.clear()
        signed = await lane.sign_batch(executor, 1, jobs, sign, 20, expired)
        assert len(statements) == 1, statements
        assert [(tx.job_id, tx.nonce) for tx in signed] == [(j.id, 41 + i) for i, j in enumerate(jobs)]
        assert (await signed_rows())[1:] == [(j.id, "signed", 41 + i) for i, j in enumerate(jobs)]

        # a job planned again after the read: nothing of the first try is written, and the
        # batch is signed from the rows claimed (the new gas limit), at the same nonces
        jobs = await simulated(2, b"\x72")
        await db.execute("UPDATE relay_jobs SET gas_limit = 123456 WHERE id = $1", jobs[1].id)
        statements.clear()
        signed = await lane.sign_batch(executor, 1, jobs, sign, 20, expired)
        assert len(statements) > 1
        assert [(tx.job_id, tx.nonce, tx.gas_limit) for tx in signed] == [
            (jobs[0].id, 44, 100_000),
            (jobs[1].id, 45, 123_456),
        ]

        # the next nonce moved under the guess (another writer of the lane): the claim's
        # allocation stands, and nothing was journaled at the guessed nonce
        await db.execute("UPDATE executor_nonces SET next_nonce = 50 WHERE chain_id = $1", chain_id)
        jobs = await simulated(1, b"\x73")
        signed = await lane.sign_batch(executor, 1, jobs, sign, 20, expired)
        assert [(tx.job_id, tx.nonce) for tx in signed] == [(jobs[0].id, 50)]

        # a job another lane took meanwhile: the rest is signed, at consecutive nonces
        jobs = await simulated(3, b"\x74")
        await db.execute("UPDATE relay_jobs SET state = 'signed' WHERE id = $1", jobs[0].id)
        signed = await lane.sign_batch(executor, 1, jobs, sign, 20, expired)
        assert [(tx.job_id, tx.nonce) for tx in signed] == [(jobs[1].id, 51), (jobs[2].id, 52)]

        # an authorization expiring within the margin is rejected, never signed
        jobs = await simulated(1, b"\x75", expires_in=10)
        assert await lane.sign_batch(executor, 1, jobs, sign, 20, expired) == []
        assert (await signed_rows())[-1] == (jobs[0].id, "rejected", None)

        # the lease moved on: nothing is signed, and the jobs stay simulated
        jobs = await simulated(2, b"\x76")
        await db.execute("UPDATE executor_leases SET epoch = 2 WHERE chain_id = $1", chain_id)
        with pytest.raises(LeaseLost):
            await lane.sign_batch(executor, 1, jobs, sign, 20, expired)
        assert (await signed_rows())[-2:] == [(j.id, "simulated", None) for j in jobs]

        # the journal holds exactly what was signed: no transaction of a try that wrote nothing
        journaled = await journal()
        assert [n for _, n, _ in journaled] == [40, 41, 42, 43, 44, 45, 50, 51, 52]
        assert len({job_id for job_id, _, _ in journaled}) == len(journaled)
    finally:
        await db.close()
