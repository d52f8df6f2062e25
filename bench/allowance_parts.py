"""The gas allowance's parts (L2 execution, L1 data fee, operator fee, margin) that
prepare-auth asks a payer to sign, for a class and a listing retirement, with the shortest
and the longest details, at two GasPriceOracle settings on a private devnet: the devnet's
own, and a mainnet-like one set here (OP Mainnet's published blob scalars, an L1 base fee of
10 gwei, a blob base fee of 1 gwei, an L2 base fee near Base's 0.005 gwei). Prints one JSON
object a line. Loopback only.

    .venv/bin/python bench/allowance_parts.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from eth_account import Account
from web3 import Web3

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import free_port  # noqa: E402
from relayer.app import make_web_app, open_runtime  # noqa: E402
from relayer.chain.abi import abi  # noqa: E402
from relayer.config import Settings  # noqa: E402
from relayer.store.migrations import migrate  # noqa: E402
from relayer_dev import devdb, devnet  # noqa: E402
from relayer_dev.deploy import GAS_PRICE_ORACLE, deploy_and_seed  # noqa: E402

MAINNET_LIKE = {
    "l1BaseFee": 10 * 10**9,
    "blobBaseFee": 10**9,
    "scalars": (1368, 810949),
    "l2BaseFee": 5 * 10**6,
}
LONGEST = {"beneficiaryString": "b" * 200, "retiringEntityString": "r" * 200, "retirementMessage": "m" * 1000}


def set_oracle(info: dict[str, Any], l1: int, blob: int, scalars: tuple[int, int]) -> None:
    w3 = Web3(Web3.HTTPProvider(info["rpcUrl"]))
    sender = Account.from_key(info["deployer"]["privateKey"])
    oracle = w3.eth.contract(address=Web3.to_checksum_address(GAS_PRICE_ORACLE), abi=abi("GasPriceOracleDev"))
    tx = oracle.functions.setL1Fees(l1, blob, *scalars).build_transaction(
        {
            "from": sender.address,
            "nonce": w3.eth.get_transaction_count(sender.address),
            "chainId": info["chainId"],
        }
    )
    w3.eth.wait_for_transaction_receipt(
        w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction)
    )


async def parts(
    session: aiohttp.ClientSession, base: str, info: dict[str, Any], route: dict[str, Any]
) -> None:
    payer = info["payers"][0]
    for label, extra in (("shortest details", {}), ("longest details", LONGEST)):
        body = {
            "action": "prepare-auth",
            "from": payer["address"],
            "amount": "1",
            "inputToken": "USDC",
            "details": {"beneficiaryIsPayer": True, **extra},
            **route,
        }
        async with session.post(f"{base}/api", json=body) as r:
            out = await r.json()
        print(
            json.dumps(
                {
                    "route": route,
                    "details": label,
                    "gasAllowance": out["gasAllowance"],
                    **out["gasAllowanceParts"],
                }
            )
        )


async def main() -> None:
    admin = devdb.ensure_database_url(os.environ.get("RELAYER_DATABASE_URL"), ROOT / ".devdata")
    dsn = devdb.create_scratch_database(admin, prefix="relayer_bench")
    migrate(dsn)
    state = Path(tempfile.mkdtemp(prefix="relayer-parts-"))
    anvil_port, http_port = free_port(), free_port()
    proc = devnet.start_anvil(state, anvil_port, 84532, None)
    try:
        info = deploy_and_seed(devnet.rpc_url(anvil_port), 84532, devnet.DEFAULT_PROJECTS_FILE)
        (state / "devnet.json").write_text(json.dumps(info))
        base = f"http://127.0.0.1:{http_port}"
        settings = Settings(
            database_url=dsn,
            executor_private_key=info["executor"]["privateKey"],
            rpc_url=info["rpcUrl"],
            chain_id=84532,
            deployment_file=state / "devnet.json",
            http_port=http_port,
            public_base_url=base,
            block_poll_interval_s=0.05,
        )
        routes = [{"carbonClass": "RE"}, {"listingId": str(info["listings"][0]["listingId"])}]
        async with open_runtime(settings, workers=True) as rt:
            runner = web.AppRunner(make_web_app(rt), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", http_port).start()
            async with aiohttp.ClientSession() as session:
                print(
                    json.dumps(
                        {"setting": "devnet oracle (1 gwei L1 base fee, 1 wei blob base fee, 1368/810949)"}
                    )
                )
                for route in routes:
                    await parts(session, base, info, route)
                w3 = Web3(Web3.HTTPProvider(info["rpcUrl"]))
                w3.provider.make_request("anvil_setNextBlockBaseFeePerGas", [hex(MAINNET_LIKE["l2BaseFee"])])  # type: ignore[arg-type]
                set_oracle(
                    info, MAINNET_LIKE["l1BaseFee"], MAINNET_LIKE["blobBaseFee"], MAINNET_LIKE["scalars"]
                )
                await asyncio.sleep(0.5)  # the daemon sees the new head
                print(json.dumps({"setting": "mainnet-like", **{k: str(v) for k, v in MAINNET_LIKE.items()}}))
                for route in routes:
                    await parts(session, base, info, route)
            await runner.cleanup()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        devdb.drop_database(admin, dsn.rsplit("/", 1)[1])


if __name__ == "__main__":
    asyncio.run(main())
