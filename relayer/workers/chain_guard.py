"""The chain guard: the chain identity (chain id and genesis block hash, recorded in the
database, :class:`~relayer.store.identity.ChainIdentity`) as a running check shared by every
worker of one chain. Each worker step asks :meth:`ChainGuard.check` before it acts; the node
is asked again (one JSON-RPC batch: ``eth_chainId`` and block 0) at most every
:data:`RECHECK_S`, or at once on a sign that the chain changed under the worker (a head below
one seen, a reorg, a mined nonce that went back). While the node answers another chain,
every step raises :class:`~relayer.domain.incidents.Incident`: nothing is rewound, signed or
sent; one log line and ``relayer_chain_identity_mismatch`` say why, and work resumes on its
own once the recorded chain answers again.

The guard also carries the incidents a worker of the chain opens for the lanes (a deep reorg
the follower halted on): while one is open, the lanes' steps halt too."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from relayer.chain.errors import ChainUnavailable
from relayer.chain.node import ChainNode
from relayer.domain.incidents import Incident
from relayer.metrics import Metrics
from relayer.store.identity import ChainIdentity

log = logging.getLogger(__name__)

RECHECK_S: Final = 2.0
"""Longest a chain identity read is trusted, seconds."""


class ChainGuard:
    """The identity check of one chain node (``node.chain_id``) against ``identity``.

    Raises (from :meth:`check`): ``Incident`` as described there; ``ChainUnavailable`` when
    the node fails; ``StoreUnavailable`` when the database fails (first check only).
    """

    def __init__(
        self, node: ChainNode, identity: ChainIdentity, metrics: Metrics, recheck_s: float = RECHECK_S
    ) -> None:
        self.node = node
        self.chain_id = node.chain_id
        self.identity = identity
        self.metrics = metrics
        self.recheck_s = recheck_s
        self._genesis: bytes | None = None  # the recorded genesis, read once
        self._checked_at = float("-inf")
        self._mismatch: str | None = None
        self._lock = asyncio.Lock()
        self._incidents: dict[str, str] = {}  # opened by worker -> why
        self.metrics.chain_identity_mismatch.labels(str(self.chain_id)).set(0)

    @property
    def mismatch(self) -> str | None:
        """Why the node's chain is not the recorded one (as last read), None while it is."""
        return self._mismatch

    async def check(self, worker: str, *, now: bool = False, lanes: bool = False) -> None:
        """Halt ``worker``'s step unless the node answers the recorded chain: read the node's
        chain id and genesis when the last read is older than ``recheck_s`` (or ``now``). With
        ``lanes``, an incident another worker opened for the lanes halts the step too.

        Raises:
            Incident: ``chain_identity`` (the node answers another chain) or, with
                ``lanes``, the open incident's kind; the halted step is counted.
            ChainUnavailable: the node failed.
            StoreUnavailable: the database failed.
        """
        if now or time.monotonic() - self._checked_at >= self.recheck_s:
            async with self._lock:  # one read for the workers asking together
                if now or time.monotonic() - self._checked_at >= self.recheck_s:
                    self._judge(await self._read())
        if self._mismatch is not None:
            self.metrics.halted_steps.labels(worker, "chain_identity").inc()
            raise Incident("chain_identity", self._mismatch, chain_id=self.chain_id)
        if lanes and self._incidents:
            opener, why = next(iter(sorted(self._incidents.items())))
            self.metrics.halted_steps.labels(worker, "deep_reorg").inc()
            raise Incident("deep_reorg", f"{opener}: {why}", chain_id=self.chain_id)

    def open(self, worker: str, why: str) -> None:
        """``worker`` halted on a deep reorg: the lanes of this chain halt until :meth:`close`."""
        self._incidents[worker] = why

    def close(self, worker: str) -> None:
        """``worker``'s deep reorg incident is over."""
        self._incidents.pop(worker, None)

    async def _read(self) -> tuple[int, bytes]:
        """The node's chain id and genesis hash (one batch); the recorded genesis the first
        time."""
        answers = await self.node.batch([("eth_chainId", []), ("eth_getBlockByNumber", ["0x0", False])])
        try:
            chain_id = int(answers[0]["result"], 16)
            genesis = bytes.fromhex(answers[1]["result"]["hash"][2:])
        except (KeyError, TypeError, ValueError, IndexError):
            raise ChainUnavailable(detail="malformed chain id or genesis block") from None
        if self._genesis is None:
            self._genesis = await self.identity.record(self.chain_id, genesis)
        self._checked_at = time.monotonic()
        return chain_id, genesis

    def _judge(self, read: tuple[int, bytes]) -> None:
        chain_id, genesis = read
        assert self._genesis is not None
        if chain_id != self.chain_id:
            why = f"the chain node answers chain id {chain_id}, not {self.chain_id}"
        elif genesis != self._genesis:
            why = (
                f"the chain node answers genesis 0x{genesis.hex()}, the database holds chain "
                f"{self.chain_id} with genesis 0x{self._genesis.hex()} (reset or swapped)"
            )
        else:
            why = None
        if why is not None and self._mismatch is None:
            log.error(
                "chain identity: the chain node answers another chain than the database's; the "
                "follower, indexers and lanes of this chain halt until it answers the recorded one",
                extra={"chain_id": self.chain_id, "reason": why},
            )
            self.metrics.chain_identity_mismatch.labels(str(self.chain_id)).set(1)
        elif why is None and self._mismatch is not None:
            log.warning(
                "chain identity: the chain node answers the recorded chain again; work resumes",
                extra={"chain_id": self.chain_id},
            )
            self.metrics.chain_identity_mismatch.labels(str(self.chain_id)).set(0)
        self._mismatch = why
