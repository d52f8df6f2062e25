"""The store's one boundary for connection failures (relayer/store/pool.py::translated)."""

from __future__ import annotations

import asyncpg
import pytest

from relayer.config import ConfigError
from relayer.store.pool import StoreUnavailable, translated


def _closed_after_drop() -> asyncpg.InterfaceError:
    """What asyncpg raises leaving a transaction whose connection the server dropped."""
    try:
        try:
            raise asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle")
        except asyncpg.exceptions.ConnectionDoesNotExistError:
            raise asyncpg.InterfaceError(  # noqa: B904 - asyncpg raises it without a cause
                "cannot call Transaction.__aexit__(): the underlying connection is closed"
            )
    except asyncpg.InterfaceError as exc:
        return exc


def test_a_dropped_connection_is_unavailable() -> None:
    with pytest.raises(StoreUnavailable) as caught, translated():
        raise asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command")
    assert caught.value.detail == "AdminShutdownError"


def test_an_interface_error_raised_while_handling_a_drop_is_unavailable() -> None:
    closed = _closed_after_drop()
    assert isinstance(closed.__context__, asyncpg.exceptions.ConnectionDoesNotExistError)
    with pytest.raises(StoreUnavailable) as caught, translated():
        raise closed
    assert caught.value.detail == "ConnectionDoesNotExistError"


def test_an_interface_error_of_its_own_is_a_bug_not_an_outage() -> None:
    with pytest.raises(asyncpg.InterfaceError), translated():
        raise asyncpg.InterfaceError("cannot perform operation: another operation is in progress")


def test_a_statement_error_is_not_hidden() -> None:
    with pytest.raises(asyncpg.UniqueViolationError), translated():
        raise asyncpg.UniqueViolationError("duplicate key")


def test_a_refused_dsn_is_a_config_error() -> None:
    with pytest.raises(ConfigError), translated():
        raise asyncpg.InvalidCatalogNameError('database "nope" does not exist')


def test_store_unavailable_passes_through_unchanged() -> None:
    inner = StoreUnavailable(detail="inner")
    with pytest.raises(StoreUnavailable) as caught, translated():
        raise inner
    assert caught.value is inner


def test_a_connection_asyncpg_lost_track_of_is_unavailable() -> None:
    with pytest.raises(StoreUnavailable) as caught, translated():
        raise asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in progress")
    assert caught.value.detail == "InternalClientError"
