"""Settings: the executor key from a plain key or an encrypted JSON keystore (exactly one),
secret files named as the setting or as its variable, where each setting came from, and what
``config check`` shows of a secret (never the secret)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import pytest
from eth_account import Account
from eth_typing import HexStr
from pydantic import SecretStr, ValidationError

from relayer.config import ConfigError, Settings, decrypt_keystore, setting_origins
from relayer.ops import configuration, redact_url, shown_value

KEY = "0x" + "4c" * 32
ADDRESS = str(Account.from_key(KEY).address)
PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _no_relayer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test process's own RELAYER_ variables (the suite's database URL) stay out."""
    for name in list(os.environ):
        if name.startswith("RELAYER_"):
            monkeypatch.delenv(name)


def keystore(
    path: Path, key: str = KEY, password: str = PASSWORD, kdf: Literal["scrypt", "pbkdf2"] = "scrypt"
) -> Path:
    """A Web3 Secret Storage v3 keystore as eth-account writes it (a cheap work factor)."""
    document = Account.encrypt(HexStr(key), password, kdf=kdf, iterations=2 if kdf == "pbkdf2" else 2**10)
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize("kdf", ["scrypt", "pbkdf2"])
def test_a_keystore_with_its_password_gives_the_executor_key(
    tmp_path: Path, kdf: Literal["scrypt", "pbkdf2"]
) -> None:
    settings = Settings(
        executor_keystore_file=keystore(tmp_path / "k.json", kdf=kdf), executor_keystore_password=PASSWORD
    )
    assert settings.executor_keys() == [KEY]
    settings.require("executor_private_key")  # the daemons' requirement is met by the keystore
    assert PASSWORD not in repr(settings) and KEY[2:] not in repr(settings)


def test_a_keystore_and_more_keys_give_every_key(tmp_path: Path) -> None:
    other = "0x" + "5d" * 32
    settings = Settings(
        executor_keystore_file=keystore(tmp_path / "k.json"),
        executor_keystore_password=PASSWORD,
        executor_private_keys=other,
    )
    assert settings.executor_keys() == [KEY, other]


def _refused(**fields: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        Settings(**fields)
    message = caught.value.message
    assert PASSWORD not in message and KEY[2:] not in message and "4c4c4c4c" not in message
    return message


def test_a_wrong_password_is_refused_naming_the_settings(tmp_path: Path) -> None:
    message = _refused(
        executor_keystore_file=keystore(tmp_path / "k.json"), executor_keystore_password="nope"
    )
    assert "RELAYER_EXECUTOR_KEYSTORE_PASSWORD does not open RELAYER_EXECUTOR_KEYSTORE_FILE" in message
    assert "nope" not in message


def test_a_key_and_a_keystore_together_are_refused_naming_both(tmp_path: Path) -> None:
    message = _refused(
        executor_private_key=KEY,
        executor_keystore_file=keystore(tmp_path / "k.json"),
        executor_keystore_password=PASSWORD,
    )
    assert "RELAYER_EXECUTOR_PRIVATE_KEY and RELAYER_EXECUTOR_KEYSTORE_FILE are both set" in message


def test_a_keystore_without_its_password_and_a_password_alone_are_refused(tmp_path: Path) -> None:
    message = _refused(executor_keystore_file=keystore(tmp_path / "k.json"))
    assert message == "RELAYER_EXECUTOR_KEYSTORE_FILE is set without RELAYER_EXECUTOR_KEYSTORE_PASSWORD"
    message = _refused(executor_keystore_password=PASSWORD)
    assert message.startswith(
        "RELAYER_EXECUTOR_KEYSTORE_PASSWORD is set without RELAYER_EXECUTOR_KEYSTORE_FILE"
    )


def test_neither_key_nor_keystore_is_missing_naming_both_ways() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings().require("executor_private_key")
    assert caught.value.message.startswith("missing setting RELAYER_EXECUTOR_PRIVATE_KEY (")
    assert caught.value.message.endswith(
        "or RELAYER_EXECUTOR_KEYSTORE_FILE with RELAYER_EXECUTOR_KEYSTORE_PASSWORD"
    )


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot be read (FileNotFoundError)"),
        ("{not json", "is not JSON"),
        ("[1, 2]", "is not an encrypted JSON keystore"),
        ('{"version": 4, "crypto": {}}', "is not an encrypted JSON keystore"),
        ('{"version": 3, "crypto": {"cipher": "aes-128-ctr"}}', "is not a usable keystore (KeyError)"),
    ],
    ids=["absent", "not-json", "not-an-object", "version-4", "fields-missing"],
)
def test_an_unusable_keystore_file_is_refused_naming_the_setting(
    tmp_path: Path, content: str | None, says: str
) -> None:
    path = tmp_path / "k.json"
    if content is not None:
        path.write_text(content)
    message = _refused(executor_keystore_file=path, executor_keystore_password=PASSWORD)
    assert message.startswith(f"RELAYER_EXECUTOR_KEYSTORE_FILE {path} ") and says in message


def test_a_damaged_keystore_does_not_open(tmp_path: Path) -> None:
    path = keystore(tmp_path / "k.json")
    document = json.loads(path.read_text())
    document["crypto"]["ciphertext"] = "00" * 32
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="a wrong password or a damaged keystore"):
        decrypt_keystore(path, SecretStr(PASSWORD))


def test_secret_files_named_as_the_setting_or_its_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "executor_keystore_password").write_text(PASSWORD + "\n")  # as a Kubernetes secret
    (tmp_path / "RELAYER_TREASURY_PRIVATE_KEY").write_text(KEY)
    (tmp_path / "rpc_url").write_text("http://from-a-file:8545")
    monkeypatch.setenv("RELAYER_EXECUTOR_KEYSTORE_FILE", str(keystore(tmp_path / "k.json")))
    monkeypatch.setenv("RELAYER_RPC_URL", "http://from-the-env:8545")  # the environment wins
    settings = Settings(_secrets_dir=tmp_path)
    assert settings.executor_keys() == [KEY]
    assert (
        settings.treasury_private_key is not None and settings.treasury_private_key.get_secret_value() == KEY
    )
    assert settings.rpc_url == "http://from-the-env:8545"
    origins = setting_origins(tmp_path)
    assert origins["executor_keystore_password"] == "secret file"
    assert origins["treasury_private_key"] == "secret file"
    assert origins["executor_keystore_file"] == "env" and origins["rpc_url"] == "env"
    assert origins["executor_private_key"] == "keystore"
    assert "chain_id" not in origins  # a default


def test_config_check_shows_no_secret(tmp_path: Path) -> None:
    settings = Settings(
        database_url="postgresql://relayer:dsn-password@db.internal:5432/relayer?sslmode=require",
        rpc_url="https://base-mainnet.example.com/v2/rpc-api-key",
        executor_keystore_file=keystore(tmp_path / "k.json"),
        executor_keystore_password=PASSWORD,
        executor_private_keys="0x" + "5d" * 32,
        treasury_private_key="0x" + "6e" * 32,
        index_chains=[
            {"chainId": 137, "rpcUrl": "https://polygon.example.com/key-137", "deploymentFile": "d"}
        ],
    )
    rows = {r["variable"]: r for r in configuration(settings, {"executor_private_key": "keystore"})}
    assert set(rows) == {f"RELAYER_{name.upper()}" for name in Settings.model_fields}
    shown = json.dumps(rows)
    for secret in ("dsn-password", "rpc-api-key", "key-137", PASSWORD, "4c" * 8, "5d" * 8, "6e" * 8):
        assert secret not in shown
    assert rows["RELAYER_DATABASE_URL"]["value"] == "postgresql://relayer@db.internal:5432/relayer"
    assert rows["RELAYER_RPC_URL"]["value"] == "https://base-mainnet.example.com/***"
    assert rows["RELAYER_EXECUTOR_PRIVATE_KEY"] == {
        "variable": "RELAYER_EXECUTOR_PRIVATE_KEY",
        "value": ADDRESS,
        "source": "keystore",
    }
    assert rows["RELAYER_EXECUTOR_KEYSTORE_PASSWORD"]["value"] == "***"
    assert rows["RELAYER_TREASURY_PRIVATE_KEY"]["value"] == str(Account.from_key("0x" + "6e" * 32).address)
    assert rows["RELAYER_CHAIN_ID"] == {"variable": "RELAYER_CHAIN_ID", "value": "84532", "source": "default"}
    assert shown_value(settings, "confirmations") == "(unset: chain 84532's default: 50)"
    default = "(unset: chain 84532's default: 10 s = 50 blocks of 200 ms)"
    assert shown_value(settings, "confirmation") == default
    assert shown_value(settings, "certificate_issuer") == "(unset: the public host: 127.0.0.1:8402)"


@pytest.mark.parametrize(
    ("issuer", "base", "named"),
    [
        ("", "https://relay.example.org", "relay.example.org"),
        ("  ", "https://relay.example.org:8443/sub", "relay.example.org:8443"),
        ("Carbon Relay Ltd", "https://relay.example.org", "Carbon Relay Ltd"),
    ],
)
def test_the_certificates_issuer(issuer: str, base: str, named: str) -> None:
    settings = Settings(certificate_issuer=issuer, public_base_url=base)
    assert settings.issuer() == named


def test_the_certificates_issuer_is_bounded() -> None:
    with pytest.raises(ValidationError):
        Settings(certificate_issuer="x" * 81)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:8545", "http://127.0.0.1:8545"),
        ("https://node.example.com/", "https://node.example.com/"),
        ("https://base.g.alchemy.com/v2/secret", "https://base.g.alchemy.com/***"),
        ("https://user:pass@node.example.com?apikey=secret", "https://user@node.example.com?***"),
        ("not a url", "***"),
        ("http://host:notaport/", "***"),
    ],
)
def test_rpc_urls_are_shown_without_what_may_be_a_credential(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_the_daemon_runs_on_the_event_loop_its_setting_names(event_loop: str) -> None:
    import asyncio

    import uvloop

    from relayer.__main__ import _run

    seen: list[asyncio.AbstractEventLoop] = []

    async def daemon() -> None:
        seen.append(asyncio.get_running_loop())

    _run(daemon(), event_loop)
    assert isinstance(seen[0], uvloop.Loop) == (event_loop == "uvloop")


def test_the_event_loop_is_uvloop_unless_told() -> None:
    assert Settings().event_loop == "uvloop"
    with pytest.raises(ValidationError):
        Settings(event_loop="trio")  # type: ignore[arg-type]


def test_the_order_keepers_grace_is_ten_seconds_unless_told() -> None:
    """The tests shorten ``RELAYER_ORDER_GRACE_S``; production keeps ten seconds, and an
    order's own request is never taken over within a second of it being recorded."""
    from relayer.service.market.orders import ORDER_GRACE_S

    assert Settings().order_grace_s == ORDER_GRACE_S == 10
    assert Settings(order_grace_s=2).order_grace_s == 2
    for bad in (0, -1, 301):
        with pytest.raises(ValidationError):
            Settings(order_grace_s=bad)
