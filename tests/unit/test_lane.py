"""The lane's upkeep as pure decisions: re-send, replace within the allowance, fill a nonce."""

from __future__ import annotations

from dataclasses import replace

from relayer.domain.fees import GasPrice, bumped, replacement_fees
from relayer.domain.lane import (
    IN_FLIGHT_WINDOW,
    FillNonce,
    Halt,
    LanePolicy,
    LaneTx,
    Replace,
    Resend,
    nonce_gap,
    plan,
)

NOW = 1_800_000_000.0
POLICY = LanePolicy(resend_after_s=10, replace_after_s=30, hole_after_s=10, noop_before_expiry_s=30)
MARKET = GasPrice(max_fee_per_gas=1_000, max_priority_fee_per_gas=100)
TX = LaneTx(
    tx_hash=b"\x01" * 32,
    nonce=5,
    kind="relay",
    job_id=1,
    max_fee_per_gas=1_000,
    max_priority_fee_per_gas=100,
    signed_at=NOW - 60,
    broadcast_at=NOW - 1,
    expires_at=int(NOW) + 3600,
    ceiling=5_000,
)


def _plan(
    *txs: LaneTx, mined: int = 5, market: GasPrice = MARKET, stalled: float = 0.0, **kw: object
) -> list[object]:
    return list(plan(list(txs), mined, market, NOW, stalled, POLICY, **kw))  # type: ignore[arg-type]


def test_a_fresh_transaction_is_left_alone() -> None:
    assert _plan() == [] and _plan(TX) == []


def test_an_unsent_transaction_is_sent_again_soon() -> None:
    unsent = replace(TX, broadcast_at=None, signed_at=NOW - 1)
    assert _plan(unsent) == []
    unsent = replace(unsent, signed_at=NOW - POLICY.unsent_after_s)
    assert _plan(unsent) == [Resend(unsent)]


def test_an_unmined_transaction_is_sent_again_with_the_same_bytes() -> None:
    old = replace(TX, broadcast_at=NOW - POLICY.resend_after_s)
    assert _plan(old) == [Resend(old)]


def test_a_stuck_transaction_priced_out_is_replaced_with_a_bump_within_its_allowance() -> None:
    stuck = replace(TX, broadcast_at=NOW - POLICY.replace_after_s)
    market = GasPrice(3_000, 300)
    [action] = _plan(stuck, market=market)
    assert action == Replace(stuck, 3_000, 300)
    [action] = _plan(stuck, market=GasPrice(1_050, 100))  # below the bump: the bump it is
    assert action == Replace(stuck, bumped(1_000), bumped(100))
    [action] = _plan(stuck, market=GasPrice(9_000, 900))  # above the ceiling: the ceiling
    assert isinstance(action, Replace) and action.max_fee_per_gas == TX.ceiling
    assert action.max_priority_fee_per_gas == 900


def test_a_stuck_transaction_not_priced_out_is_sent_again_not_replaced() -> None:
    stuck = replace(TX, broadcast_at=NOW - POLICY.replace_after_s)
    assert _plan(stuck, market=GasPrice(900, 100)) == [Resend(stuck)]


def test_no_replacement_when_the_allowance_leaves_no_room_for_the_bump() -> None:
    stuck = replace(TX, broadcast_at=NOW - POLICY.replace_after_s, ceiling=1_050)
    assert _plan(stuck, market=GasPrice(3_000, 300)) == []
    assert replacement_fees(1_000, 100, 3_000, 300, 1_050) is None


def test_a_transaction_the_node_refused_for_its_fee_is_replaced_at_once() -> None:
    [action] = _plan(TX, market=GasPrice(2_000, 100), refused=frozenset({TX.tx_hash}))
    assert action == Replace(TX, 2_000, bumped(100))


def test_a_job_about_to_expire_unmined_gets_its_nonce_filled_by_a_no_op() -> None:
    expiring = replace(TX, expires_at=int(NOW) + 30, ceiling=1_000)
    [action] = _plan(expiring, market=GasPrice(50_000, 5_000))
    assert action == FillNonce(5, 50_000, 5_000, "expired", replaces=expiring)
    [action] = _plan(expiring, market=GasPrice(10, 1))  # at least the bump over what it replaces
    assert isinstance(action, FillNonce) and action.max_fee_per_gas == bumped(1_000)


def test_holes_are_filled_once_the_lane_has_stalled() -> None:
    a, b = replace(TX, nonce=5), replace(TX, nonce=7, tx_hash=b"\x02" * 32)
    assert _plan(a, b, mined=3, stalled=POLICY.hole_after_s - 1) == []
    actions = _plan(a, b, mined=3, stalled=POLICY.hole_after_s)
    assert [(x.nonce, x.reason) for x in actions if isinstance(x, FillNonce)] == [
        (3, "hole"),
        (4, "hole"),
        (6, "hole"),
    ]
    assert all(x.max_fee_per_gas == MARKET.max_fee_per_gas for x in actions if isinstance(x, FillNonce))


def test_transactions_below_the_mined_nonce_are_done() -> None:
    old = replace(TX, nonce=2, broadcast_at=NOW - 999)
    assert _plan(old, mined=5, stalled=999) == []


def test_a_stuck_no_op_is_replaced_without_a_ceiling() -> None:
    noop = replace(TX, kind="noop", job_id=None, expires_at=None, ceiling=None, broadcast_at=NOW - 30)
    [action] = _plan(noop, market=GasPrice(90_000, 9_000))
    assert action == Replace(noop, 90_000, 9_000)


def test_actions_come_in_nonce_order() -> None:
    late = replace(TX, nonce=9, broadcast_at=NOW - 10, tx_hash=b"\x09" * 32)
    early = replace(TX, nonce=6, broadcast_at=NOW - 10, tx_hash=b"\x06" * 32)
    actions = _plan(late, early, mined=5, stalled=10)
    assert [getattr(x, "nonce", None) or x.tx.nonce for x in actions] == [5, 6, 7, 8, 9]  # type: ignore[attr-defined]


def test_the_nonce_gap_counts_the_unheld_nonces_up_to_the_newest_live_one() -> None:
    a, b = replace(TX, nonce=5), replace(TX, nonce=7, tx_hash=b"\x02" * 32)
    assert nonce_gap([], 3) == 0
    assert nonce_gap([a, b], 3) == 3  # 3, 4 and 6
    assert nonce_gap([a, b], 5) == 1
    assert nonce_gap([a, b], 8) == 0  # both mined


def test_a_gap_up_to_the_in_flight_window_is_filled_with_no_ops() -> None:
    top = replace(TX, nonce=100 + IN_FLIGHT_WINDOW)
    actions = _plan(top, mined=100, stalled=POLICY.hole_after_s)
    assert len([x for x in actions if isinstance(x, FillNonce)]) == IN_FLIGHT_WINDOW


def test_a_gap_beyond_the_in_flight_window_halts_the_lane_and_signs_nothing() -> None:
    # The lane signed up to nonce 2000 on a chain whose executor has mined nothing (a chain
    # swapped, or one that lost its history): 1700 no-ops would be the old repair.
    live = [
        replace(TX, nonce=n, tx_hash=n.to_bytes(32, "big"), broadcast_at=NOW - 999) for n in range(1700, 2001)
    ]
    assert _plan(*live, mined=0, stalled=POLICY.hole_after_s) == [Halt(0, 2000, 1700)]
    # Not before the lane has stalled for the hole's patience (the mined nonce may lag).
    assert not any(isinstance(x, (Halt, FillNonce)) for x in _plan(*live, mined=0, stalled=1))
    one_over = replace(TX, nonce=IN_FLIGHT_WINDOW + 1)
    assert _plan(one_over, mined=0, stalled=POLICY.hole_after_s) == [
        Halt(0, IN_FLIGHT_WINDOW + 1, IN_FLIGHT_WINDOW + 1)
    ]
