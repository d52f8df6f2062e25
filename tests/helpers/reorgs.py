"""What the reorg and confirmation-tag tests read: anvil's head and ``safe``/``finalized``
blocks, the block holding a transaction on the chain as it is now, the retirements indexed
from a transaction, and the follower's deep-reorg gauge."""

from __future__ import annotations

from typing import Literal

from tests.conftest import Daemon
from tests.private import Anvil

Tag = Literal["safe", "finalized"]
SLOTS = 32  # anvil's default --slots-in-an-epoch
LAG: dict[Tag, int] = {"safe": SLOTS, "finalized": 2 * SLOTS}
"""How many blocks anvil's tag block is below its latest: ``safe`` one epoch, ``finalized`` two."""


def head_block(anvil: Anvil) -> int:
    """The number of anvil's latest block."""
    return int(anvil.rpc("eth_blockNumber"), 16)


def tagged_block(anvil: Anvil, tag: Tag) -> int:
    """The number of anvil's ``tag`` block (``safe`` or ``finalized``)."""
    return int(anvil.rpc("eth_getBlockByNumber", tag, False)["number"], 16)


def on_chain(anvil: Anvil, tx_hash: str) -> int | None:
    """The block number holding ``tx_hash`` on the chain as it is now, if any."""
    receipt = anvil.rpc("eth_getTransactionReceipt", tx_hash)
    if receipt is None:
        return None
    block = anvil.rpc("eth_getBlockByNumber", receipt["blockNumber"], False)
    assert block["hash"] == receipt["blockHash"]
    return int(receipt["blockNumber"], 16)


async def retirements_of(d: Daemon, tx_hash: str) -> int:
    """How many rows of ``retirements`` the daemon indexed from the transaction ``tx_hash``."""
    count: int = await d.runtime.db.fetchval(
        "SELECT count(*) FROM retirements WHERE tx_hash = $1", bytes.fromhex(tx_hash[2:])
    )
    return count


def halted(d: Daemon) -> float:
    """The follower's ``relayer_deep_reorg`` gauge (1.0 while halted on a reorg deeper than
    its window, else 0.0)."""
    value: float = d.runtime.metrics.deep_reorg.labels(
        str(d.runtime.settings.chain_id), "follower"
    )._value.get()
    return value
