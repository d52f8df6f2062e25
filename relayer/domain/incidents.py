"""Incidents: what halts a worker until the chain is as it should be again, instead of a
repair that would rewrite settled history or spend the executor's money. Three kinds:

- ``chain_identity``: the chain node answers another chain id or genesis block than the one
  the database belongs to (a node reset or swapped under the daemon);
- ``deep_reorg``: a reorg deeper than the confirmation window, below the node's finalized
  block, or past what a worker remembers;
- ``nonce_gap``: an executor lane's next nonce lies further above the chain's mined nonce
  than the lane ever has in flight.

No I/O: the workers raise, log and count them."""

from __future__ import annotations

from typing import Any, Final, Literal

from relayer.domain.errors import RelayerError

IncidentKind = Literal["chain_identity", "deep_reorg", "nonce_gap"]
KINDS: Final[tuple[IncidentKind, ...]] = ("chain_identity", "deep_reorg", "nonce_gap")


class Incident(RelayerError):
    """A worker's step halted on an incident (``kind``, one of :data:`KINDS`); ``message``
    says why in one line. Transient: the step goes on once the cause is gone. Never reaches
    an HTTP body; its code is the upstream 503 (nothing attempted)."""

    default_code = "gas_estimate_unavailable"

    def __init__(self, kind: IncidentKind, message: str, **context: Any) -> None:
        super().__init__(None, message, transient=True, kind=kind, **context)
        self.kind: IncidentKind = kind
