"""Where a claimed EIP-3009 transfer stands on the chain now (issue 35; the rule is
:mod:`relayer.domain.proof`): the one place that reads the proof of a payment. The
facilitator's settle answers, the resource's payments (``paid`` and ``failed``) and the
transfers of refunds are all judged here; nothing else (a used nonce, a job's state) stands in
for it. One judgement is one JSON-RPC batch at the latest head (:meth:`ChainReads.transfer_evidence`)
plus the confirmation policy's block (the depth, or the node's ``safe``/``finalized`` block)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from relayer.chain.reads import ChainReads
from relayer.domain.proof import Evidence, Standing, TransferClaim, TransferProof, standing
from relayer.domain.reorg import confirmed_through
from relayer.store.relay_jobs import Job

PROOF_LOOKBACK_BLOCKS: Final = 2_000
"""Blocks before the head at which a payment was taken that its proof read also searches: a
payer's own submission of the payload, or a front-runner's, may come a little before ours
(and a reorg may move a use a few blocks back). About 7 minutes of Base blocks."""

ConfirmedThrough = Callable[[int], Awaitable[int]]
"""The newest confirmed block number under a head (a block number; -1 when none is), as the
chain follower judges it: ``depth`` blocks under the head, or the node's ``safe``/
``finalized`` block (``relayer.workers.reorg.Confirmed.through``). Raises
``ChainUnavailable`` when the node fails."""


def blocks_deep(confirmations: int) -> ConfirmedThrough:
    """The :data:`ConfirmedThrough` of a bare depth: ``confirmations`` blocks under the head
    (:func:`confirmed_through`), with no read of the node."""

    async def through(head: int) -> int:
        return confirmed_through(head, confirmations)

    return through


def search_from(head: int) -> int:
    """The first block a payment taken at ``head`` has its proof searched from."""
    return max(0, head - PROOF_LOOKBACK_BLOCKS)


@dataclass(frozen=True, slots=True)
class Judged:
    """A claim judged: its :class:`Standing`, the proof when one was found (PAID, or PENDING
    above the confirmed block), and the evidence it was judged on."""

    standing: Standing
    proof: TransferProof | None
    evidence: Evidence


def transfer_claim(job: Job) -> TransferClaim:
    """What a ``transfer`` job claims: its authorization's value from the payer to its ``to``
    under its nonce (the job's summary, as :func:`relayer.service.relay._transfer_job` wrote it)."""
    s = job.summary
    return TransferClaim(
        job.input_token,
        job.payer,
        bytes.fromhex(str(s["nonce"])[2:]),
        str(s["to"]),
        job.auth_value,
        int(s["validBefore"]),
    )


def job_search_from(job: Job, head: int) -> int:
    """Where a ``transfer`` job's proof is searched from: the block it recorded when it was
    taken (``summary.fromBlock``); for a job taken before this was recorded, the lookback
    under its own block (or the head)."""
    recorded = job.summary.get("fromBlock")
    if recorded is not None:
        return int(recorded)
    return search_from(job.block_number or head)


class TransferProofs:
    """Judges claimed transfers against the chain (see the module).

    ``confirmed`` is the chain's confirmation policy (a :data:`ConfirmedThrough`); it may be
    replaced (tests bury a transaction deeper than the daemon's own depth)."""

    def __init__(self, reads: ChainReads, confirmed: ConfirmedThrough) -> None:
        self.reads = reads
        self.confirmed = confirmed

    async def judge(self, claim: TransferClaim, from_block: int | None) -> Judged:
        """Where ``claim`` stands at the latest head, its proof searched from ``from_block``
        (None: :func:`search_from` the head, for a payment that recorded none).

        Raises:
            ChainUnavailable: the node failed.
        """
        return await self._judge(claim, lambda head: search_from(head) if from_block is None else from_block)

    async def judge_job(self, job: Job) -> Judged:
        """:meth:`judge` of a ``transfer`` job's claim (:func:`transfer_claim`), searched from
        :func:`job_search_from`.

        Raises:
            ChainUnavailable: the node failed.
        """
        return await self._judge(transfer_claim(job), lambda head: job_search_from(job, head))

    async def _judge(self, claim: TransferClaim, from_block: Callable[[int], int]) -> Judged:
        head = await self.reads.latest_block()
        deep = await self.confirmed(head)
        evidence = await self.reads.transfer_evidence(claim, from_block(head), head, min(deep, head))
        return Judged(standing(evidence, claim), evidence.proof, evidence)
