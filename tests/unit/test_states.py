"""The relay job and x402 payment state machines: one enum and one transition table each
(STYLE 7), held by the same kinds of test."""

from __future__ import annotations

import itertools
import re
import uuid
from pathlib import Path

import pytest

from relayer.domain.payment_states import (
    FINAL_PAYMENT_STATES,
    OPEN_PAYMENT_STATES,
    PAYMENT_TRANSITIONS,
    PROVEN_PAID,
    PaymentMoveRefused,
    PaymentState,
    can_move_payment,
    guard_payment_move,
    payment_sources_of,
)
from relayer.domain.states import (
    FINAL,
    TERMINAL,
    TRANSITIONS,
    UNSIGNED,
    JobState,
    can_move,
    open_states,
    sources_of,
    terminal,
)
from relayer.store import x402_payments as payments_store
from relayer.store.status import FINAL_IN_OPEN, OPEN_STATES

S = JobState
SIGNED_OR_LATER = frozenset(JobState) - UNSIGNED

# The table, written out independently of relayer.domain.states (docstring of the module).
EXPECTED_EDGES = {
    (S.ACCEPTED, S.SIMULATED),
    (S.ACCEPTED, S.REJECTED),
    (S.SIMULATED, S.SIGNED),
    (S.SIMULATED, S.REJECTED),
    (S.SIGNED, S.SIGNED),
    (S.SIGNED, S.SUBMITTED),
    (S.SIGNED, S.MINED),
    (S.SIGNED, S.REVERTED),
    (S.SIGNED, S.DROPPED),
    (S.SUBMITTED, S.SIGNED),
    (S.SUBMITTED, S.SUBMITTED),
    (S.SUBMITTED, S.MINED),
    (S.SUBMITTED, S.REVERTED),
    (S.SUBMITTED, S.DROPPED),
    (S.MINED, S.CONFIRMED),
    (S.MINED, S.SUBMITTED),
    (S.MINED, S.REVERTED),
    (S.CONFIRMED, S.INDEXED),
    (S.CONFIRMED, S.SUBMITTED),
    (S.INDEXED, S.SUBMITTED),
    (S.REVERTED, S.SUBMITTED),
    (S.REJECTED, S.ACCEPTED),
}


def test_every_state_has_a_row() -> None:
    assert set(TRANSITIONS) == set(JobState)
    for targets in TRANSITIONS.values():
        assert targets <= set(JobState)


def test_state_values_are_the_sql_strings() -> None:
    assert [s.value for s in JobState] == [
        "accepted",
        "simulated",
        "signed",
        "submitted",
        "mined",
        "confirmed",
        "indexed",
        "rejected",
        "reverted",
        "dropped",
    ]
    assert JobState("mined") is S.MINED


def test_table_edges() -> None:
    edges = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert edges == EXPECTED_EDGES


def test_terminal_states() -> None:
    assert frozenset({S.DROPPED}) == TERMINAL  # indexed and reverted stand unless a reorg undoes them
    for state in TERMINAL:
        assert not any(can_move(state, target) for target in JobState)


def test_unsigned_states() -> None:
    assert frozenset({S.ACCEPTED, S.SIMULATED, S.REJECTED}) == UNSIGNED


@pytest.mark.parametrize(
    ("source", "target"),
    list(itertools.product(sorted(SIGNED_OR_LATER), sorted(UNSIGNED))),
)
def test_nothing_signed_goes_back_to_an_unsigned_state(source: JobState, target: JobState) -> None:
    # once signed, the salt is spent: a signed job must never be re-simulated or rejected
    assert not can_move(source, target)
    assert source not in sources_of(target)


def test_happy_path_and_reorg_path() -> None:
    path = [S.ACCEPTED, S.SIMULATED, S.SIGNED, S.SUBMITTED, S.MINED, S.CONFIRMED, S.INDEXED]
    assert all(can_move(a, b) for a, b in itertools.pairwise(path))
    assert can_move(S.SUBMITTED, S.SUBMITTED)  # same-nonce fee bump
    for mined in (S.MINED, S.CONFIRMED, S.INDEXED, S.REVERTED):
        assert can_move(mined, S.SUBMITTED)  # a reorg took the block away
    assert can_move(S.SIGNED, S.MINED)  # receipt seen before the broadcast was recorded
    for waiting in (S.SIGNED, S.SUBMITTED):
        assert can_move(waiting, S.SIGNED)  # a foreign transaction took its nonce: signed again


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (S.ACCEPTED, S.SIGNED),  # must simulate first
        (S.ACCEPTED, S.INDEXED),
        (S.SIMULATED, S.SUBMITTED),
        (S.SIGNED, S.CONFIRMED),
        (S.SUBMITTED, S.CONFIRMED),
        (S.SUBMITTED, S.INDEXED),
        (S.MINED, S.INDEXED),
        (S.CONFIRMED, S.REVERTED),
        (S.INDEXED, S.MINED),
        (S.DROPPED, S.SUBMITTED),
        (S.REJECTED, S.SIMULATED),
        (S.ACCEPTED, S.ACCEPTED),
    ],
)
def test_forbidden_moves(source: JobState, target: JobState) -> None:
    assert not can_move(source, target)


def test_every_state_reachable_from_accepted() -> None:
    seen = {S.ACCEPTED}
    frontier = [S.ACCEPTED]
    while frontier:
        for nxt in TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(JobState)


@pytest.mark.parametrize(
    ("target", "sources"),
    [
        (S.ACCEPTED, (S.REJECTED,)),
        (S.SIMULATED, (S.ACCEPTED,)),
        (S.SIGNED, (S.SIGNED, S.SIMULATED, S.SUBMITTED)),
        (S.SUBMITTED, (S.CONFIRMED, S.INDEXED, S.MINED, S.REVERTED, S.SIGNED, S.SUBMITTED)),
        (S.MINED, (S.SIGNED, S.SUBMITTED)),
        (S.CONFIRMED, (S.MINED,)),
        (S.INDEXED, (S.CONFIRMED,)),
        (S.REJECTED, (S.ACCEPTED, S.SIMULATED)),
        (S.REVERTED, (S.MINED, S.SIGNED, S.SUBMITTED)),
        (S.DROPPED, (S.SIGNED, S.SUBMITTED)),
    ],
)
def test_sources_of(target: JobState, sources: tuple[JobState, ...]) -> None:
    got = sources_of(target)
    assert got == sources
    assert list(got) == sorted(got, key=lambda s: s.value)  # stable order for the SQL guard


def test_sources_of_agrees_with_can_move() -> None:
    for source, target in itertools.product(JobState, JobState):
        assert (
            (source in sources_of(target)) == can_move(source, target) == ((source, target) in EXPECTED_EDGES)
        )


def test_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        TRANSITIONS[S.INDEXED] = frozenset({S.ACCEPTED})  # type: ignore[index]


def test_literal_sql_moves_in_the_store_are_allowed_by_the_table() -> None:
    import re
    from pathlib import Path

    from relayer.store import executor_lane, relay_jobs, reorg

    for source, target in relay_jobs.FIXED_TRANSITIONS:
        assert can_move(source, target), (source, target)
    # every literal "SET state = 'x' ... state = 'y'" in the store is one of the declared moves
    found = set()
    reserve = Path(relay_jobs.__file__ or "").parents[2] / "migrations" / "0020_reserve_in_one_statement.sql"
    for source_file in [*(Path(m.__file__ or "") for m in (relay_jobs, executor_lane, reorg)), reserve]:
        sql = source_file.read_text()
        for match in re.finditer(r"SET state = '(\w+)'[^\"]*?WHERE[^\n]*?state = '(\w+)'", sql):
            found.add((JobState(match.group(2)), JobState(match.group(1))))
        for match in re.finditer(r"SET state = '(\w+)'[^\"]*?WHERE[^\n]*?state IN \(([^)]*)\)", sql):
            for source in re.findall(r"'(\w+)'", match.group(2)):
                found.add((JobState(source), JobState(match.group(1))))
    assert found == set(relay_jobs.FIXED_TRANSITIONS), found ^ set(relay_jobs.FIXED_TRANSITIONS)


def test_a_transfer_is_final_at_confirmed() -> None:
    path = [S.ACCEPTED, S.SIMULATED, S.SIGNED, S.SUBMITTED, S.MINED, S.CONFIRMED]
    assert all(can_move(a, b, "transfer") for a, b in itertools.pairwise(path))
    assert not can_move(S.CONFIRMED, S.INDEXED, "transfer")
    assert can_move(S.CONFIRMED, S.INDEXED, "retire")
    assert can_move(S.CONFIRMED, S.SUBMITTED, "transfer")  # a reorg still takes it back
    assert FINAL == {"retire": S.INDEXED, "transfer": S.CONFIRMED}
    assert S.CONFIRMED in terminal("transfer") and S.CONFIRMED not in terminal("retire")
    assert S.INDEXED in terminal("retire") and S.INDEXED not in terminal("transfer")


def test_a_job_is_open_until_its_own_kinds_final_state() -> None:
    """Issue 37: a confirmed transfer counted as open paged RelayJobsStuck on every
    deployment that settles facilitator payments."""
    assert open_states("retire") == (S.ACCEPTED, S.SIMULATED, S.SIGNED, S.SUBMITTED, S.MINED, S.CONFIRMED)
    assert open_states("transfer") == (S.ACCEPTED, S.SIMULATED, S.SIGNED, S.SUBMITTED, S.MINED)


def test_the_status_queries_count_open_states_of_any_kind_less_each_kinds_final() -> None:
    assert OPEN_STATES == ("accepted", "simulated", "signed", "submitted", "mined", "confirmed")
    assert FINAL_IN_OPEN == ("transfer:confirmed",)


@pytest.mark.parametrize(("source", "target"), sorted(EXPECTED_EDGES - {(S.CONFIRMED, S.INDEXED)}))
def test_a_transfer_takes_every_other_edge_of_the_one_table(source: JobState, target: JobState) -> None:
    assert can_move(source, target, "transfer")


# --- the x402 payment table (relayer/domain/payment_states.py), held as the job table is -------

P = PaymentState
# Written out independently of relayer.domain.payment_states (its module docstring).
EXPECTED_PAYMENT_EDGES = {
    (P.ACCEPTED, P.ACCEPTED),
    (P.ACCEPTED, P.PAID),
    (P.ACCEPTED, P.FAILED),
    (P.PAID, P.RETIRING),
    (P.PAID, P.RETIRED),
    (P.PAID, P.REFUNDING),
    (P.RETIRING, P.RETIRING),
    (P.RETIRING, P.RETIRED),
    (P.RETIRING, P.REFUNDING),
    (P.REFUNDING, P.REFUNDING),
    (P.REFUNDING, P.REFUNDED),
}
MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def _sql_list(text: str) -> list[str]:
    return re.findall(r"'([a-z]+)'", text)


def test_every_payment_state_has_a_row_and_the_table_its_edges() -> None:
    assert set(PAYMENT_TRANSITIONS) == set(PaymentState)
    edges = {(a, b) for a, targets in PAYMENT_TRANSITIONS.items() for b in targets}
    assert edges == EXPECTED_PAYMENT_EDGES


def test_payment_states_are_the_tables_check_and_the_open_ones_its_index() -> None:
    """The enum's values are the SQL CHECK of ``x402_payments.state`` (migration 0017); the
    open states are the keeper index's predicate (0025), and DUE and DEFER say it the same
    way (so the planner uses the partial index)."""
    created = (MIGRATIONS / "0017_x402_payments.sql").read_text()
    check = re.search(r"CHECK \(state IN \(([^)]*)\)\)", created)
    assert check is not None and _sql_list(check.group(1)) == [s.value for s in PaymentState]
    proven = (MIGRATIONS / "0025_payments_proven.sql").read_text()
    index = re.search(r"x402_payments_due ON x402_payments \(due_at\)\s+WHERE state IN \(([^)]*)\)", proven)
    assert index is not None and _sql_list(index.group(1)) == [s.value for s in OPEN_PAYMENT_STATES]
    predicate = f"state IN ({index.group(1)})"
    assert predicate in payments_store.DUE and predicate in payments_store.DEFER
    paid_check = re.search(r"paid_is_proven CHECK \(\s*state IN \(([^)]*)\)", proven)
    assert paid_check is not None
    assert set(_sql_list(paid_check.group(1))) == set(PaymentState) - PROVEN_PAID


def test_final_payment_states_move_nowhere() -> None:
    assert frozenset({P.RETIRED, P.REFUNDED, P.FAILED}) == FINAL_PAYMENT_STATES
    assert OPEN_PAYMENT_STATES == (P.ACCEPTED, P.PAID, P.RETIRING, P.REFUNDING)
    for state in FINAL_PAYMENT_STATES:
        assert not any(can_move_payment(state, target) for target in PaymentState)


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (P.ACCEPTED, P.RETIRING),  # nothing retires before the chain proves the payment
        (P.ACCEPTED, P.RETIRED),
        (P.ACCEPTED, P.REFUNDING),  # nothing is refunded that was not received
        (P.ACCEPTED, P.REFUNDED),
        (P.PAID, P.ACCEPTED),
        (P.PAID, P.FAILED),  # a proven payment ends retired or refunded, never failed
        (P.RETIRING, P.FAILED),
        (P.REFUNDING, P.RETIRING),
        (P.REFUNDED, P.REFUNDING),
        (P.FAILED, P.ACCEPTED),
    ],
)
def test_forbidden_payment_moves(source: PaymentState, target: PaymentState) -> None:
    assert not can_move_payment(source, target)
    assert source not in payment_sources_of(target)
    with pytest.raises(PaymentMoveRefused):
        guard_payment_move([source], target)


def test_only_a_proven_payment_reaches_a_paid_state() -> None:
    reached, todo = {P.ACCEPTED}, [P.ACCEPTED]
    while todo:
        for target in PAYMENT_TRANSITIONS[todo.pop()]:
            if target not in reached:
                reached.add(target)
                todo.append(target)
    assert reached == set(PaymentState)
    assert payment_sources_of(P.PAID) == (P.ACCEPTED,)  # the one way in: the chain's proof
    assert all(
        payment_sources_of(s) and set(payment_sources_of(s)) <= PROVEN_PAID for s in PROVEN_PAID - {P.PAID}
    )


async def test_the_store_refuses_a_move_the_table_does_not_allow_before_any_sql() -> None:
    store = payments_store.X402Payments(db=None)  # type: ignore[arg-type]  # never reached
    with pytest.raises(PaymentMoveRefused):
        await store.move(uuid.uuid4(), (P.ACCEPTED,), P.RETIRED, 0)
    with pytest.raises(PaymentMoveRefused):
        await store.move(uuid.uuid4(), (), P.PAID, 0)
    assert guard_payment_move((P.PAID, P.RETIRING), P.REFUNDING) == ["paid", "retiring"]
