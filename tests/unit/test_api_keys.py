"""The API key lookup (issue 35, finding 7): a well-formed token is looked up by its SHA-256
alone, so a token whose prefix names a live key and one whose prefix names none do the same
work (one lookup by hash, nothing else); its use is written at most once a minute. Pure: the
store is a recording stand-in."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from relayer.domain.errors import Rejection
from relayer.service.market.keys import ApiKeys
from relayer.store.orders import StoredKey

PREFIX = "0123456789ab"
TOKEN = f"mk_{PREFIX}_{'s' * 43}"


class Recording:
    """An ``Orders`` stand-in holding one key; it records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.key = StoredKey(
            7, hashlib.sha256(TOKEN.encode()).digest(), "k", frozenset({"facilitator"}), None, None
        )

    async def key_by_hash(self, key_hash: bytes) -> StoredKey | None:
        self.calls.append(("key_by_hash", key_hash))
        return self.key if key_hash == self.key.key_hash else None

    async def touch_key(self, key_id: int) -> None:
        self.calls.append(("touch_key", key_id))


async def _refused(keys: ApiKeys, token: str) -> None:
    with pytest.raises(Rejection) as refused:
        await keys.authenticate(f"Bearer {token}", "facilitator")
    assert refused.value.code == "unauthorized"


async def test_a_known_prefix_and_an_unknown_one_do_the_same_work() -> None:
    store = Recording()
    keys = ApiKeys(store)  # type: ignore[arg-type]
    wrong_secret = f"mk_{PREFIX}_{'x' * 43}"
    unknown_prefix = f"mk_ba9876543210_{'x' * 43}"
    await _refused(keys, wrong_secret)
    known = list(store.calls)
    store.calls.clear()
    await _refused(keys, unknown_prefix)
    assert [c[0] for c in known] == [c[0] for c in store.calls] == ["key_by_hash"]
    assert known[0][1] == hashlib.sha256(wrong_secret.encode()).digest()


async def test_a_malformed_token_reads_nothing_and_a_good_one_is_touched_once_a_minute() -> None:
    store = Recording()
    keys = ApiKeys(store)  # type: ignore[arg-type]
    for bad in ("mk_short_x", "nope", f"mk_{PREFIX}"):
        await _refused(keys, bad)
    assert store.calls == []
    for _ in range(3):
        info = await keys.authenticate(f"Bearer {TOKEN}", "facilitator")
        assert info.id == 7
    assert [c for c in store.calls if c[0] == "touch_key"] == [("touch_key", 7)]
    with pytest.raises(Rejection):  # a key without the scope: the same refusal
        await keys.authenticate(f"Bearer {TOKEN}", "marketplace")
