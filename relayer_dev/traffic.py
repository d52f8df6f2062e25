"""``python -m relayer_dev traffic``: background traffic for the devnet, so the daemon's
follower and indexers see blocks like Base's (issue 20, item 1): other senders' ERC-20
transfers, each emitting a ``Transfer`` log, at a steady rate.

Set-up (anvil only): :data:`BANK_KEY` and ``accounts`` deterministic sender keys get ETH
with ``anvil_setBalance``; the bank deploys a token of its own (the reference
``UsdcEip3009`` named "Background traffic") and mints it to every sender; when a devnet
description is given, its deployer mints the devnet's USDC and kVCM to the bank, which hands
every sender a stock of each. The deployer signs two transactions only, once, before the
traffic starts.

Traffic: every :data:`TICK_S` the transfers due at ``tps`` are signed locally (one nonce
counter per sender, round robin over the senders; the fast EIP-1559 signer of
:mod:`relayer.chain.signer`) and sent as one JSON-RPC batch of ``eth_sendRawTransaction``,
without waiting for receipts. A share ``ours_share`` of them moves the devnet's USDC or kVCM
(the daemon's own token contracts), the rest the bank's token. Bounded: at most
:data:`MAX_IN_FLIGHT` batches in flight and :data:`MAX_BATCH` transfers a batch; what falls
further behind than that is skipped and counted as ``shortfall``, never queued. A sender the
node refused is paused until its nonce is read again from the node. Stops on SIGINT or
SIGTERM (or after ``seconds``), lets the batches in flight finish (bounded) and returns a
summary; a report is logged every ``report_every`` seconds. Dev chains only: every key here
is public.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
import rlp
from eth_abi.abi import encode
from eth_account import Account
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak

from relayer.chain.abi import artifact
from relayer.chain.signer import ExecutorSigner
from relayer_dev import DevError

log = logging.getLogger("relayer_dev.traffic")

BANK_KEY: Final = "0x" + keccak(text="relayer-dev traffic bank").hex()
TOKEN_NAME: Final = "Background traffic"
TRANSFER_SELECTOR: Final = keccak(text="transfer(address,uint256)")[:4]
MINT_SELECTOR: Final = keccak(text="mint(address,uint256)")[:4]
BALANCE_OF_SELECTOR: Final = keccak(text="balanceOf(address)")[:4]
TRANSFER_TOPIC: Final = "0x" + keccak(text="Transfer(address,address,uint256)").hex()

TICK_S: Final = 0.025
MAX_IN_FLIGHT: Final = 8
MAX_BATCH: Final = 64
TRANSFER_GAS: Final = 100_000
"""Gas limit of a transfer or mint: an OpenZeppelin ERC-20 transfer to a new holder uses about 52k."""
PRIORITY_FEE_WEI: Final = 1_000_000
SENDER_ETH_WEI: Final = 10**21
SENDER_STOCK: Final = 10**12
"""Atomic units of each token a sender gets (a million USDC; a transfer moves under 1000)."""
SETUP_TIMEOUT_S: Final = 120.0
RPC_TIMEOUT_S: Final = 30.0
DRAIN_TIMEOUT_S: Final = 10.0
MAX_ERROR_KINDS: Final = 20


class TrafficError(DevError):
    """The node is not an anvil that accepts the set-up, or a set-up transaction failed."""


@dataclasses.dataclass(frozen=True)
class TrafficOptions:
    """What to send and where.

    Attributes:
        rpc_url: the node's JSON-RPC URL (an anvil).
        tps: transfers a second to send.
        accounts: number of sender accounts.
        seconds: stop after this many seconds of traffic (``None``: until SIGINT/SIGTERM).
        deployment: the devnet description (``devnet.json``): its ``contracts`` ``usdc`` and
            ``kvcm`` and its ``deployer`` key; ``None``: the bank's token only.
        ours_share: share of the transfers that move the devnet's USDC or kVCM (0 to 1).
        report_every: seconds between progress reports in the log.
    """

    rpc_url: str
    tps: float
    accounts: int = 100
    seconds: float | None = None
    deployment: dict[str, Any] | None = None
    ours_share: float = 0.5
    report_every: float = 5.0


def sender_key(index: int) -> str:
    """The ``index``-th traffic sender's private key (0x hex): keccak of a fixed phrase."""
    return "0x" + keccak(text=f"relayer-dev traffic sender {index}").hex()


def _call_data(selector: bytes, to: str, amount: int) -> bytes:
    return selector + encode(["address", "uint256"], [to, amount])


def _create_address(sender: str, nonce: int) -> str:
    """The address of the contract ``sender`` creates with its transaction of ``nonce``."""
    return str(to_checksum_address(keccak(rlp.encode([bytes.fromhex(sender[2:]), nonce]))[12:]))


class _Rpc:
    """JSON-RPC over one aiohttp session; a batch is one HTTP request."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url
        self._id = 0

    async def batch(self, calls: Sequence[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
        """The replies to ``calls`` (method, params), in order; each ``{"result"}`` or ``{"error"}``.

        Raises:
            aiohttp.ClientError, TimeoutError, ValueError: the request failed or the answer
                is not a JSON-RPC batch reply.
        """
        first = self._id
        self._id += len(calls)
        body = [
            {"jsonrpc": "2.0", "id": first + i, "method": m, "params": p} for i, (m, p) in enumerate(calls)
        ]
        async with self.session.post(
            self.url, data=json.dumps(body), headers={"content-type": "application/json"}
        ) as r:
            replies = await r.json(content_type=None)
        if not isinstance(replies, list):
            raise ValueError(f"not a batch reply: {str(replies)[:200]}")
        by_id = {reply.get("id"): reply for reply in replies if isinstance(reply, dict)}
        return [by_id.get(first + i, {"error": {"message": "no reply"}}) for i in range(len(calls))]

    async def call(self, method: str, params: list[Any]) -> Any:
        """One call's result.

        Raises:
            TrafficError: the node answered with an error or not at all.
        """
        try:
            (reply,) = await self.batch([(method, params)])
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise TrafficError(f"{method} on {self.url}: {exc}") from exc
        if "error" in reply:
            raise TrafficError(f"{method} on {self.url}: {reply['error'].get('message', reply['error'])}")
        return reply.get("result")

    async def send_all(self, raws: Sequence[bytes]) -> None:
        """Broadcast set-up transactions; any refusal fails the set-up."""
        for reply in await self.batch([("eth_sendRawTransaction", ["0x" + raw.hex()]) for raw in raws]):
            if "error" in reply:
                raise TrafficError(f"set-up transaction refused: {reply['error'].get('message')}")

    async def wait_nonces(self, targets: dict[str, int]) -> None:
        """Until every address's mined nonce reaches its target (bounded by :data:`SETUP_TIMEOUT_S`)."""
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while True:
            replies = await self.batch([("eth_getTransactionCount", [a, "latest"]) for a in targets])
            if all(
                int(r.get("result", "0x0"), 16) >= n for r, n in zip(replies, targets.values(), strict=True)
            ):
                return
            if time.monotonic() > deadline:
                raise TrafficError(f"set-up transactions not mined within {SETUP_TIMEOUT_S:.0f} s")
            await asyncio.sleep(0.05)


@dataclasses.dataclass
class _Traffic:
    """The senders, the tokens and the tallies of one run."""

    senders: list[ExecutorSigner]
    nonces: list[int]
    ours: list[str]
    own: str
    ours_share: float
    max_fee: int
    accepted: int = 0
    sent: int = 0
    shortfall: int = 0
    errors: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    paused: set[int] = dataclasses.field(default_factory=set)
    cursor: int = 0

    def next_transfer(self, k: int) -> tuple[int, bytes] | None:
        """The ``k``-th transfer, signed: (sender index, raw transaction); ``None`` when every
        sender is paused."""
        n = len(self.senders)
        for _ in range(n):
            i, self.cursor = self.cursor, (self.cursor + 1) % n
            if i not in self.paused:
                break
        else:
            return None
        ours = self.ours and (k % 20) < round(20 * self.ours_share)
        token = self.ours[k % len(self.ours)] if ours else self.own
        recipient = self.senders[(i + 1 + k % 7) % n].address
        data = _call_data(TRANSFER_SELECTOR, recipient, 1 + k % 997)
        raw, _ = self.senders[i].sign(
            to=token,
            data=data,
            nonce=self.nonces[i],
            gas=TRANSFER_GAS,
            max_fee_per_gas=self.max_fee,
            max_priority_fee_per_gas=PRIORITY_FEE_WEI,
        )
        self.nonces[i] += 1
        return i, raw

    def refused(self, i: int, message: str) -> None:
        """Tally a refusal (messages cut short, at most :data:`MAX_ERROR_KINDS` kinds) and
        pause sender ``i`` until its nonce is read again."""
        kind = message[:60]
        if kind not in self.errors and len(self.errors) >= MAX_ERROR_KINDS:
            kind = "(other)"
        self.errors[kind] += 1
        self.paused.add(i)


async def _fund_and_deploy(rpc: _Rpc, options: TrafficOptions, chain_id: int, max_fee: int) -> _Traffic:
    """The set-up of the module docstring; returns the traffic ready to send."""
    bank = ExecutorSigner(BANK_KEY, chain_id)
    senders = [ExecutorSigner(sender_key(i), chain_id) for i in range(options.accounts)]
    everyone = [bank.address, *(s.address for s in senders)]
    for reply in await rpc.batch([("anvil_setBalance", [a, hex(SENDER_ETH_WEI)]) for a in everyone]):
        if "error" in reply:
            raise TrafficError(
                f"anvil_setBalance refused (is the node anvil?): {reply['error'].get('message')}"
            )
    counts = await rpc.batch([("eth_getTransactionCount", [a, "pending"]) for a in everyone])
    bank_nonce, *nonces = (int(r["result"], 16) for r in counts)
    bytecode = bytes.fromhex(str(artifact("UsdcEip3009")["bytecode"]).removeprefix("0x"))
    deploy: dict[str, Any] = {
        "type": 2,
        "chainId": chain_id,
        "nonce": bank_nonce,
        "value": 0,
        "data": bytecode + encode(["string"], [TOKEN_NAME]),
        "maxFeePerGas": max_fee,
        "maxPriorityFeePerGas": PRIORITY_FEE_WEI,
    }
    deploy["gas"] = 2 * int(await rpc.call("eth_estimateGas", [{**_hexed(deploy), "from": bank.address}]), 16)
    own = _create_address(bank.address, bank_nonce)
    raws = [bytes(Account.sign_transaction(deploy, BANK_KEY).raw_transaction)]
    targets = {bank.address: bank_nonce + 1}
    ours, deployer_key = _ours(options.deployment, chain_id)
    if deployer_key is not None:
        deployer = ExecutorSigner(deployer_key, chain_id)
        start = int(await rpc.call("eth_getTransactionCount", [deployer.address, "pending"]), 16)
        for j, token in enumerate(ours):
            stock = SENDER_STOCK * len(senders)
            raws.append(_setup_tx(deployer, token, MINT_SELECTOR, bank.address, stock, start + j, max_fee))
        targets[deployer.address] = start + len(ours)
    await rpc.send_all(raws)
    await rpc.wait_nonces(targets)
    if await rpc.call("eth_getCode", [own, "latest"]) in (None, "0x"):
        raise TrafficError(f"the traffic token was not deployed at {own}")
    nonce, raws = bank_nonce + 1, []
    for sender in senders:
        for token, selector in ((own, MINT_SELECTOR), *((t, TRANSFER_SELECTOR) for t in ours)):
            raws.append(_setup_tx(bank, token, selector, sender.address, SENDER_STOCK, nonce, max_fee))
            nonce += 1
    await rpc.send_all(raws)
    await rpc.wait_nonces({bank.address: nonce})
    await _check_stocks(rpc, [own, *ours], senders[-1].address)
    return _Traffic(senders, nonces, ours, own, options.ours_share, max_fee)


def _hexed(tx: dict[str, Any]) -> dict[str, Any]:
    """A transaction's call fields as JSON-RPC takes them (for ``eth_estimateGas``)."""
    return {"data": "0x" + bytes(tx["data"]).hex(), "value": hex(tx["value"])}


def _ours(deployment: dict[str, Any] | None, chain_id: int) -> tuple[list[str], str | None]:
    """The devnet's USDC and kVCM addresses and its deployer's key (none without a description).

    Raises:
        TrafficError: the description is of another chain or lacks the tokens or the deployer.
    """
    if deployment is None:
        return [], None
    try:
        if int(deployment["chainId"]) != chain_id:
            raise TrafficError(f"the deployment is of chain {deployment['chainId']}, the node is {chain_id}")
        contracts = deployment["contracts"]
        return [str(contracts["usdc"]), str(contracts["kvcm"])], str(deployment["deployer"]["privateKey"])
    except (KeyError, TypeError) as exc:
        raise TrafficError(f"the deployment lacks {exc}: expected a devnet.json") from exc


def _setup_tx(
    signer: ExecutorSigner, token: str, selector: bytes, to: str, amount: int, nonce: int, max_fee: int
) -> bytes:
    raw, _ = signer.sign(
        to=token,
        data=_call_data(selector, to, amount),
        nonce=nonce,
        gas=TRANSFER_GAS,
        max_fee_per_gas=max_fee,
        max_priority_fee_per_gas=PRIORITY_FEE_WEI,
    )
    return raw


async def _check_stocks(rpc: _Rpc, tokens: list[str], holder: str) -> None:
    """Raise :class:`TrafficError` unless ``holder`` holds each of ``tokens`` (the set-up's
    mints and hand-outs did not revert)."""
    data = "0x" + (BALANCE_OF_SELECTOR + encode(["address"], [holder])).hex()
    replies = await rpc.batch([("eth_call", [{"to": t, "data": data}, "latest"]) for t in tokens])
    for token, reply in zip(tokens, replies, strict=True):
        if int(reply.get("result") or "0x0", 16) < SENDER_STOCK:
            raise TrafficError(f"set-up failed: sender {holder} holds no stock of token {token}")


async def _base_fee(rpc: _Rpc) -> tuple[int, int]:
    """(latest block number, its base fee per gas in wei)."""
    block = await rpc.call("eth_getBlockByNumber", ["latest", False])
    return int(block["number"], 16), int(block.get("baseFeePerGas") or "0x0", 16)


async def _send(rpc: _Rpc, traffic: _Traffic, batch: list[tuple[int, bytes]]) -> None:
    """Broadcast one batch and tally each transfer's answer."""
    try:
        replies = await rpc.batch([("eth_sendRawTransaction", ["0x" + raw.hex()]) for _, raw in batch])
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        for i, _ in batch:
            traffic.refused(i, f"request failed: {type(exc).__name__}")
        return
    for (i, _), reply in zip(batch, replies, strict=True):
        if "error" in reply:
            traffic.refused(i, str(reply["error"].get("message", reply["error"])))
        else:
            traffic.accepted += 1


async def _resync(rpc: _Rpc, traffic: _Traffic) -> None:
    """Read the pending nonce of up to :data:`MAX_BATCH` paused senders and resume them."""
    which = sorted(traffic.paused)[:MAX_BATCH]
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        replies = await rpc.batch(
            [("eth_getTransactionCount", [traffic.senders[i].address, "pending"]) for i in which]
        )
        for i, reply in zip(which, replies, strict=True):
            if "result" in reply:
                traffic.nonces[i] = int(reply["result"], 16)
                traffic.paused.discard(i)


@dataclasses.dataclass
class _Clock:
    """The send loop's bookkeeping: when it started, its reports, its CPU."""

    started: float = dataclasses.field(default_factory=time.monotonic)
    cpu_started: float = dataclasses.field(default_factory=time.process_time)
    last_report: float = dataclasses.field(default_factory=time.monotonic)
    ended: float | None = None
    last_accepted: int = 0
    last_block: tuple[float, int] | None = None


async def _report(rpc: _Rpc, traffic: _Traffic, clock: _Clock, target: float) -> None:
    """Log the rate since the last report and refresh the fee cap from the latest base fee."""
    now = time.monotonic()
    try:
        number, base_fee = await _base_fee(rpc)
    except TrafficError as exc:
        log.warning("traffic: could not read the latest block: %s", exc.message)
        return
    traffic.max_fee = max(traffic.max_fee, 2 * base_fee + PRIORITY_FEE_WEI)
    blocks = ""
    if clock.last_block is not None and now > clock.last_block[0]:
        blocks = f", {(number - clock.last_block[1]) / (now - clock.last_block[0]):.1f} blocks/s"
    rate = (traffic.accepted - clock.last_accepted) / max(now - clock.last_report, 1e-9)
    cpu = 100 * (time.process_time() - clock.cpu_started) / max(now - clock.started, 1e-9)
    log.info(
        "traffic: %.1f tx/s accepted (target %g), %d accepted, %d refused, %d short; "
        "block %d%s; CPU %.0f %% of a core",
        rate,
        target,
        traffic.accepted,
        sum(traffic.errors.values()),
        traffic.shortfall,
        number,
        blocks,
        cpu,
    )
    clock.last_report, clock.last_accepted, clock.last_block = now, traffic.accepted, (now, number)


async def _send_loop(rpc: _Rpc, traffic: _Traffic, options: TrafficOptions, stop: asyncio.Event) -> _Clock:
    """Send at ``options.tps`` until ``stop`` is set or ``options.seconds`` pass; returns the
    loop's clock. Waits (bounded) for the batches in flight before returning."""
    clock = _Clock()
    in_flight: set[asyncio.Task[None]] = set()
    resync: asyncio.Task[None] | None = None
    k = 0
    while not stop.is_set():
        now = time.monotonic()
        if options.seconds is not None and now - clock.started >= options.seconds:
            break
        due = int(options.tps * (now - clock.started)) - k - traffic.shortfall
        if due > MAX_BATCH:
            traffic.shortfall, due = traffic.shortfall + due - MAX_BATCH, MAX_BATCH
        if due > 0 and len(in_flight) < MAX_IN_FLIGHT:
            batch = [t for t in (traffic.next_transfer(k + j) for j in range(due)) if t is not None]
            traffic.shortfall += due - len(batch)
            k += due
            traffic.sent += len(batch)
            if batch:
                task = asyncio.create_task(_send(rpc, traffic, batch))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
        if traffic.paused and (resync is None or resync.done()):
            resync = asyncio.create_task(_resync(rpc, traffic))
        if now - clock.last_report >= options.report_every:
            await _report(rpc, traffic, clock, options.tps)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), TICK_S)
    clock.ended = time.monotonic()
    pending = [*in_flight, *([resync] if resync else [])]
    if pending:
        _, late = await asyncio.wait(pending, timeout=DRAIN_TIMEOUT_S)
        for task in late:
            task.cancel()
    return clock


async def _mined(rpc: _Rpc, traffic: _Traffic, start_nonces: list[int]) -> int:
    """Transfers mined so far: the senders' mined nonces less their nonces at the start."""
    replies = await rpc.batch([("eth_getTransactionCount", [s.address, "latest"]) for s in traffic.senders])
    return sum(int(r.get("result", "0x0"), 16) - n for r, n in zip(replies, start_nonces, strict=True))


async def run_traffic(options: TrafficOptions) -> dict[str, Any]:
    """Set up and send background traffic until SIGINT, SIGTERM or ``options.seconds``.

    Returns:
        The summary: ``targetTps``, ``achievedTps`` (transfers the node accepted a second of
        traffic), ``sent``, ``accepted``, ``mined`` (mined when it stopped), ``errors`` (refused
        or failed sends) and ``errorKinds`` (message -> count), ``shortfall`` (transfers skipped
        for being too far behind), ``seconds`` (of traffic), ``cpuSeconds`` and
        ``cpuPercentOfACore`` (this process during the traffic), ``accounts`` and ``tokens``
        (``traffic``: the bank's token; ``usdc``, ``kvcm`` when the devnet's are used).

    Raises:
        TrafficError: the node is not an anvil that accepts the set-up, or the set-up failed.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    timeout = aiohttp.ClientTimeout(total=RPC_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT + 2)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            rpc = _Rpc(session, options.rpc_url)
            chain_id = int(await rpc.call("eth_chainId", []), 16)
            _, base_fee = await _base_fee(rpc)
            traffic = await _fund_and_deploy(rpc, options, chain_id, 4 * base_fee + PRIORITY_FEE_WEI)
            start_nonces = list(traffic.nonces)
            log.info(
                "traffic: sending %g transfers/s from %d accounts to %s (tokens: %s)",
                options.tps,
                len(traffic.senders),
                options.rpc_url,
                ", ".join([traffic.own, *traffic.ours]),
            )
            clock = await _send_loop(rpc, traffic, options, stop)
            mined = await _mined(rpc, traffic, start_nonces)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return _summary(options, traffic, clock, mined)


def _summary(options: TrafficOptions, traffic: _Traffic, clock: _Clock, mined: int) -> dict[str, Any]:
    seconds = max((clock.ended or time.monotonic()) - clock.started, 1e-9)
    cpu = time.process_time() - clock.cpu_started
    tokens = {"traffic": traffic.own}
    if traffic.ours:
        tokens |= {"usdc": traffic.ours[0], "kvcm": traffic.ours[1]}
    return {
        "targetTps": options.tps,
        "achievedTps": round(traffic.accepted / seconds, 2),
        "sent": traffic.sent,
        "accepted": traffic.accepted,
        "mined": mined,
        "errors": sum(traffic.errors.values()),
        "errorKinds": dict(traffic.errors),
        "shortfall": traffic.shortfall,
        "seconds": round(seconds, 2),
        "cpuSeconds": round(cpu, 3),
        "cpuPercentOfACore": round(100 * cpu / seconds, 1),
        "accounts": len(traffic.senders),
        "tokens": tokens,
    }


def load_deployment(path: Path) -> dict[str, Any]:
    """A devnet description (``devnet.json``).

    Raises:
        TrafficError: the file is missing or not a JSON object.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrafficError(f"cannot read the deployment {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise TrafficError(f"{path} is not a devnet description")
    return data
