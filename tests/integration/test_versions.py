"""Version pinning by host (spec: Versioning): the v0 host serves major 0 as it was before
both breaking releases (unknown top-level keys ignored, no attribution required); the latest
and the v1 host serve major 1 (attribution required since 1.0.0-rc.1, unknown top-level keys
refused since 1.0.0); nothing but the Host header selects it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from relayer.api.x402_routes import _within_action
from relayer.domain.errors import Rejection, Unavailable
from tests.conftest import Daemon

pytestmark = pytest.mark.integration


def _host(daemon: Daemon, which: str) -> str:
    return urlsplit(daemon.runtime.settings.x402_hosts()[which]).netloc


async def _post(daemon: Daemon, body: dict[str, Any], host: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {} if host is None else {"Host": host}
    async with daemon.session.post(daemon.api, json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


def _prepare_auth(daemon: Daemon, **extra: Any) -> dict[str, Any]:
    return {
        "action": "prepare-auth",
        "carbonClass": "NBO",
        "amount": "1",
        "from": daemon.chain["payers"][0]["address"],
        **extra,
    }


async def test_unknown_top_level_keys_are_refused_on_major_1_and_ignored_on_major_0(daemon: Daemon) -> None:
    body = {"action": "quote", "carbonClass": "NBO", "amount": "1", "referrer": "agent-7"}
    for host in (None, _host(daemon, "v1")):
        status, refused = await _post(daemon, body, host)
        assert (status, refused["error"]) == (400, "schema_validation")
        assert refused["issues"][0]["keys"] == ["referrer"]
    status, quoted = await _post(daemon, body, _host(daemon, "v0"))
    assert status == 200 and quoted["quote"]["total"]
    # the latest host's answer to the valid request is the same on every host
    del body["referrer"]
    answers = [await _post(daemon, body, host) for host in (None, _host(daemon, "v1"), _host(daemon, "v0"))]
    assert {a[0] for a in answers} == {200}


async def test_attribution_is_required_from_major_1_on(daemon: Daemon) -> None:
    for host in (None, _host(daemon, "v1")):
        status, refused = await _post(daemon, _prepare_auth(daemon), host)
        assert (status, refused["error"]) == (400, "attribution_required")
    status, prepared = await _post(daemon, _prepare_auth(daemon), _host(daemon, "v0"))
    assert status == 200, prepared
    assert prepared["actionsRetireRequest"]["details"]["beneficiaryIsPayer"] is True
    # major 0 keeps a beneficiary the caller names
    named = _prepare_auth(daemon, details={"beneficiaryAddress": daemon.chain["payers"][1]["address"]})
    status, prepared = await _post(daemon, named, _host(daemon, "v0"))
    assert status == 200 and "beneficiaryIsPayer" not in prepared["actionsRetireRequest"]["details"]


async def test_each_host_names_the_version_it_serves(daemon: Daemon) -> None:
    """The action index (``GET /api``) and the manifest agree, host by host: the latest
    and the v1 host serve the newest 1.x (1.3.0), the v0 host 0.9.0."""
    for host, version in ((None, "1.3.0"), (_host(daemon, "v1"), "1.3.0"), (_host(daemon, "v0"), "0.9.0")):
        headers = {"Accept": "application/json", **({} if host is None else {"Host": host})}
        async with daemon.session.get(daemon.api, headers=headers) as r:
            index = await r.json()
        async with daemon.session.get(f"{daemon.base_url}/.well-known/x402.json", headers=headers) as r:
            manifest = await r.json()
        assert index["apiVersion"] == manifest["apiVersion"] == version, host


async def test_no_header_or_query_parameter_selects_a_version(daemon: Daemon) -> None:
    body = {"action": "quote", "carbonClass": "NBO", "amount": "1", "referrer": "x"}
    async with daemon.session.post(
        daemon.api, json=body, headers={"X-API-Version": "0", "Accept": "application/json; version=0"}
    ) as r:
        assert r.status == 400
    async with daemon.session.get(
        f"{daemon.api}/quote", params={"carbonClass": "NBO", "amount": "1", "v": "0"}
    ) as r:
        assert r.status == 400 and (await r.json())["error"] == "schema_validation"


def test_an_action_answers_only_its_own_codes() -> None:
    outage = Unavailable(detail="node down")
    assert _within_action("prepare-auth", outage) is outage  # listed for prepare-auth
    moved = _within_action("discover", outage)  # discover lists no code of its own
    assert moved.code == "internal_error" and moved.spec.retryable
    assert moved.context == {"cause": "gas_estimate_unavailable", "upstream": "upstream"}
    revert = Rejection("retirement_not_found")
    assert _within_action("certificate", revert) is revert
    assert _within_action("quote", revert).code == "internal_error"
