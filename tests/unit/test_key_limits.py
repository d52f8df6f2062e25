"""The facilitator keys' pure pieces (design: docs/design/x402-v2.md, C3): the UTC day a
reservation counts in and the seconds to the next one, a transfer's fee ceiling, the rate
limit notation the settings and the CLI accept, each key's own request limit beside the
default, and the 429 answers' Retry-After."""

from __future__ import annotations

import datetime as dt

import pytest

from relayer.api.errors import error_response
from relayer.api.facilitator import KeyLimits
from relayer.config import Settings, check_rate_limit
from relayer.domain.budget import seconds_to_utc_midnight, transfer_gas_ceiling, utc_day
from relayer.domain.errors import Rejection
from relayer.service.market.keys import KeyInfo

MIDNIGHT = int(dt.datetime(2026, 3, 1, tzinfo=dt.UTC).timestamp())


def test_the_budget_day_is_the_utc_day_and_retry_after_reaches_its_end() -> None:
    assert utc_day(MIDNIGHT) == dt.date(2026, 3, 1)
    assert utc_day(MIDNIGHT - 1) == dt.date(2026, 2, 28)
    assert seconds_to_utc_midnight(MIDNIGHT) == 86_400
    assert seconds_to_utc_midnight(MIDNIGHT - 1) == 1
    assert seconds_to_utc_midnight(MIDNIGHT + 3_600) == 82_800
    for now in (MIDNIGHT - 1, MIDNIGHT, MIDNIGHT + 12_345):
        assert utc_day(now + seconds_to_utc_midnight(now)) == utc_day(now) + dt.timedelta(days=1)


def test_a_transfer_reserves_its_gas_limit_at_the_fee_ceiling_plus_its_extra_fees() -> None:
    assert transfer_gas_ceiling(72_000, 10 * 10**9, 0) == 720_000 * 10**9
    assert transfer_gas_ceiling(72_000, 10 * 10**9, 5_000) == 720_000 * 10**9 + 5_000
    with pytest.raises(ValueError):
        transfer_gas_ceiling(72_000, -1, 0)


@pytest.mark.parametrize("good", ["20/second", "50/second;1000/minute", "1/day"])
def test_rate_limits_in_the_limits_notation_are_accepted(good: str) -> None:
    assert check_rate_limit(good) == good


@pytest.mark.parametrize("bad", ["", "fast", "20 per", "x" * 201])
def test_other_rate_limits_are_refused_by_the_cli_check_and_the_setting(bad: str) -> None:
    with pytest.raises(ValueError):
        check_rate_limit(bad)
    with pytest.raises(ValueError):
        Settings(facilitator_default_rate_limit=bad)


def test_the_settings_defaults() -> None:
    s = Settings()
    assert s.facilitator_default_rate_limit == "20/second"
    assert s.facilitator_default_gas_budget_wei_per_day == 5 * 10**16


def test_each_key_counts_on_its_own_at_its_own_limit_or_the_default() -> None:
    limits = KeyLimits("2/minute", 10**15)
    default_a, default_b = KeyInfo(1, "a"), KeyInfo(2, "b")
    own = KeyInfo(3, "c", rate_limit="4/minute", gas_budget_wei_per_day=7)
    assert [limits.retry_after(default_a) for _ in range(2)] == [None, None]
    wait = limits.retry_after(default_a)
    assert wait is not None and 1 <= wait <= 60
    assert limits.retry_after(default_b) is None  # another key: its own window
    assert [limits.retry_after(own) for _ in range(4)] == [None] * 4
    assert limits.retry_after(own) is not None
    assert (limits.budget_wei(default_a), limits.budget_wei(own)) == (10**15, 7)


def test_an_unreadable_stored_limit_falls_back_to_the_default() -> None:
    limits = KeyLimits("1/minute", 0)
    odd = KeyInfo(9, "odd", rate_limit="not a limit")
    assert limits.retry_after(odd) is None
    assert limits.retry_after(odd) is not None


@pytest.mark.parametrize("code", ["rate_limited", "gas_budget_exhausted"])
def test_a_429_says_retry_after_in_the_facilitator_body(code: str) -> None:
    response = error_response(Rejection(code, "wait", retryAfterSeconds=321), "facilitator")
    assert (response.status, response.headers["Retry-After"]) == (429, "321")
    assert response.text is not None and '"error": "' + code + '"' in response.text
