"""The broadcaster: holds the executor lease, allocates nonces from the lane in Postgres,
simulates each signing batch again (what reverts now is refused, never signed), signs the
rest (raw bytes committed before broadcast) and sends them; its lane keeper
re-sends, replaces with bumped fees and fills nonces (:mod:`relayer.workers.lane_keeper`).
Each step and the lane's start ask the chain guard first: while the node answers another chain
(or a deep reorg incident is open) nothing is signed, sent, re-sent or reconciled.
After taking the lease it re-sends the same bytes of every live transaction. A job only ever
gets a second transaction as a same-nonce replacement with the same call, or a no-op, or (a
foreign transaction took its nonce: :class:`~relayer.workers.nonces.LostNonces`) the same call
signed again at a new nonce."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final

from relayer.chain.errors import ChainUnavailable
from relayer.chain.executor import ExecutorChain
from relayer.chain.signer import ExecutorSigner
from relayer.domain.errors import Rejection, Unavailable
from relayer.domain.incidents import Incident
from relayer.logs import trace_fields
from relayer.metrics import Metrics
from relayer.service.simulate import Simulator
from relayer.store.executor_lane import ExecutorLane, LeaseLost, SignedTx
from relayer.store.lease import ExecutorLease
from relayer.store.notify import JobNotifications
from relayer.store.relay_jobs import Job
from relayer.workers import OutageLog, sleep_or_stop
from relayer.workers.chain_guard import ChainGuard
from relayer.workers.lane_keeper import LaneKeeper
from relayer.workers.nonces import LostNonces

log = logging.getLogger(__name__)

BATCH: Final = 32
IDLE_WAIT_S: Final = 1.0
LEASE_RETRY_S: Final = 5.0
SIGN_EXPIRY_MARGIN_S: Final = 20
EXPIRY_SLACK_S: Final = 2
"""A job expiring within the margin and this many seconds more (clocks differ) sends its
step's batch the general way, which rejects the chain's expiring jobs."""
EXPIRED: Final = Rejection("invalid_auth_payload", "the authorization expired before it could be sent")


LEASE_SPREAD_S: Final = 2.0
"""A process that already holds k executor leases waits k times this before taking another,
so processes started together split the keys between them."""
START_STAGGER_S: Final = 0.1


class LaneBoard:
    """The executor lanes of this process: the keys it holds a lease on, each lane's
    transactions in flight, and the lanes drained of new work (executor balance below the
    floor). Work goes to the lane with the least in flight: a lane claims at most enough
    to stay within half a batch of the least loaded other lane. ``taking`` lets one lease
    attempt of the process run at a time, so each sees the leases taken before it."""

    def __init__(self) -> None:
        self._in_flight: dict[str, int] = {}
        self._drained: set[str] = set()
        self.taking = asyncio.Lock()

    def held(self) -> int:
        return len(self._in_flight)

    def hold(self, executor: str) -> None:
        self._in_flight.setdefault(executor, 0)

    def drop(self, executor: str) -> None:
        self._in_flight.pop(executor, None)
        self._drained.discard(executor)

    def update(self, executor: str, in_flight: int, drained: bool) -> None:
        self._in_flight[executor] = in_flight
        if drained:
            self._drained.add(executor)
        else:
            self._drained.discard(executor)

    def claim_limit(self, executor: str, batch: int) -> int:
        """How many jobs the lane of ``executor`` may claim now (0 when drained)."""
        if executor in self._drained:
            return 0
        others = [n for e, n in self._in_flight.items() if e != executor and e not in self._drained]
        if not others:
            return batch
        return max(0, min(batch, min(others) + batch // 2 - self._in_flight.get(executor, 0)))


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
        board: LaneBoard | None = None,
        balance: Callable[[str], Awaitable[int]] | None = None,
        min_balance_wei: int = 0,
        key_index: int = 0,
        guard: ChainGuard | None = None,
    ) -> None:
        self.chain = chain
        self.guard = guard
        self.simulator = simulator
        self.board = board or LaneBoard()
        self._balance = balance
        self.min_balance_wei = min_balance_wei
        self.key_index = key_index
        self._drained = False
        self._registered = True
        self.lane = lane
        self.keeper = keeper
        self.signer = signer
        self.lease = lease
        self.notifications = notifications
        self._new_work = notifications.new_work()  # set when a job becomes simulated
        self.metrics = metrics
        self.lost = LostNonces(chain, lane, metrics, signer.address, self._sign, SIGN_EXPIRY_MARGIN_S)
        self._sending: asyncio.Future[None] | None = None  # the last batch's send and record
        self._out: asyncio.Future[None] | None = None  # set when the last batch's broadcast ended

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
        return SignedTx(
            job.id, tx_hash, raw, nonce, job.gas_limit, job.max_fee_per_gas, tip, request_id=job.request_id
        )

    async def start_lane(self) -> None:
        """Check that the settlement accepts this key as an executor (a key it does not
        takes no work: every transaction it sent would revert), reconcile the nonce lane
        with the chain and re-send every live transaction.

        Raises:
            Incident: the node answers another chain (nothing is reconciled or re-sent).
        """
        if self.guard is not None:
            await self.guard.check("broadcaster", now=True, lanes=True)
        self._registered = await self.chain.is_executor(self.signer.address)
        if not self._registered:
            log.error(
                "the settlement does not accept this key as an executor: its lane takes no work",
                extra={"executor": self.signer.address, "key": self.key_index},
            )
        pending = await self.chain.pending_nonce(self.signer.address)
        nxt = await self.lane.reconcile_nonce(self.signer.address, pending)
        resent = await self.keeper.resend_all()
        log.info(
            "executor lane ready",
            extra={"executor": self.signer.address, "next_nonce": nxt, "resending": resent},
        )

    async def step(self) -> int:
        """Sign one batch of simulated jobs and hand it to the sender (it goes out after the
        batches before it, while the next one is checked and signed), then keep the lane
        moving (the upkeep, when due, once the sends before it are done); returns how many
        were signed.

        Raises:
            LeaseLost: another process took the key (nothing more is signed or sent).
            Incident: the node answers another chain, or a deep reorg halted the follower
                (nothing is signed or sent).
        """
        epoch = self._epoch()
        if self.guard is not None:
            await self.guard.check("broadcaster", lanes=True)
        signed: list[SignedTx] = []
        failed: Unavailable | None = None
        fenced = False  # a signing statement found the lease at this epoch, this step
        try:
            # the lane's share and the oldest simulated jobs, read together (the share is
            # at most BATCH): one round trip of latency less a step
            limit, oldest = await asyncio.gather(self._claim_limit(), self.lane.next_simulated(BATCH))
            batch = oldest[:limit]
            good = set(await self.simulator.recheck(batch, self.signer.address) if batch else [])
            signed = await self._sign_batch(epoch, [job for job in batch if job.id in good], oldest)
            fenced = True
            if signed and len(batch) < len(oldest):
                # Simulated jobs beyond this lane's share are left: the other lanes look now,
                # not at their idle timeout (they may have found nothing to take a moment ago,
                # when this lane held these jobs). Only a step that signed wakes them, so the
                # lanes never wake each other without progress.
                self.notifications.wake_broadcasters(but=self._new_work)
            if limit:  # a lane that takes no new work signs no lost job again either
                signed += await self.lost.step(epoch)
        except Unavailable as exc:
            failed = exc  # the lane's own transactions still need their upkeep below
        for tx in signed:
            self.metrics.job_transitions.labels("signed").inc()
            log.info("signed", extra=trace_fields(tx.job_id, tx.tx_hash, tx.request_id, nonce=tx.nonce))
        self._send_next(signed)
        if self._sending is not None and self._sending.done():
            await self.sent()  # the sends before are done: a failure surfaces here
        if not fenced and not await self.lane.holds(self.signer.address, epoch):
            raise LeaseLost(message="the executor lease moved on")
        if self.keeper.upkeep_due():
            await self.sent()  # the lane's upkeep judges transactions the node has been sent
            await self.keeper.upkeep(epoch)
        if failed is not None:
            raise failed
        return len(signed)

    async def _sign_batch(self, epoch: int, good: list[Job], oldest: list[Job]) -> list[SignedTx]:
        """Sign ``good`` (checked again, oldest first) at ``epoch``: in one round trip
        (:meth:`ExecutorLane.sign_batch`) unless one of ``oldest`` (the simulated jobs looked
        at) expires within the margin; then, and for an empty batch, the general way
        (:meth:`ExecutorLane.sign_simulated`), which rejects the chain's expiring jobs.

        Raises:
            LeaseLost: another process took the lease; nothing was signed.
        """
        soon = time.time() + SIGN_EXPIRY_MARGIN_S + EXPIRY_SLACK_S
        address, margin = self.signer.address, SIGN_EXPIRY_MARGIN_S
        if good and all((job.auth_expires_at or 0) > soon for job in oldest):
            return await self.lane.sign_batch(address, epoch, good, self._sign, margin, EXPIRED)
        ids = [job.id for job in good]
        return await self.lane.sign_simulated(address, epoch, ids, self._sign, margin, EXPIRED)

    def _send_next(self, signed: list[SignedTx]) -> None:
        """Send ``signed`` (journaled already) after the batches before it, in the background:
        the next batch is claimed, checked and signed while this one is on its way. The
        broadcasts keep their order (nonce order): each goes out once the node has the batch
        before it, not once that batch's broadcast is recorded (the records run beside the
        next broadcasts). A batch's task ends after the tasks before it, so a failure of any
        surfaces at :meth:`sent`."""
        if not signed:
            return
        before, before_out = self._sending, self._out
        out: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def send() -> None:
            try:
                if before_out is not None:
                    await asyncio.shield(before_out)  # never fails: set when that broadcast ended
                taken = await self.keeper.broadcast(signed)
            finally:
                if not out.done():
                    out.set_result(None)
            try:
                await self.keeper.record(taken)
            finally:  # ends after the batches before it, whatever its record did
                if before is not None:
                    await asyncio.shield(before)

        self._out = out
        self._sending = asyncio.ensure_future(send())

    async def sent(self) -> None:
        """Wait until every batch handed to :meth:`_send_next` was sent and recorded.

        Raises:
            Unavailable: recording a send failed (its bytes are re-sent by the upkeep).
        """
        sending, self._sending, self._out = self._sending, None, None
        if sending is not None:
            await sending

    async def _claim_limit(self) -> int:
        """How many jobs this lane may take now: none while the executor's balance is below
        the floor (the lane still keeps its own transactions moving), else its share by the
        :class:`LaneBoard` rule.

        Raises:
            Unavailable: the chain node or the database failed.
        """
        address = self.signer.address
        if self.keeper.halted is not None:
            return 0  # a nonce gap halts the lane: no new work on top of it
        drained = not self._registered
        if not drained and self._balance is not None and self.min_balance_wei:
            balance = await self._balance(address)
            self.metrics.executor_balance_wei.labels(str(self.key_index)).set(balance)
            drained = balance < self.min_balance_wei
        if drained != self._drained:
            self._drained = drained
            self.metrics.executor_drained.labels(str(self.key_index)).set(1 if drained else 0)
            if drained:
                log.warning(
                    "executor balance below the floor: its lane takes no new work",
                    extra={"executor": address, "key": self.key_index},
                )
            else:
                log.info("executor balance back above the floor", extra={"executor": address})
        self.board.update(address, await self.lane.in_flight(address), drained)
        return self.board.claim_limit(address, BATCH)

    def _epoch(self) -> int:
        if self.lease.epoch is None:
            raise LeaseLost(message="no executor lease held")
        return self.lease.epoch

    async def run(self, stop: asyncio.Event) -> None:
        """Take the lease, ready the lane, then sign and send until ``stop``; when the lease
        is lost (its session gone, or another process took the key) stop signing at once
        and go back to taking it. Failures are retried after a pause. On ``stop`` the step
        in progress (a signing batch: sign, journal, send) ends first and no other starts;
        the lease is handed back (unlocked, so another process takes the key at once) when
        this returns or raises."""
        try:
            while await self._take_lease(stop):
                try:
                    await self._work(stop)
                finally:
                    self.board.drop(self.signer.address)
                    await self._drain_sends()
        finally:
            self.board.drop(self.signer.address)
            await self._drain_sends()
            epoch = await self.lease.hand_back()
            if epoch is not None:
                log.info("executor lease released", extra={"executor": self.signer.address, "epoch": epoch})

    async def _drain_sends(self) -> None:
        """Finish the sends under way (journaled bytes go out even as signing stops); a failure
        is logged: the next holder of the lane re-sends every live transaction."""
        try:
            await self.sent()
        except Exception as exc:
            log.warning("a send under way failed; the lane re-sends it", extra={"reason": type(exc).__name__})

    async def _take_lease(self, stop: asyncio.Event) -> bool:
        """Wait (retrying) until this process holds the lease; False when asked to stop."""
        await sleep_or_stop(stop, self.key_index * START_STAGGER_S)
        while not stop.is_set():
            held = self.board.held()
            if held:  # let processes started together take the other keys first
                await sleep_or_stop(stop, held * LEASE_SPREAD_S)
                if stop.is_set():
                    return False
            async with self.board.taking:  # an attempt of another key may still be under way
                if self.board.held() > held:
                    continue  # this process took another key meanwhile: spread again
                try:
                    if await self.lease.try_acquire():
                        self.board.hold(self.signer.address)
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
            except Incident:
                await sleep_or_stop(stop, IDLE_WAIT_S)  # the guard logged why
                continue
            except Exception as exc:
                self.metrics.rpc_errors.labels("broadcaster").inc()
                log.warning("executor lane not ready; retrying", extra={"reason": type(exc).__name__})
                await sleep_or_stop(stop, IDLE_WAIT_S)
        outage = OutageLog("broadcaster")
        while not stop.is_set():
            self._new_work.clear()
            try:
                if not await self.lease.alive():
                    raise LeaseLost(message="the executor lease's session is gone")
                signed = await self.step()
                outage.recovered()
                if signed:
                    continue
            except LeaseLost as exc:
                log.warning("executor lease lost; signing stopped", extra={"reason": exc.message})
                await self._drain_sends()  # what was journaled goes out before the key is let go
                await self.lease.release()
                return
            except Incident:
                pass  # logged once when it began, counted per step
            except Unavailable as exc:
                if isinstance(exc, ChainUnavailable):
                    self.metrics.rpc_errors.labels("broadcaster").inc()
                outage.failed(exc)
            except Exception:
                log.exception("broadcaster step failed")
            await _first(self._new_work, stop, IDLE_WAIT_S)


async def _first(a: asyncio.Event, b: asyncio.Event, timeout_s: float) -> None:
    """Wait until ``a`` or ``b`` is set, at most ``timeout_s``."""
    waits = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
