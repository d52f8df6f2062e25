"""Base's full transaction cost in the gas allowance (issue 7), each on a chain of its own:
the L1 data fee and the operator fee moved on the devnet's GasPriceOracle (at the predeploy
address), the caller's details growing the L1 fee, and a stale ETH/USD feed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.chain_helpers import transact_as_deployer
from tests.conftest import Daemon
from tests.helpers.relay import challenge, signed_request
from tests.private import private_daemon

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ORACLE = "0x420000000000000000000000000000000000000F"
LONG = "x" * 1000  # the schema's longest message


async def _once_moved(d: Daemon, key: str, old: str) -> dict[str, Any]:
    """A challenge once the daemon has seen the block that moved ``gasAllowanceParts[key]``
    (its reads are cached per head; bounded wait)."""
    deadline = time.monotonic() + 10
    while True:
        ch = await _challenge(d)
        if ch["gasAllowanceParts"][key] != old or time.monotonic() > deadline:
            return ch
        await asyncio.sleep(0.05)


async def _challenge(d: Daemon, message: str = "") -> dict[str, Any]:
    payer = d.chain["payers"][0]
    details: dict[str, Any] = {"beneficiaryIsPayer": True, "beneficiaryString": "Test beneficiary"}
    if message:
        details["retirementMessage"] = message
    return await challenge(d, payer, carbonClass="RE", amount="0.01", inputToken="USDC", details=details)


def _parts(ch: dict[str, Any]) -> dict[str, int]:
    parts = ch["gasAllowanceParts"]
    out = {k: int(parts[k]) for k in ("l2Execution", "l1DataFee", "operatorFee", "margin")}
    assert sum(out.values()) == int(ch["gasAllowance"])  # the parts sum to the allowance
    return out


async def test_raised_l1_and_operator_fees_raise_the_allowance_and_refuse_an_old_authorization(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with private_daemon(tmp_path, admin_database_url) as (d, _anvil):
        payer = d.chain["payers"][0]
        before = await _challenge(d)
        low = _parts(before)
        assert low["l1DataFee"] > 0  # the devnet's oracle: OP Mainnet's scalars, a 1 gwei L1 base fee
        old_body = signed_request(before, payer["privateKey"])
        # The L1 base fee x100,000 and an operator fee of 0.001 ETH a transaction.
        transact_as_deployer(d.chain, ORACLE, "GasPriceOracleDev", "setL1Fees", 10**14, 1, 1368, 810949)
        transact_as_deployer(d.chain, ORACLE, "GasPriceOracleDev", "setOperatorFee", 1_000_000, 10**15)
        after = await _once_moved(d, "operatorFee", before["gasAllowanceParts"]["operatorFee"])
        high = _parts(after)
        assert high["l1DataFee"] > 1000 * low["l1DataFee"]
        assert high["operatorFee"] > 0 == low["operatorFee"]
        assert int(after["gasAllowance"]) > int(before["gasAllowance"])
        # The longest details cost more L1 data than the shortest.
        long_msg = _parts(await _challenge(d, LONG))
        assert long_msg["l1DataFee"] > high["l1DataFee"]
        # Signed under the old allowance: refused before signing, never sent at a loss.
        executor = d.chain["executor"]["address"]
        nonce = await d.runtime.executor.pending_nonce(executor)
        status, refused = await d.post(old_body)
        assert (status, refused["error"]) == (400, "insufficient_authorized_value"), refused
        assert int(refused["requiredGasAllowance"]) > int(before["gasAllowance"])
        assert await d.runtime.executor.pending_nonce(executor) == nonce
        # Signed under the new one: settles (the ledger check at teardown holds it to its allowance).
        status, settled = await d.post(signed_request(after, payer["privateKey"]))
        assert (status, settled["status"]) == (200, "settled"), settled
        print(
            f"\nallowance (USDC atomic) at the devnet's oracle: {before['gasAllowance']} {low}; "
            f"L1 base fee 100,000 gwei and operator fee 0.001 ETH: {after['gasAllowance']} {high}; "
            f"with a 1,000-character message: L1 part {long_msg['l1DataFee']}; "
            "old authorization refused (insufficient_authorized_value), new one settled"
        )


async def test_a_stale_price_feed_falls_back_to_the_configured_bound(
    tmp_path: Path, admin_database_url: str
) -> None:
    bound = 5_000 * 10**6  # the configured bound: 5,000 USDC an ETH; the feed says 3,000
    async with private_daemon(tmp_path, admin_database_url, eth_price_usdc=bound) as (d, _anvil):
        fresh = await _challenge(d)
        assert fresh["gasAllowanceParts"]["ethPriceSource"] == "feed"
        assert fresh["gasAllowanceParts"]["ethPriceUsdc"] == str(3_000 * 10**6)
        feed = d.chain["contracts"]["ethUsdFeed"]
        transact_as_deployer(
            d.chain, feed, "EthUsdFeedDev", "setAnswer", 3_000 * 10**8, int(time.time()) - 2 * 3600
        )
        stale = await _once_moved(d, "ethPriceSource", "feed")
        assert stale["gasAllowanceParts"]["ethPriceSource"] == "bound"
        assert stale["gasAllowanceParts"]["ethPriceUsdc"] == str(bound)
        assert int(stale["gasAllowance"]) > int(fresh["gasAllowance"])
        status, settled = await d.post(signed_request(stale, d.chain["payers"][0]["privateKey"]))
        assert (status, settled["status"]) == (200, "settled"), settled
        print(
            f"\nstale feed: ETH priced at the bound ({bound}) instead of the feed's 3000000000; "
            f"allowance {fresh['gasAllowance']} -> {stale['gasAllowance']}; settled"
        )
