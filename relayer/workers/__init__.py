"""Long-running workers: broadcaster and chain follower, and what they share: a stoppable
sleep and the log of an upstream outage."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from relayer.chain.types import CreditInfo, SettledLog
from relayer.domain.errors import Unavailable
from relayer.store.retirements import IndexedRetirement

log = logging.getLogger(__name__)


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class OutageLog:
    """Logs an upstream outage once when it starts (with what failed) and once when it ends,
    not on every retry of a worker's loop."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.down: str | None = None

    def failed(self, error: Unavailable) -> None:
        if self.down is None:
            self.down = str(error.context.get("upstream", "upstream"))
            log.warning(
                "upstream unavailable; retrying",
                extra={"worker": self.worker, "upstream": self.down, "reason": error.detail},
            )

    def recovered(self) -> None:
        if self.down is not None:
            log.info("upstream available again", extra={"worker": self.worker, "upstream": self.down})
            self.down = None


def retirement_row(chain_id: int, entry: SettledLog, timestamp: int, credit: CreditInfo) -> IndexedRetirement:
    """The index row of one ``RetirementSettled`` event (block time ``timestamp``, unix s) of a
    credit, as the chain follower and the catalogue indexer store it."""
    r = entry.retirement
    return IndexedRetirement(
        chain_id=chain_id,
        tx_hash=entry.tx_hash,
        retirement_index=entry.retirement_index,
        block_number=entry.block_number,
        block_hash=entry.block_hash,
        log_index=entry.log_index,
        block_timestamp=timestamp,
        payer=entry.payer,
        beneficiary=entry.beneficiary,
        input_token=r.input_token,
        value=entry.value,
        fee=entry.fee,
        retirement_cost=entry.retirement_cost,
        refunded=entry.refunded,
        gas_allowance=r.gas_allowance,
        source=r.source,
        source_id=r.source_id,
        credit_token=r.credit_token,
        token_id=r.token_id,
        amount_units=r.amount,
        project_id=credit.project_id,
        vintage=credit.vintage,
        registry=credit.registry,
        bound_nonce=entry.bound_nonce,
        details=r.details.as_record(),
    )
