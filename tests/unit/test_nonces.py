"""What took a nonce the chain passed, and when a job whose nonce was taken ends (the pure
decisions of relayer.workers.nonces)."""

from __future__ import annotations

from relayer.chain.types import Receipt
from relayer.store.executor_lane import NonceTx
from relayer.workers.nonces import ends, taken_by

A, B, C = b"\xaa" * 32, b"\xbb" * 32, b"\xcc" * 32


def _receipt(tx_hash: bytes, block: int) -> Receipt:
    return Receipt(tx_hash, block, b"\x01" * 32, 1, 21_000, 1, 0)


def test_a_nonce_with_one_of_ours_recorded_mined_needs_no_receipt() -> None:
    txs = [NonceTx(A, 1, "relay", None), NonceTx(B, 1, "relay", 7)]
    assert taken_by(txs, {}, 10) == "recorded"


def test_a_receipt_of_ours_at_or_below_the_depth_is_ours() -> None:
    txs = [NonceTx(A, 1, "relay", None), NonceTx(B, 1, "relay", None)]
    assert taken_by(txs, {A: _receipt(A, 10)}, 10) == "ours"  # an older replacement mined


def test_no_receipt_of_ours_is_a_foreign_use() -> None:
    txs = [NonceTx(A, 1, "relay", None), NonceTx(C, 1, "noop", None)]
    assert taken_by(txs, {}, 10) == "foreign"
    assert taken_by([NonceTx(C, None, "noop", None)], {}, 10) == "foreign"  # a hole's no-op


def test_a_receipt_above_the_depth_leaves_the_nonce_for_the_next_look() -> None:
    txs = [NonceTx(A, 1, "relay", None)]
    assert taken_by(txs, {A: _receipt(A, 11)}, 10) == "unsure"


def test_a_lost_job_is_signed_again_only_while_its_authorization_lives_beyond_the_margin() -> None:
    assert not ends(False, expires_at=1_000, now=900.0, margin_s=20)
    assert ends(False, expires_at=1_000, now=980.0, margin_s=20)
    assert ends(False, expires_at=1_000, now=1_100.0, margin_s=20)
    assert ends(True, expires_at=10_000, now=900.0, margin_s=20)  # a no-op was to stand in for it
