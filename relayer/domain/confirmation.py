"""Confirmation and reorg policy in time, not in block counts (issue 20, item 2).

A chain's policy says when a block counts as confirmed (a receipt settled, an event indexed):
either ``seconds`` of blocks under it at the chain's block time (the depth in blocks is derived:
``ceil(seconds / block time)``), or at the node's ``safe`` or ``finalized`` head. From it follow
the reorg window (how deep a reorg is still followed: deeper is an incident) and the bounded
reorg memory (block hashes a worker keeps: the window at the chain's real block rate, with
margin, never more than :data:`MAX_MEMORY_BLOCKS`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

Tag = Literal["safe", "finalized"]

TAG_HORIZON_S: Final[dict[str, float]] = {"safe": 900.0, "finalized": 1_800.0}
"""How far (seconds) the node's ``safe`` / ``finalized`` head may trail the latest block and a
followed reorg reach when settling at that head: on Base the safe head trails by the batcher's
posting interval (minutes), the finalized head by that plus L1 finality (about 13 min)."""
MIN_MEMORY_BLOCKS: Final = 64
MAX_MEMORY_BLOCKS: Final = 20_000
"""The reorg memory's bounds (block hashes; about 100 bytes each: at most about 2 MB)."""


@dataclass(frozen=True, slots=True)
class ConfirmationPolicy:
    """When a block counts as confirmed on one chain.

    Attributes:
        block_time_ms: the chain's block interval, milliseconds (at least 1).
        depth: blocks under the latest head (the block itself counting as the first) when
            ``tag`` is None; with a tag, the blocks ``TAG_HORIZON_S`` spans (the window).
        tag: None (count ``depth`` blocks), or settle at the node's ``safe`` / ``finalized`` head.
    """

    block_time_ms: int
    depth: int
    tag: Tag | None = None

    def __post_init__(self) -> None:
        if self.block_time_ms < 1 or self.depth < 1:
            raise ValueError("a block time and a confirmation depth are positive")

    @classmethod
    def in_seconds(cls, seconds: float, block_time_ms: int) -> ConfirmationPolicy:
        """``seconds`` of blocks at ``block_time_ms``: depth ``ceil(seconds / block time)``, at
        least 1. Raises ``ValueError`` on a negative time or a block time under 1 ms."""
        if seconds < 0 or block_time_ms < 1:
            raise ValueError("a confirmation time is not negative and a block time is positive")
        return cls(block_time_ms, max(1, math.ceil(seconds * 1000 / block_time_ms - 1e-9)))

    @classmethod
    def at_tag(cls, tag: Tag, block_time_ms: int) -> ConfirmationPolicy:
        """Settle at the node's ``tag`` head; the window spans :data:`TAG_HORIZON_S` of blocks."""
        return cls(block_time_ms, max(1, math.ceil(TAG_HORIZON_S[tag] * 1000 / block_time_ms)), tag)

    @property
    def seconds(self) -> float:
        """The confirmation time (depth times the block time); with a tag, the horizon it may take."""
        return self.depth * self.block_time_ms / 1000

    @property
    def window(self) -> int:
        """Blocks a followed reorg may take (deeper: an incident): the depth, or with a tag the
        blocks of its horizon (a reorg below the tag's block is an incident in any case)."""
        return self.depth

    @property
    def memory_blocks(self) -> int:
        """Block hashes a worker keeps to walk back a reorg: twice the window (a reorg as deep
        as the window, found late), within [:data:`MIN_MEMORY_BLOCKS`, :data:`MAX_MEMORY_BLOCKS`]."""
        return min(MAX_MEMORY_BLOCKS, max(MIN_MEMORY_BLOCKS, 2 * self.window))

    def poll_interval_s(self, ceiling_s: float = 1.0, floor_s: float = 0.05) -> float:
        """How often a worker looks for a new head: half a block (a new block is seen within
        half a block of its arrival), within [``floor_s``, ``ceiling_s``]."""
        return min(ceiling_s, max(floor_s, self.block_time_ms / 2000))

    def describe(self) -> str:
        """One line for the operator ("10 s = 50 blocks of 200 ms", "at the node's safe head")."""
        if self.tag is not None:
            return f"at the node's {self.tag} head (blocks of {self.block_time_ms} ms)"
        return f"{self.seconds:g} s = {self.depth} blocks of {self.block_time_ms} ms"


MIN_MEASURED_SPAN_S: Final = 10
"""The shortest span of header timestamps a block time is measured over (seconds)."""


def measured_block_time_ms(stamps: Sequence[tuple[int, int]]) -> int | None:
    """The chain's block interval measured from headers ``(block number, timestamp in s)``:
    the timestamp span over the block span of the oldest and newest, milliseconds (rounded).
    Timestamps are whole seconds (anvil's, and many nodes'), so a short interval is only
    measured well over many blocks: at 200 ms blocks, 64 blocks span 12.8 s, read as 12 or
    13 s (188 or 203 ms). None when fewer than two blocks, or when they span less than
    ``MIN_MEASURED_SPAN_S`` (10 s): whole-second stamps over a shorter span are off by more
    than 10 %, and a devnet that mines a block per transaction makes bursts of blocks within
    a second or two that no steady interval underlies.
    """
    if len(stamps) < 2:
        return None
    (first_n, first_t), (last_n, last_t) = min(stamps), max(stamps)
    if last_n <= first_n or last_t - first_t < MIN_MEASURED_SPAN_S:
        return None
    return max(1, round((last_t - first_t) * 1000 / (last_n - first_n)))


def differs_much(measured_ms: int, expected_ms: int, factor: float = 1.5) -> bool:
    """Whether a measured block time is more than ``factor`` times off the expected one, either
    way (worth a warning: the confirmation depth and the poll cadence follow the block time)."""
    return measured_ms > expected_ms * factor or measured_ms * factor < expected_ms


def parse_confirmation(value: str) -> float | Tag:
    """``RELAYER_CONFIRMATION``: seconds ("12", "12s", "0.6s") or ``safe`` / ``finalized``.

    Raises:
        ValueError: anything else, or a negative or non-finite time.
    """
    text = value.strip().lower()
    if text in ("safe", "finalized"):
        return "safe" if text == "safe" else "finalized"
    seconds = float(text.removesuffix("s"))
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError("a confirmation time is a finite number of seconds, not negative")
    return seconds
