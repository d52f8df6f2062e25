"""Development tooling beside the product, never imported by it: the local chain (anvil with
the reference protocol deployed and seeded), a private throwaway Postgres cluster, the
settings they supply to the product, and the demo client. Run as ``python -m relayer_dev``."""

from __future__ import annotations

from relayer.domain.errors import RelayerError


class DevError(RelayerError, RuntimeError):
    """Root of the dev tooling's errors (under the project's one error root; still a
    RuntimeError for callers that catch that). ``message`` says what failed."""

    def __init__(self, message: str) -> None:
        super().__init__(message=message)
