"""The broadcaster: holds the executor lease, allocates nonces from the lane in Postgres,
simulates each signing batch again (what reverts now is refused, never signed), signs the
rest (raw bytes committed before broadcast) and sends them; its lane keeper
re-sends, replaces with bumped fees and fills nonces (:mod:`relayer.workers.lane_keeper`).
After taking the lease it re-sends the same bytes of every live transaction. A job only ever
gets a second transaction as a same-nonce replacement with the same call, or a no-op."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from relayer.chain.errors import ChainUnavailable
from relayer.chain.executor import ExecutorChain
from relayer.chain.signer import ExecutorSigner
from relayer.domain.errors import Rejection, Unavailable
from relayer.metrics import Metrics
from relayer.service.simulate import Simulator
from relayer.store.executor_lane import ExecutorLane, LeaseLost, SignedTx
from relayer.store.lease import ExecutorLease
from relayer.store.notify import JobNotifications
from relayer.store.relay_jobs import Job
from relayer.workers import OutageLog, sleep_or_stop
from relayer.workers.lane_keeper import LaneKeeper

log = logging.getLogger(__name__)

BATCH: Final = 32
IDLE_WAIT_S: Final = 1.0
LEASE_RETRY_S: Final = 5.0
SIGN_EXPIRY_MARGIN_S: Final = 20
EXPIRED: Final = Rejection("invalid_auth_payload", "the authorization expired before it could be sent")


class Broadcaster:
    """Signs and sends simulated jobs for one executor key."""

    def __init__(
        self,
        chain: ExecutorChain,
        lane: ExecutorLane,
        keeper: LaneKeeper,
        signer: ExecutorSigner,
        lease: ExecutorLease,
        notifications: JobNotifications,
        metrics: Metrics,
        simulator: Simulator,
    ) -> None:
        self.chain = chain
        self.simulator = simulator
        self.lane = lane
        self.keeper = keeper
        self.signer = signer
        self.lease = lease
        self.notifications = notifications
        self.metrics = metrics

    def _sign(self, job: Job, nonce: int) -> SignedTx:
        assert job.gas_limit is not None and job.max_fee_per_gas is not None
        tip = job.max_priority_fee_per_gas or 0
        raw, tx_hash = self.signer.sign(
            to=job.settlement,
            data=job.call_data,
            nonce=nonce,
            gas=job.gas_limit,
            max_fee_per_gas=job.max_fee_per_gas,
            max_priority_fee_per_gas=tip,
        )
        return SignedTx(job.id, tx_hash, raw, nonce, job.gas_limit, job.max_fee_per_gas, tip)

    async def start_lane(self) -> None:
        """Reconcile the nonce lane with the chain and re-send every live transaction."""
        pending = await self.chain.pending_nonce(self.signer.address)
        nxt = await self.lane.reconcile_nonce(self.signer.address, pending)
        resent = await self.keeper.resend_all()
        log.info(
            "executor lane ready",
            extra={"executor": self.signer.address, "next_nonce": nxt, "resending": resent},
        )

    async def step(self) -> int:
        """Sign and send one batch of simulated jobs, then keep the lane moving; returns how
        many were signed.

        Raises:
            LeaseLost: another process took the key (nothing more is signed or sent).
        """
        epoch = self._epoch()
        batch = await self.lane.next_simulated(BATCH)
        good = await self.simulator.recheck(batch) if batch else []
        signed = await self.lane.sign_simulated(
            self.signer.address, epoch, good, self._sign, SIGN_EXPIRY_MARGIN_S, EXPIRED
        )
        for _ in signed:
            self.metrics.job_transitions.labels("signed").inc()
        await self.keeper.send(signed)
        if not await self.lane.holds(self.signer.address, epoch):
            raise LeaseLost(message="the executor lease moved on")
        await self.keeper.upkeep(epoch)
        return len(signed)

    def _epoch(self) -> int:
        if self.lease.epoch is None:
            raise LeaseLost(message="no executor lease held")
        return self.lease.epoch

    async def run(self, stop: asyncio.Event) -> None:
        """Take the lease, ready the lane, then sign and send until ``stop``; when the lease
        is lost (its session gone, or another process took the key) stop signing at once
        and go back to taking it. Failures are retried after a pause; the lease is released
        when this returns or raises."""
        try:
            while await self._take_lease(stop):
                await self._work(stop)
        finally:
            await self.lease.release()

    async def _take_lease(self, stop: asyncio.Event) -> bool:
        """Wait (retrying) until this process holds the lease; False when asked to stop."""
        while not stop.is_set():
            try:
                if await self.lease.try_acquire():
                    log.info(
                        "executor lease taken",
                        extra={"executor": self.signer.address, "epoch": self.lease.epoch},
                    )
                    return True
                log.info(
                    "executor lease held elsewhere; standing by", extra={"executor": self.signer.address}
                )
            except Exception as exc:
                log.warning("lease attempt failed", extra={"reason": type(exc).__name__})
            await sleep_or_stop(stop, LEASE_RETRY_S)
        return False

    async def _work(self, stop: asyncio.Event) -> None:
        """Ready the lane, then step until ``stop`` or until the lease is lost."""
        while not stop.is_set():
            try:
                await self.start_lane()
                break
            except Exception as exc:
                self.metrics.rpc_errors.labels("broadcaster").inc()
                log.warning("executor lane not ready; retrying", extra={"reason": type(exc).__name__})
                await sleep_or_stop(stop, IDLE_WAIT_S)
        outage = OutageLog("broadcaster")
        while not stop.is_set():
            self.notifications.any_change.clear()
            try:
                if not await self.lease.alive():
                    raise LeaseLost(message="the executor lease's session is gone")
                signed = await self.step()
                outage.recovered()
                if signed:
                    continue
            except LeaseLost as exc:
                log.warning("executor lease lost; signing stopped", extra={"reason": exc.message})
                await self.lease.release()
                return
            except Unavailable as exc:
                if isinstance(exc, ChainUnavailable):
                    self.metrics.rpc_errors.labels("broadcaster").inc()
                outage.failed(exc)
            except Exception:
                log.exception("broadcaster step failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.notifications.any_change.wait(), IDLE_WAIT_S)
