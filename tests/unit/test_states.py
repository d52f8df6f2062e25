"""The relay job state machine: one enum, one transition table (STYLE 7)."""

from __future__ import annotations

import itertools

import pytest

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
