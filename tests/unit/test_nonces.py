"""What took a nonce the chain passed, and when a job whose nonce was taken ends (the pure
decisions of relayer.workers.nonces)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from relayer.chain.types import Receipt
from relayer.metrics import Metrics
from relayer.store.executor_lane import NonceTx
from relayer.workers import nonces
from relayer.workers.nonces import NonceAudit, ends, foreign_confirmed, taken_by

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


class _Chain:
    """The two reads the audit makes of the chain: the count through a block, and receipts;
    ``receipts_by_look`` gives, look after look, which receipts the node serves."""

    def __init__(self, count: int, receipts_by_look: list[dict[bytes, Receipt]]) -> None:
        self.count = count
        self.looks = receipts_by_look

    async def transaction_count(self, account: str, number: int) -> int:
        return self.count

    async def receipts(self, tx_hashes: Sequence[bytes]) -> dict[bytes, Receipt]:
        served = self.looks.pop(0) if len(self.looks) > 1 else self.looks[0]
        return {h: r for h, r in served.items() if h in tx_hashes}


class _Lane:
    """The journal at one nonce (7) of one executor, one transaction of ours (A, job 1)."""

    def __init__(self) -> None:
        self.passed: list[int] = []

    async def lowest_open(self) -> dict[str, int]:
        return {} if self.passed else {"0xE": 7}

    async def open_below(self, executor: str, below: int, limit: int) -> list[int]:
        return [7] if below > 7 and not self.passed else []

    async def at_nonce(self, executor: str, nonce: int) -> list[NonceTx]:
        return [NonceTx(A, 1, "relay", None)]

    async def mark_passed(self, executor: str, nonce: int) -> int:
        self.passed.append(nonce)
        return 1


async def _audit(chain: _Chain, looks: int) -> tuple[_Lane, list[Any], float]:
    lane, recorded, metrics = _Lane(), [], Metrics()

    async def record(ours: list[Any]) -> None:
        recorded.extend(ours)

    audit = NonceAudit(chain, lane, metrics, record)  # type: ignore[arg-type]
    for _ in range(looks):
        await audit.step(10)
    foreign: float = metrics.foreign_nonces._value.get()
    return lane, recorded, foreign


async def test_a_nonce_counted_before_its_receipt_is_served_is_ours_at_the_next_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The soak's failure: the node counted nonce 7 taken (by the block it was still mining)
    # before it served that block's receipt of our transaction; the job was dropped as if a
    # foreign transaction had taken its nonce, though its own transaction settled.
    monkeypatch.setattr(nonces, "FOREIGN_AFTER_S", 0.0)
    lane, recorded, foreign = await _audit(_Chain(8, [{}, {A: _receipt(A, 10)}]), looks=2)
    assert foreign == 0
    assert [pending.job_id for _receipt_, pending in recorded] == [1]
    assert lane.passed == [7]


async def test_a_nonce_no_look_finds_ours_at_is_foreign_only_at_the_second_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(nonces, "FOREIGN_AFTER_S", 0.0)
    lane, recorded, foreign = await _audit(_Chain(8, [{}]), looks=1)
    assert (foreign, lane.passed, recorded) == (0, [], [])
    lane, recorded, foreign = await _audit(_Chain(8, [{}]), looks=2)
    assert (foreign, lane.passed, recorded) == (1, [7], [])


def test_a_second_look_judges_foreign_only_after_the_wait() -> None:
    assert not foreign_confirmed(None, 100.0)
    assert not foreign_confirmed(99.5, 100.0)
    assert foreign_confirmed(99.0, 100.0)
