"""The relay job state machine: one enum and one table of allowed transitions. The store
mirrors it in SQL (``UPDATE ... WHERE state = ANY($n)``) so two workers cannot both move a job.

accepted -> simulated -> signed -> submitted -> mined -> confirmed -> indexed (settled)
accepted/simulated -> rejected (nothing signed: the identical request may be retried)
submitted -> submitted (same-nonce fee bump); mined/confirmed/indexed/reverted -> submitted (a
reorg took the block away: wait again for a receipt)
signed/submitted/mined -> reverted (receipt status 0); signed -> mined when the receipt
is seen before the broadcast was recorded (a crash between send and commit)
signed/submitted -> dropped (a no-op took its nonce: its authorization expired before fees
came back under its allowance; or a transaction not in the journal took it and the
authorization expires before it could be signed again; nothing was spent, the salt stays spent)
signed/submitted -> signed (a transaction not in the journal took its nonce: signed again at a
new nonce, the same call, while its authorization lives; never back to an unsigned state)
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final


class JobState(StrEnum):
    ACCEPTED = "accepted"
    SIMULATED = "simulated"
    SIGNED = "signed"
    SUBMITTED = "submitted"
    MINED = "mined"
    CONFIRMED = "confirmed"
    INDEXED = "indexed"
    REJECTED = "rejected"
    REVERTED = "reverted"
    DROPPED = "dropped"


S = JobState
TRANSITIONS: Final[Mapping[JobState, frozenset[JobState]]] = MappingProxyType(
    {
        S.ACCEPTED: frozenset({S.SIMULATED, S.REJECTED}),
        S.SIMULATED: frozenset({S.SIGNED, S.REJECTED}),
        S.SIGNED: frozenset({S.SIGNED, S.SUBMITTED, S.MINED, S.REVERTED, S.DROPPED}),
        S.SUBMITTED: frozenset({S.SIGNED, S.SUBMITTED, S.MINED, S.REVERTED, S.DROPPED}),
        S.MINED: frozenset({S.CONFIRMED, S.SUBMITTED, S.REVERTED}),
        S.CONFIRMED: frozenset({S.INDEXED, S.SUBMITTED}),
        S.INDEXED: frozenset({S.SUBMITTED}),
        S.REJECTED: frozenset({S.ACCEPTED}),
        S.REVERTED: frozenset({S.SUBMITTED}),
        S.DROPPED: frozenset(),
    }
)

TERMINAL: Final = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)
# Once a transaction is signed the salt is spent for good (ARCHITECTURE: exactly-once rule).
UNSIGNED: Final = frozenset({S.ACCEPTED, S.SIMULATED, S.REJECTED})


def sources_of(target: JobState) -> tuple[JobState, ...]:
    """States from which ``target`` may be entered (for the SQL guard), sorted by name."""
    return tuple(sorted((s for s, nxt in TRANSITIONS.items() if target in nxt), key=str))


def can_move(current: JobState, target: JobState) -> bool:
    """Whether the table allows ``current -> target``."""
    return target in TRANSITIONS[current]
