"""The x402 payment state machine (table ``x402_payments``; design: docs/design/x402-v2.md
C4-C6): one enum and one table of allowed transitions, as :mod:`relayer.domain.states` is
for relay jobs. The store's one move (``UPDATE ... WHERE state = ANY($n)``) takes its sources
from a call that this table allows, so two requests or a request and the keeper cannot both
move a payment.

accepted -> accepted (its transfer job linked, or why the transfer did not happen kept)
accepted -> paid (the chain proves the token's Transfer to the treasury: never a used nonce)
accepted -> failed (the authorization was used otherwise or expired unused: nothing received)
paid/retiring -> retiring (the retirement job made or linked)
paid/retiring -> retired (the retirement is indexed)
paid/retiring -> refunding (the retirement can never execute; only a payment proven paid)
refunding -> refunding (the refund's transfer job linked) -> refunded (the chain proves it)
retired, refunded and failed are final.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from relayer.domain.errors import RelayerError


class PaymentState(StrEnum):
    ACCEPTED = "accepted"
    PAID = "paid"
    RETIRING = "retiring"
    RETIRED = "retired"
    REFUNDING = "refunding"
    REFUNDED = "refunded"
    FAILED = "failed"


P = PaymentState
PAYMENT_TRANSITIONS: Final[Mapping[PaymentState, frozenset[PaymentState]]] = MappingProxyType(
    {
        P.ACCEPTED: frozenset({P.ACCEPTED, P.PAID, P.FAILED}),
        P.PAID: frozenset({P.RETIRING, P.RETIRED, P.REFUNDING}),
        P.RETIRING: frozenset({P.RETIRING, P.RETIRED, P.REFUNDING}),
        P.REFUNDING: frozenset({P.REFUNDING, P.REFUNDED}),
        P.RETIRED: frozenset(),
        P.REFUNDED: frozenset(),
        P.FAILED: frozenset(),
    }
)

FINAL_PAYMENT_STATES: Final = frozenset(s for s, nxt in PAYMENT_TRANSITIONS.items() if not nxt)
"""retired, refunded, failed: nothing moves a payment out of these."""
OPEN_PAYMENT_STATES: Final = tuple(s for s in PaymentState if s not in FINAL_PAYMENT_STATES)
"""accepted, paid, retiring, refunding: the payment keeper still owes these work."""
PROVEN_PAID: Final = frozenset({P.PAID, P.RETIRING, P.RETIRED, P.REFUNDING, P.REFUNDED})
"""The states only a payment the chain proved paid reaches (``payment_tx`` and ``received``
set; migration 0025's check)."""


class PaymentMoveRefused(RelayerError):
    """A move the table does not allow was asked for (a defect in the caller, never input:
    ``internal_error``, not transient)."""


def payment_sources_of(target: PaymentState) -> tuple[PaymentState, ...]:
    """Every state from which ``target`` may be entered, in the machine's order."""
    return tuple(s for s in PaymentState if target in PAYMENT_TRANSITIONS[s])


def can_move_payment(current: PaymentState, target: PaymentState) -> bool:
    """Whether the table allows ``current -> target``."""
    return target in PAYMENT_TRANSITIONS[current]


def guard_payment_move(sources: Iterable[PaymentState], target: PaymentState) -> list[str]:
    """The SQL guard of a move from any of ``sources`` to ``target``: the sources' values.

    Raises:
        PaymentMoveRefused: a source the table does not allow into ``target``, or none.
    """
    given = [PaymentState(s) for s in sources]
    refused = [s.value for s in given if not can_move_payment(s, target)]
    if refused or not given:
        raise PaymentMoveRefused(
            message=f"payment move to {target.value} from {refused or 'no state'} is not allowed",
            transient=False,
        )
    return [s.value for s in given]
