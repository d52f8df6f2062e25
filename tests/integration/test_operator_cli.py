"""The operator's commands as processes (issue 11): ``relayer config check`` prints the
effective configuration with every secret redacted and exits 0 only when ``relayer all``
would start; ``relayer all`` starts with its key from an encrypted keystore; ``relayer
status`` shows jobs by state, the executor's lane, balance and lease, and the indexer
cursors with their lag, as tables and as JSON. Outputs printed (-s)."""

from __future__ import annotations

import asyncio
import calendar
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import pytest
from eth_account import Account
from eth_typing import HexStr

from relayer.ops import packaged_migrations
from relayer.store.migrations import migrate
from relayer_dev import devdb
from tests.helpers.relay import ProcessClient, signed_retirement
from tests.private import private_chain
from tests.processes import RELAYER, DaemonProcess, daemon_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PASSWORD = "keystore-password-never-shown"
DSN_PASSWORD = "dsn-password-never-shown"


def _relayer(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(RELAYER), *args], env=env, capture_output=True, text=True, timeout=60)


def _with_password(dsn: str) -> str:
    """The DSN with a password in it (the test server trusts local connections and ignores it;
    one that checks passwords has its own in the DSN already)."""
    parts = urlsplit(dsn)
    if parts.password:
        return dsn
    netloc = f"{parts.username or 'postgres'}:{DSN_PASSWORD}@{parts.hostname}:{parts.port or 5432}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def _keystore_env(env: dict[str, str], path: Path) -> dict[str, str]:
    """``env`` with the executor key moved into an encrypted keystore at ``path``."""
    key = env.pop("RELAYER_EXECUTOR_PRIVATE_KEY")
    path.write_text(json.dumps(Account.encrypt(HexStr(key), PASSWORD, kdf="scrypt", iterations=2**12)))
    return {
        **env,
        "RELAYER_EXECUTOR_KEYSTORE_FILE": str(path),
        "RELAYER_EXECUTOR_KEYSTORE_PASSWORD": PASSWORD,
    }


def _secrets(info: dict[str, Any], dsn: str) -> list[str]:
    """What must never be printed: key digits, the DSN's and the keystore's passwords."""
    keys = [info["executor"]["privateKey"], info["treasury"]["privateKey"]]
    password = urlsplit(dsn).password
    return [PASSWORD, *(password or DSN_PASSWORD,)] + [k.removeprefix("0x")[:16] for k in keys]


def _assert_no_secret(done: subprocess.CompletedProcess[str], secrets: list[str]) -> None:
    for secret in secrets:
        assert secret not in done.stdout and secret not in done.stderr, secret
    assert "Traceback" not in done.stderr, done.stderr


async def test_a_keystore_daemon_relays_and_status_and_config_check_show_it_without_secrets(
    tmp_path: Path, admin_database_url: str
) -> None:
    async with (
        private_chain(tmp_path, admin_database_url) as (info, scratch),
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
    ):
        dsn = _with_password(scratch)
        executor = info["executor"]["address"]
        env = _keystore_env(
            daemon_env(info, dsn, treasury_private_key=info["treasury"]["privateKey"]), tmp_path / "key.json"
        )
        secrets = _secrets(info, dsn)

        check = _relayer(env, "config", "check", "--connect")
        print(f"\n$ relayer config check --connect\n{check.stdout}{check.stderr}")
        _assert_no_secret(check, secrets)
        assert check.returncode == 0, check.stderr
        rows = {line.split()[0]: line.split()[1:] for line in check.stdout.splitlines()[2:-1]}
        assert rows["RELAYER_EXECUTOR_PRIVATE_KEY"] == [executor, "keystore"]
        assert rows["RELAYER_EXECUTOR_KEYSTORE_PASSWORD"] == ["***", "env"]
        assert rows["RELAYER_DATABASE_URL"][0] == urlunsplit(urlsplit(dsn)._replace(netloc=_no_password(dsn)))
        assert rows["RELAYER_CHAIN_ID"] == ["84532", "env"] and rows["RELAYER_GAS_CAP"] == [
            "1500000",
            "default",
        ]
        last = check.stdout.splitlines()[-1]
        assert last == "configuration ok: the settings, the database and every chain node"

        daemon = await DaemonProcess("all", env, tmp_path / "daemon.log").start()
        try:
            client = ProcessClient(session, daemon.base, info)
            for payer in range(3):
                status, result = await client.post(await signed_retirement(client, payer))
                assert (status, result.get("status")) == (200, "settled"), result
            await _until_lease_held(env)
            table = _relayer(env, "status")
            as_json = _relayer(env, "status", "--json")
        finally:
            assert daemon.stop() == 0
        print(f"\n$ relayer status\n{table.stdout}{table.stderr}")
        for done in (table, as_json):
            assert done.returncode == 0, done.stderr
            _assert_no_secret(done, secrets)
        report = json.loads(as_json.stdout)
        assert {j["state"]: j["jobs"] for j in report["jobs"]}["indexed"] == 3
        [key] = report["executors"]
        assert (key["address"], key["configured"], key["chainId"]) == (executor, True, 84532)
        assert key["laneNextNonce"] == key["chainNonce"] and key["nonceLag"] == 0
        lane_next = key["laneNextNonce"]
        assert key["inFlight"] == 0 and int(key["balanceWei"]) > 0 and key["belowFloor"] is False
        assert key["lease"]["held"] is True and key["lease"]["epoch"] >= 1
        cursors = {(i["chainId"], i["name"]): i for i in report["indexers"]}
        follower = cursors[(84532, "retirements")]
        assert follower["head"] is not None and 0 <= follower["lag"] <= 2 and follower["depth"] == 1
        assert (84532, "catalogue") in cursors
        assert report["database"]["migrations"]["pending"] == []
        lines = table.stdout.splitlines()
        assert any(line.split()[:2] == ["indexed", "3"] for line in lines)
        assert any(executor in line and "held (pid" in line for line in lines)
        assert any(line.split()[:2] == ["84532", "retirements"] for line in lines)

        # The daemon stopped: its lease is free; without an RPC URL, what the database knows.
        offline = {k: v for k, v in env.items() if k != "RELAYER_RPC_URL"}
        after = _relayer(offline, "status", "--json")
        assert after.returncode == 0, after.stderr
        report = json.loads(after.stdout)
        [key] = report["executors"]
        assert (
            key["lease"]["held"] is False and key["laneNextNonce"] == lane_next and key["chainNonce"] is None
        )
        assert report["chains"] == [] and all(i["head"] is None for i in report["indexers"])
        for secret in secrets:
            assert secret not in (tmp_path / "daemon.log").read_text()


def _no_password(dsn: str) -> str:
    parts = urlsplit(dsn)
    return f"{parts.username}@{parts.hostname}:{parts.port}"


async def _until_lease_held(env: dict[str, str], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = _relayer(env, "status", "--json")
        if done.returncode == 0 and all(e["lease"]["held"] for e in json.loads(done.stdout)["executors"]):
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the daemon's lease is not seen held")


def _offline_env(tmp_path: Path) -> dict[str, str]:
    """Settings that would let `relayer all` start, as far as can be told offline."""
    deployment = tmp_path / "deployment.json"
    names = ("usdc", "kvcm", "carbonCredits", "carbonClasses", "pool", "marketplace", "settlement")
    contracts = {n: str(Account.from_key("0x" + f"{i + 1:02x}" * 32).address) for i, n in enumerate(names)}
    deployment.write_text(json.dumps({"contracts": contracts, "deployBlock": 1}))
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "RELAYER_DATABASE_URL": f"postgresql://relayer:{DSN_PASSWORD}@127.0.0.1:1/relayer",
        "RELAYER_RPC_URL": "https://base.example.invalid/v2/rpc-key-never-shown",
        "RELAYER_DEPLOYMENT_FILE": str(deployment),
        "RELAYER_EXECUTOR_PRIVATE_KEY": "0x" + "4c" * 32,
        "RELAYER_TREASURY_PRIVATE_KEY": "0x" + "6e" * 32,
    }


OFFLINE_SECRETS = [PASSWORD, DSN_PASSWORD, "rpc-key-never-shown", "4c4c4c4c", "6e6e6e6e"]


def test_config_check_offline_passes_and_connects_to_nothing(tmp_path: Path) -> None:
    done = _relayer(_offline_env(tmp_path), "config", "check")  # the DSN and RPC point nowhere
    _assert_no_secret(done, OFFLINE_SECRETS)
    assert done.returncode == 0, done.stderr
    assert "https://base.example.invalid/***" in done.stdout
    assert str(Account.from_key("0x" + "4c" * 32).address) in done.stdout
    assert done.stdout.splitlines()[-1] == (
        "configuration ok: the settings, offline (--connect also tries the database and the chain nodes)"
    )
    reached = _relayer(_offline_env(tmp_path), "config", "check", "--connect")
    assert reached.returncode == 2, reached.stderr  # nothing answers: each line says why and what to do
    _assert_no_secret(reached, OFFLINE_SECRETS)
    assert (
        "relayer: RELAYER_DATABASE_URL postgresql://relayer@127.0.0.1:1/relayer: connection refused; "
        "is Postgres running, and listening on that port?" in reached.stderr
    )
    assert (
        "relayer: RELAYER_RPC_URL https://base.example.invalid/***: no such host; check the host name"
        in reached.stderr
    )


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"RELAYER_DEPLOYMENT_FILE": None}, ["relayer: missing setting RELAYER_DEPLOYMENT_FILE ("]),
        (
            {"RELAYER_EXECUTOR_PRIVATE_KEY": None, "RELAYER_RPC_URL": None},
            [
                "relayer: missing setting RELAYER_RPC_URL (",
                "relayer: missing setting RELAYER_EXECUTOR_PRIVATE_KEY (",
                "or RELAYER_EXECUTOR_KEYSTORE_FILE with RELAYER_EXECUTOR_KEYSTORE_PASSWORD",
            ],
        ),
        ({"RELAYER_DATABASE_URL": f"host=db password={DSN_PASSWORD}"}, ["RELAYER_DATABASE_URL is not a"]),
        ({"RELAYER_RPC_URL": "ws://node:8546"}, ["relayer: RELAYER_RPC_URL is not an http(s):// URL"]),
        ({"RELAYER_DEPLOYMENT_FILE": "/nonexistent.json"}, ["RELAYER_DEPLOYMENT_FILE /nonexistent.json"]),
        ({"RELAYER_EXECUTOR_PRIVATE_KEY": "0x" + "4c" * 31}, ["RELAYER_EXECUTOR_PRIVATE_KEY: ", "32 bytes"]),
        (
            {"RELAYER_EXECUTOR_KEYSTORE_FILE": "KEYSTORE", "RELAYER_EXECUTOR_KEYSTORE_PASSWORD": PASSWORD},
            ["RELAYER_EXECUTOR_PRIVATE_KEY and RELAYER_EXECUTOR_KEYSTORE_FILE are both set"],
        ),
        (
            {
                "RELAYER_EXECUTOR_PRIVATE_KEY": None,
                "RELAYER_EXECUTOR_KEYSTORE_FILE": "KEYSTORE",
                "RELAYER_EXECUTOR_KEYSTORE_PASSWORD": "wrong " + PASSWORD,
            },
            ["RELAYER_EXECUTOR_KEYSTORE_PASSWORD does not open RELAYER_EXECUTOR_KEYSTORE_FILE"],
        ),
        (
            {"RELAYER_EXECUTOR_PRIVATE_KEY": None, "RELAYER_EXECUTOR_KEYSTORE_FILE": "KEYSTORE"},
            ["RELAYER_EXECUTOR_KEYSTORE_FILE is set without RELAYER_EXECUTOR_KEYSTORE_PASSWORD"],
        ),
        (
            {
                "RELAYER_EXECUTOR_PRIVATE_KEY": None,
                "RELAYER_EXECUTOR_KEYSTORE_FILE": "NOT_JSON",
                "RELAYER_EXECUTOR_KEYSTORE_PASSWORD": PASSWORD,
            },
            ["RELAYER_EXECUTOR_KEYSTORE_FILE", "is not JSON"],
        ),
    ],
    ids=[
        "no-deployment",
        "no-rpc-no-key",
        "libpq-dsn",
        "websocket-rpc",
        "deployment-absent",
        "short-key",
        "key-and-keystore",
        "wrong-password",
        "no-password",
        "keystore-not-json",
    ],
)
def test_config_check_names_each_problem_and_exits_2_without_echoing_a_secret(
    tmp_path: Path, change: dict[str, str | None], says: list[str]
) -> None:
    env = _offline_env(tmp_path)
    keystore = tmp_path / "key.json"
    keystore.write_text(
        json.dumps(Account.encrypt(HexStr("0x" + "4c" * 32), PASSWORD, kdf="pbkdf2", iterations=2))
    )
    (tmp_path / "bad.json").write_text("{")
    files = {"KEYSTORE": str(keystore), "NOT_JSON": str(tmp_path / "bad.json")}
    for name, value in change.items():
        if value is None:
            env.pop(name)
        else:
            env[name] = files.get(value, value)
    done = _relayer(env, "config", "check")
    print(f"\n{done.stderr}")
    assert done.returncode == 2, (done.stdout, done.stderr)
    _assert_no_secret(done, [*OFFLINE_SECRETS, "4c" * 31])
    for text in says:
        assert text in done.stderr, done.stderr
    assert all(line.startswith("relayer: ") for line in done.stderr.splitlines())


def test_a_command_logs_json_lines_stamped_in_rfc3339_utc(admin_database_url: str) -> None:
    """``relayer migrate`` logs as the daemon does: one JSON object a line, its time in UTC
    with milliseconds and a ``Z`` whatever the machine's zone (before: local time, no zone)."""
    dsn = devdb.create_scratch_database(admin_database_url, prefix="relayer_cli_log")
    env = {"PATH": "/usr/bin:/bin", "RELAYER_DATABASE_URL": dsn, "TZ": "America/Sao_Paulo"}
    try:
        started = time.time()
        done = _relayer(env, "migrate")
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in done.stderr.splitlines()]
    finally:
        devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])
    assert lines and all(set(line) >= {"time", "level", "logger", "message"} for line in lines), lines[:3]
    stamps = [line["time"] for line in lines]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", t) for t in stamps), stamps[:3]
    assert abs(calendar.timegm(time.strptime(stamps[0][:19], "%Y-%m-%dT%H:%M:%S")) - started) < 30


def test_status_asks_for_migrations_and_shows_an_unanswering_chain_as_unknown(
    admin_database_url: str,
) -> None:
    dsn = devdb.create_scratch_database(admin_database_url, prefix="relayer_status")
    env = {
        "PATH": "/usr/bin:/bin",
        "RELAYER_DATABASE_URL": dsn,
        "RELAYER_RPC_URL": "http://127.0.0.1:1/rpc-key-never-shown",
        "RELAYER_INDEX_CHAINS": json.dumps(
            [{"chainId": 137, "rpcUrl": "http://127.0.0.1:1", "deploymentFile": "/nonexistent.json"}]
        ),
    }
    try:
        fresh = _relayer(env, "status")
        assert fresh.returncode == 2, fresh.stderr
        assert f"lacks {len(packaged_migrations())} migration(s)" in fresh.stderr
        assert "run `relayer migrate`" in fresh.stderr
        migrate(dsn)
        done = _relayer(env, "status")
        print(f"\n$ relayer status (no daemon ever ran, the node down)\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, done.stderr
        assert "rpc-key-never-shown" not in done.stdout
        assert "chain 84532 at http://127.0.0.1:1/***: unknown: no answer" in done.stdout
        assert "chain 137 at http://127.0.0.1:1: unknown: no answer" in done.stdout
        assert "none: no executor key configured and no lane in the database" in done.stdout
        report = json.loads(_relayer(env, "status", "--json").stdout)
        assert [c["head"] for c in report["chains"]] == [None, None]
        assert {j["state"]: j["jobs"] for j in report["jobs"]}["accepted"] == 0
        assert report["executors"] == [] and report["indexers"] == []
    finally:
        devdb.drop_database(admin_database_url, dsn.rsplit("/", 1)[1])
