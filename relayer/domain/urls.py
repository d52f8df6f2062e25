"""URLs as the operator may see them: without what may be a credential."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """An RPC URL without what may be a credential: the password, the path (``/v2/<key>``)
    and the query, each replaced by ``***``; the scheme, user, host and port stay."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "***"
    if not parts.scheme or not host:
        return "***"
    netloc = (f"{parts.username}@" if parts.username else "") + host + (f":{port}" if port else "")
    path = parts.path if parts.path in ("", "/") else "/***"
    return urlunsplit((parts.scheme, netloc, path, "***" if parts.query else "", ""))
