"""Whether an API key lookup tells, by its time, that a token's prefix exists (issue 35,
finding 7): ``ApiKeys.authenticate`` against a real Postgres holding 1,000 keys, for a token
whose prefix is a live key's with a wrong secret, one whose prefix is no key's, a malformed
one and the right one; beside it, in the same run, the lookup this replaced (the keys of the
token's prefix, then a hash comparison), which answered a known prefix with a row and an
unknown one with none. Cases interleave, round by round; medians in microseconds and the
known/unknown ratio of each. Prints one JSON object a line.

    .venv/bin/python bench/key_lookup.py [--rounds 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import secrets
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import in_scratch_database  # noqa: E402
from relayer.domain.errors import Rejection  # noqa: E402
from relayer.service.market.keys import ApiKeys  # noqa: E402
from relayer.store.orders import Orders  # noqa: E402
from relayer.store.pool import Database  # noqa: E402

KEYS = 1_000
# The lookup before issue 35: every live key of the token's public prefix.
BY_PREFIX = """
SELECT id, key_hash, name, scopes, rate_limit, gas_budget_wei_per_day FROM api_keys
WHERE prefix = $1 AND revoked_at IS NULL LIMIT 8
"""


def _token(prefix: str) -> str:
    return f"mk_{prefix}_{secrets.token_urlsafe(32)}"


async def _timed(call: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    with contextlib.suppress(Rejection):
        await call()
    return (time.perf_counter() - started) * 1e6


async def measure(dsn: str, rounds: int) -> None:
    db = await Database.connect(dsn, 1, 2)
    try:
        orders = Orders(db)
        prefixes = [secrets.token_hex(6) for _ in range(KEYS)]
        for p in prefixes:
            await orders.add_key(
                hashlib.sha256(_token(p).encode()).digest(), p, f"bench-{p}", ["facilitator"]
            )
        known = prefixes[KEYS // 2]
        good_prefix = secrets.token_hex(6)
        good = _token(good_prefix)
        await orders.add_key(
            hashlib.sha256(good.encode()).digest(), good_prefix, "bench-good", ["facilitator"]
        )
        keys = ApiKeys(orders)

        async def old_lookup(token: str) -> None:
            digest = hashlib.sha256(token.encode()).digest()
            rows = await db.fetch(BY_PREFIX, token.split("_")[1])
            if not any(hmac.compare_digest(bytes(r["key_hash"]), digest) for r in rows):
                raise Rejection("unauthorized", "no key")

        cases: dict[str, Callable[[], Awaitable[object]]] = {
            "known prefix, wrong secret": lambda: keys.authenticate(f"Bearer {_token(known)}", "facilitator"),
            "unknown prefix": lambda: keys.authenticate(
                f"Bearer {_token(secrets.token_hex(6))}", "facilitator"
            ),
            "malformed": lambda: keys.authenticate("Bearer mk_short_x", "facilitator"),
            "the right key": lambda: keys.authenticate(f"Bearer {good}", "facilitator"),
            "before: known prefix, wrong secret": lambda: old_lookup(_token(known)),
            "before: unknown prefix": lambda: old_lookup(_token(secrets.token_hex(6))),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(50):  # warm the pool, the plans and the caches
            for call in cases.values():
                await _timed(call)
        for _ in range(rounds):
            for name, call in cases.items():
                times[name].append(await _timed(call))
        med = {name: statistics.median(t) for name, t in times.items()}
        for name, t in times.items():
            print(
                json.dumps(
                    {
                        "case": name,
                        "rounds": rounds,
                        "median_us": round(med[name], 1),
                        "p90_us": round(statistics.quantiles(t, n=10)[-1], 1),
                    }
                )
            )
        print(
            json.dumps(
                {
                    "known_over_unknown": round(med["known prefix, wrong secret"] / med["unknown prefix"], 3),
                    "before_known_over_unknown": round(
                        med["before: known prefix, wrong secret"] / med["before: unknown prefix"], 3
                    ),
                }
            )
        )
    finally:
        await db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(in_scratch_database(ROOT, "bench-keys-", "state", lambda _s, dsn: measure(dsn, args.rounds)))


if __name__ == "__main__":
    main()
