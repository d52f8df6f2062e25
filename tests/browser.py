"""Headless Chromium for tests that check what a browser makes of our pages: load a URL, get
the DOM after parsing (and after any script, were there one), read its ``data-field``
elements with the standard library's ``html.parser``. Policy: without Chromium a
browser test is skipped on a developer's machine but fails when ``CI`` is set, so CI can
never pass by silently skipping it (``.ci/run`` installs Debian's ``chromium``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Final

import pytest

CHROMIUM: Final = "/usr/bin/chromium"

# A fresh profile per run (--user-data-dir, added by dump_dom) and nothing that talks to the
# network on its own, so the only requests are the page's. --no-sandbox: CI runs as root.
# --disable-dev-shm-usage: a container's 64 MB /dev/shm can crash the renderer.
CHROMIUM_FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


class BrowserError(RuntimeError):
    """Chromium is missing, failed, or did not finish in time (message says which)."""


def chromium_path() -> str | None:
    """The Chromium executable: ``/usr/bin/chromium`` (Debian's package), else ``chromium``
    on ``PATH``; ``None`` when there is neither."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    return shutil.which("chromium")


def in_ci() -> bool:
    """True when the environment variable ``CI`` is set (to anything but "")."""
    return os.environ.get("CI", "") != ""


def require_chromium() -> str:
    """The Chromium executable, for a test that needs it.

    Without one the calling test is skipped, or fails when ``CI`` is set.
    """
    path = chromium_path()
    if path is None:
        msg = f"no Chromium ({CHROMIUM} missing and none on PATH); Debian: apt-get install chromium"
        if in_ci():
            pytest.fail(f"{msg} (CI is set: browser tests may not be skipped)", pytrace=False)
        pytest.skip(msg)
    return path


def require_poppler() -> None:
    """poppler's ``pdftoppm`` and ``pdftotext``, for a test that renders or reads a PDF.

    Without them the calling test is skipped, or fails when ``CI`` is set.
    """
    if shutil.which("pdftoppm") and shutil.which("pdftotext"):
        return
    msg = "no poppler-utils (pdftoppm, pdftotext); Debian: apt-get install poppler-utils"
    if in_ci():
        pytest.fail(f"{msg} (CI is set: browser tests may not be skipped)", pytrace=False)
    pytest.skip(msg)


def dump_dom(url: str, timeout_s: float = 30) -> str:
    """Load ``url`` in headless Chromium and return the DOM it serialises once loaded.

    Blocking (a subprocess): from async code call it through ``asyncio.to_thread`` so the
    event loop can still serve the page.

    Args:
        url: ``http(s)://`` or ``file://`` URL.
        timeout_s: wall-clock bound in seconds for the whole run; then Chromium's process
            group is killed.

    Returns:
        The serialised DOM (``<html>…</html>``), Chromium's stdout as UTF-8.

    Raises:
        BrowserError: no Chromium, a non-zero exit, or the timeout.
    """
    return _run_chromium(url, ["--dump-dom"], timeout_s).decode("utf-8", errors="replace")


def screenshot(url: str, png: Path, width: int = 1000, height: int = 1400, timeout_s: float = 30) -> bytes:
    """Load ``url`` in headless Chromium and save a ``width`` x ``height`` PNG of it at ``png``.

    Blocking, like :func:`dump_dom`.

    Returns:
        The PNG's bytes.

    Raises:
        BrowserError: no Chromium, a non-zero exit, no PNG, or the timeout.
    """
    _run_chromium(
        url, [f"--window-size={width},{height}", f"--screenshot={png}", "--hide-scrollbars"], timeout_s
    )
    if not png.is_file():
        raise BrowserError(f"chromium --screenshot {url} wrote no {png}")
    return png.read_bytes()


def print_to_pdf(url: str, pdf: Path, timeout_s: float = 30) -> bytes:
    """Load ``url`` in headless Chromium and print it to ``pdf`` as the print dialog would
    (the page's own ``@page`` size and margins, no header or footer).

    Blocking, like :func:`dump_dom`.

    Returns:
        The PDF's bytes.

    Raises:
        BrowserError: no Chromium, a non-zero exit, no PDF, or the timeout.
    """
    _run_chromium(url, ["--no-pdf-header-footer", f"--print-to-pdf={pdf}"], timeout_s)
    if not pdf.is_file():
        raise BrowserError(f"chromium --print-to-pdf {url} wrote no {pdf}")
    return pdf.read_bytes()


def _run_chromium(url: str, args: list[str], timeout_s: float) -> bytes:
    """Run headless Chromium on ``url`` with ``args`` in a fresh profile; its stdout."""
    path = chromium_path()
    if path is None:
        raise BrowserError(f"no Chromium: {CHROMIUM} is missing and none is on PATH")
    with tempfile.TemporaryDirectory(prefix="chromium-", ignore_cleanup_errors=True) as tmp:
        env = dict(os.environ, XDG_CONFIG_HOME=f"{tmp}/config", XDG_CACHE_HOME=f"{tmp}/cache")
        cmd = [path, *CHROMIUM_FLAGS, f"--user-data-dir={tmp}/profile", *args, url]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise BrowserError(f"chromium {args[-1]} {url} did not finish in {timeout_s} s") from None
        except BaseException:
            _kill_group(proc)
            raise
    if proc.returncode != 0:
        tail = err.decode("utf-8", errors="replace")[-2000:]
        raise BrowserError(f"chromium {args[-1]} {url} exited {proc.returncode}: {tail}")
    return out


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group this Popen leads (its own session), then reap it.

    Only called while the leader is unreaped, so its pid (the group's id) is still ours.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


# Elements that never have an end tag (HTML's void elements).
_VOID: Final = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
)


@dataclass
class Dom:
    """What :func:`read_dom` found: every start tag in order, each ``data-field`` element's
    text (all its descendants' text, once per occurrence) and its attributes."""

    tags: list[str] = field(default_factory=list)
    fields: dict[str, list[str]] = field(default_factory=dict)
    field_attrs: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def text(self, name: str) -> str:
        """The text of the one element with ``data-field=name`` (AssertionError unless one)."""
        found = self.fields.get(name, [])
        assert len(found) == 1, f"data-field={name!r} occurs {len(found)} times"
        return found[0]


class _DomReader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.dom = Dom()
        self._open: list[tuple[str, str | None, list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.dom.tags.append(tag)
        if tag in _VOID:
            return
        values = {k: v or "" for k, v in attrs}
        name = values.get("data-field")
        if name is not None:
            self.dom.field_attrs.setdefault(name, []).append(values)
        self._open.append((tag, name, []))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.dom.tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not any(t == tag for t, _, _ in self._open):
            return
        while self._open:
            t, name, parts = self._open.pop()
            if name is not None:
                self.dom.fields.setdefault(name, []).append("".join(parts))
            if t == tag:
                return

    def handle_data(self, data: str) -> None:
        for _, name, parts in self._open:
            if name is not None:
                parts.append(data)


def read_dom(html: str) -> Dom:
    """Parse an HTML document (or Chromium's dump of one) with ``html.parser``."""
    reader = _DomReader()
    reader.feed(html)
    reader.close()
    return reader.dom
