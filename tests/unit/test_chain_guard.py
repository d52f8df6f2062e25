"""The chain guard (relayer/workers/chain_guard.py) against a fake node and identity: a node
answering another genesis or chain id halts every step with one log line and the gauge; the
right chain back resumes; the node is asked at most every ``recheck_s`` unless told now."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from relayer.domain.incidents import Incident
from relayer.metrics import Metrics
from relayer.workers.chain_guard import ChainGuard

RECORDED = b"\x01" * 32
OTHER = b"\x02" * 32


class FakeNode:
    def __init__(self) -> None:
        self.chain_id = 8453
        self.answers = (8453, RECORDED)
        self.asked = 0

    async def batch(self, calls: list[tuple[str, list[Any]]]) -> list[dict[str, Any]]:
        self.asked += 1
        chain_id, genesis = self.answers
        return [{"result": hex(chain_id)}, {"result": {"hash": "0x" + genesis.hex()}}]


class FakeIdentity:
    async def record(self, chain_id: int, genesis_hash: bytes) -> bytes:
        return RECORDED


def _guard(recheck_s: float = 60.0) -> tuple[ChainGuard, FakeNode, Metrics]:
    node, metrics = FakeNode(), Metrics()
    return ChainGuard(node, FakeIdentity(), metrics, recheck_s), node, metrics  # type: ignore[arg-type]


def _mismatch(metrics: Metrics) -> float:
    return float(metrics.chain_identity_mismatch.labels("8453")._value.get())


async def test_the_recorded_chain_passes_and_is_read_at_most_every_recheck() -> None:
    guard, node, metrics = _guard()
    for _ in range(5):
        await guard.check("follower")
    assert node.asked == 1 and _mismatch(metrics) == 0
    await guard.check("follower", now=True)
    assert node.asked == 2


async def test_another_genesis_halts_every_step_with_one_log_line_until_it_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard, node, metrics = _guard()
    await guard.check("follower")
    node.answers = (8453, OTHER)
    with caplog.at_level(logging.INFO, logger="relayer.workers.chain_guard"):
        for worker in ("follower", "broadcaster", "catalogue"):
            with pytest.raises(Incident) as halted:
                await guard.check(worker, now=True)
            assert halted.value.kind == "chain_identity"
        assert _mismatch(metrics) == 1
        assert metrics.halted_steps.labels("broadcaster", "chain_identity")._value.get() == 1
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and OTHER.hex() in errors[0].reason  # type: ignore[attr-defined]
        node.answers = (8453, RECORDED)
        await guard.check("follower", now=True)
    assert _mismatch(metrics) == 0
    assert any("again" in r.getMessage() for r in caplog.records)


async def test_another_chain_id_halts() -> None:
    guard, node, _ = _guard()
    node.answers = (1, RECORDED)
    with pytest.raises(Incident) as halted:
        await guard.check("follower")
    assert "chain id 1" in halted.value.message


async def test_a_deep_reorg_opened_by_the_follower_halts_the_lanes_only() -> None:
    guard, _, metrics = _guard()
    guard.open("follower", "a reorg of 9 blocks")
    await guard.check("catalogue")  # not a lane
    with pytest.raises(Incident) as halted:
        await guard.check("broadcaster", lanes=True)
    assert halted.value.kind == "deep_reorg"
    assert metrics.halted_steps.labels("broadcaster", "deep_reorg")._value.get() == 1
    guard.close("follower")
    await guard.check("broadcaster", lanes=True)
