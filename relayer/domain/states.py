"""The relay job state machine: one enum and one table of allowed transitions. The store
mirrors it in SQL (``UPDATE ... WHERE state = ANY($n)``) so two workers cannot both move a job.

accepted -> simulated -> signed -> submitted -> mined -> confirmed -> indexed (settled)
transfer jobs: accepted -> simulated -> signed -> submitted -> mined -> confirmed (final: an
EIP-3009 transfer emits nothing to index; a transfer never moves confirmed -> indexed)
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
from typing import Final, Literal


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

JobKind = Literal["retire", "transfer"]
"""What a job's transaction does: ``retire`` (a gasless settlement call) or ``transfer`` (an
EIP-3009 ``transferWithAuthorization`` on the token)."""
JOB_KINDS: Final[tuple[JobKind, ...]] = ("retire", "transfer")
FINAL: Final[Mapping[str, JobState]] = MappingProxyType({"retire": S.INDEXED, "transfer": S.CONFIRMED})
"""The state in which a job of each kind has succeeded for good (short of a reorg)."""
# Once a transaction is signed the salt is spent for good (ARCHITECTURE: exactly-once rule).
UNSIGNED: Final = frozenset({S.ACCEPTED, S.SIMULATED, S.REJECTED})


def sources_of(target: JobState) -> tuple[JobState, ...]:
    """States from which ``target`` may be entered (for the SQL guard), sorted by name."""
    return tuple(sorted((s for s, nxt in TRANSITIONS.items() if target in nxt), key=str))


def terminal(kind: JobKind) -> frozenset[JobState]:
    """The states a job of ``kind`` ends in (short of a reorg): :data:`TERMINAL` plus its
    success state (:data:`FINAL`) and the failures (rejected, reverted)."""
    return TERMINAL | {FINAL[kind], S.REJECTED, S.REVERTED}


def open_states(kind: JobKind) -> tuple[JobState, ...]:
    """The states in which the relay still owes a job of ``kind`` work, in the machine's order:
    every state such a job can reach but its :func:`terminal` ones (a retirement: accepted to
    confirmed; a transfer: accepted to mined, since a confirmed transfer is final and never
    indexed). ``relayer status``, the ``relayer_relay_oldest_job_age_seconds`` gauges and the
    alerts on them count only these."""
    reached, todo = {S.ACCEPTED}, [S.ACCEPTED]
    while todo:  # bounded: each state is added once
        state = todo.pop()
        for target in TRANSITIONS[state]:
            if target not in reached and can_move(state, target, kind):
                reached.add(target)
                todo.append(target)
    done = terminal(kind)
    return tuple(s for s in JobState if s in reached and s not in done)


def can_move(current: JobState, target: JobState, kind: JobKind = "retire") -> bool:
    """Whether the table allows ``current -> target`` for a job of ``kind`` (a transfer is
    final at confirmed: it never moves confirmed -> indexed)."""
    if kind == "transfer" and (current, target) == (S.CONFIRMED, S.INDEXED):
        return False
    return target in TRANSITIONS[current]
