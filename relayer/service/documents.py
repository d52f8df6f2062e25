"""Retirement certificates as documents: a standalone HTML page and an A4 PDF, rendered by
pure functions from a :class:`CertificateView` (no I/O, no clock: the same view always gives
the same bytes). Every string is cleaned and bounded here, because names and messages are
whatever the payer put in the on-chain retirement event.

Text policy, applied to every field of both documents (:func:`clean_text`):

1. Only the first (16 x bound) characters of the raw value are read; the rest is ignored.
2. Unicode NFC (a letter followed by a combining accent becomes the one accented letter).
3. Removed: control characters (Unicode ``Cc``; those that are whitespace count as a space),
   lone surrogates (``Cs``: they cannot be encoded as UTF-8) and the bidirectional
   embedding, override and isolate controls U+202A to U+202E and U+2066 to U+2069 (they could
   reorder the text around them, as in "Trojan Source").
4. Every run of whitespace (tabs, newlines, U+3000, …) becomes one space; none at either end.
5. A value longer than its bound (:data:`MAX_CHARS`, in characters, i.e. code points) keeps
   its first ``bound`` characters followed by "…".

An empty value is never left as a hole: the documents say "not given" (beneficiary and
retiring names), "not in the catalogue" (project name) or "none" (message).

HTML: every value goes through ``html.escape`` (quotes too); user text sits in ``dir="auto"``
elements so right-to-left names lay out on their own; a Content-Security-Policy meta tag
forbids scripts and every network load (inline CSS only; fonts only as ``data:`` URLs). Text
in Hebrew, Arabic or CJK brings subsets of those fonts (the PDF's) inside the page, so a
reader without such fonts still sees it; emoji are left to the reader's emoji font. Each
URL (verification page, machine-readable record, explorer) is a link only when it is
``http(s)://`` and was not cut; the QR code (segno, error correction M) of the verification
page is an inline SVG, drawn only for such a link (the PDF draws it as filled squares).

PDF: every font embedded (subsets), from pinned font packages with their licences
(:mod:`relayer.service.pdf_fonts`: Noto Sans for Latin, Greek and Cyrillic, Heebo for Hebrew,
Noto Sans Arabic, Noto Sans CJK); Arabic is shaped and right-to-left text ordered by HarfBuzz
(fpdf2's text shaping). After the text policy (:func:`pdf_text`) the soft hyphen goes; a
character no font has is dropped when it is invisible (combining marks ``Mn``/``Me``, format
characters ``Cf``, emoji skin-tone modifiers), a pair of regional indicators becomes
"[flag XX]", and any other (emoji, scripts beyond those above) becomes its Unicode name in
brackets ("🌳" is "[deciduous tree]"), so the PDF shows no empty boxes; a value that grows past
its bound that way is cut with "…". The HTML page shows every value exactly, in the reader's
fonts. Under the bounds above even the worst case (every field at its bound, in the widest
letter) fits on one A4 page. The creation date is the retirement's block time, so two renders
of one view are byte-identical.

Amounts: "1 tonne" when the amount is exactly "1"; "tonnes" for every other amount, decimals
included ("0.5 tonnes", "1.5 tonnes", "1.0 tonnes", "0 tonnes"), as English usage has it for
any number but one (:func:`tonne_unit`).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import html
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Final

import segno
from fpdf import FPDF
from fpdf.enums import Align, TextMode, WrapMode, XPos, YPos
from fpdf.fonts import TTFFont

from relayer.service import pdf_fonts
from relayer.service.styles import BASE_CSS, content_security_policy, html_document

ELLIPSIS: Final = "…"

MAX_CHARS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "beneficiary_name": 120,
        "retiring_name": 120,
        "message": 500,
        "project_name": 120,
        "project_key": 64,
        "registry": 64,
        "chain_name": 64,
        "vintage": 32,
        "amount_tonnes": 40,
        "beneficiary_address": 64,
        "retiring_address": 64,
        "transaction_hash": 80,
        "retirement_id": 100,
        "verify_url": 160,
        "view_url": 160,
        "explorer_url": 160,
        "project_country": 64,
        "project_region": 80,
        "methodology": 160,
        "project_category": 64,
        "issuer": 80,
    }
)
"""The bound of each string field of :class:`CertificateView`, in characters (after cleaning;
a longer value is cut and ends with "…")."""

MAX_SERIALS: Final = 5
"""Registry serial numbers shown; more are summed up as "and N more"."""
SERIAL_MAX_CHARS: Final = 40
"""The bound of each registry serial number, in characters."""

_RAW_READ_FACTOR: Final = 16
_CHAIN_ID_MAX_DIGITS: Final = 20
_BIDI_CONTROLS: Final = frozenset(
    [chr(c) for c in range(0x202A, 0x202F)] + [chr(c) for c in range(0x2066, 0x206A)]
)
_INVISIBLE_CATEGORIES: Final = frozenset({"Mn", "Me", "Cf"})
_EMOJI_MODIFIERS: Final = range(0x1F3FB, 0x1F400)
_FLAG: Final = re.compile("([\U0001f1e6-\U0001f1ff])([\U0001f1e6-\U0001f1ff])")
_REGIONAL_A: Final = 0x1F1E6
_SOFT_HYPHEN: Final = "\u00ad"
# datetime covers years 1..9999; block times before 1970 are not real either.
_MAX_TIMESTAMP_S: Final = 253_402_300_799
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class CertificateView:
    """Everything a certificate shows about one indexed retirement.

    The string fields are shown as given after the module's text policy; the route builds
    this from the indexed retirement event and the project catalogue.

    Attributes:
        retirement_id: ``{chainId}-{txHash}-{retirementIndex}``, e.g. ``84532-0x<64 hex>-0``.
        chain_id: EIP-155 chain id (8453, 84532, …).
        chain_name: the chain's display name ("Base Sepolia").
        transaction_hash: ``0x`` + 64 hex digits.
        retirement_index: the retirement's index within its transaction.
        beneficiary_name: user-supplied, any Unicode, may be "".
        beneficiary_address: checksummed ``0x`` address.
        retiring_address: the payer's checksummed ``0x`` address.
        retiring_name: user-supplied, may be "".
        message: the retirement message, user-supplied, may be "".
        amount_tonnes: decimal string in tonnes as the API formats it ("1.5"), never a float.
        project_key: registry project key ("VCS-10").
        project_name: catalogue name, "" when the project is not in the catalogue.
        vintage: the credit's vintage year ("2019").
        registry: the registry's short name ("VCS").
        timestamp: the retirement's block time, unix seconds (UTC).
        verify_url: URL of this retirement's JSON record (``GET /retirements/{id}``).
        view_url: URL of the page a person reads to verify it (the HTML certificate, served
            from the index); the QR code holds it.
        explorer_url: the public block explorer's page of the transaction; "" when the chain
            is not a public one (a local devnet) or has no known explorer.
        project_country: the project's country from the catalogue ("" when unknown).
        project_region: its region within the country ("" when unknown).
        methodology: its methodologies as one line ("ACM0002 — Grid-connected …").
        project_category: its category ("Renewable Energy").
        registry_serials: the registry's serial numbers of the retired credits, when known
            (each bounded by :data:`SERIAL_MAX_CHARS`; the first :data:`MAX_SERIALS` shown).
        issuer: who issues the certificate (the operator's name or its public host).
    """

    retirement_id: str
    chain_id: int
    chain_name: str
    transaction_hash: str
    retirement_index: int
    beneficiary_name: str
    beneficiary_address: str
    retiring_address: str
    retiring_name: str
    message: str
    amount_tonnes: str
    project_key: str
    project_name: str
    vintage: str
    registry: str
    timestamp: int
    verify_url: str
    view_url: str
    explorer_url: str
    project_country: str
    project_region: str
    methodology: str
    project_category: str
    registry_serials: tuple[str, ...]
    issuer: str


def clean_text(raw: str, max_chars: int) -> str:
    """Apply the module's text policy (steps 1 to 5) to one value.

    Args:
        raw: any string, hostile included.
        max_chars: the bound in characters (code points) of the result, "…" excluded.

    Returns:
        The cleaned value: at most ``max_chars`` characters plus "…" when it was cut;
        always encodable as UTF-8.
    """
    text = unicodedata.normalize("NFC", raw[: max_chars * _RAW_READ_FACTOR])
    kept: list[str] = []
    for ch in text:
        category = unicodedata.category(ch)
        if category == "Cc":
            if ch.isspace():
                kept.append(" ")
        elif category != "Cs" and ch not in _BIDI_CONTROLS:
            kept.append(ch)
    collapsed = " ".join("".join(kept).split())
    if len(collapsed) <= max_chars:
        return collapsed
    return collapsed[:max_chars].rstrip() + ELLIPSIS


def _flag(match: re.Match[str]) -> str:
    letters = "".join(chr(ord("A") + ord(ch) - _REGIONAL_A) for ch in match.groups())
    return f"[flag {letters}]"


def pdf_text(text: str, max_chars: int | None = None) -> str:
    """Map already cleaned text onto what the PDF's fonts can show (the module's PDF rule).

    Args:
        text: the output of :func:`clean_text`.
        max_chars: the field's bound (:data:`MAX_CHARS`); a result that the names made
            longer than it is cut there and ends with "…". ``None``: no cut.

    Returns:
        A string every character of which some font of :mod:`relayer.service.pdf_fonts`
        has: soft hyphens and invisible characters no font has dropped, a flag as
        "[flag XX]", any other missing character as "[its unicode name]" ("\ufffd" when it
        has no name).
    """
    out: list[str] = []
    for ch in _FLAG.sub(_flag, text):
        if ch == _SOFT_HYPHEN:
            continue
        if pdf_fonts.covered(ch):
            out.append(ch)
        elif unicodedata.category(ch) in _INVISIBLE_CATEGORIES or ord(ch) in _EMOJI_MODIFIERS:
            continue
        else:
            name = unicodedata.name(ch, "")
            out.append(f"[{name.lower()}]" if name else "\ufffd")
    shown = "".join(out)
    if max_chars is not None and len(shown) > max(len(text), max_chars + 1):
        return shown[:max_chars].rstrip() + ELLIPSIS
    return shown


def tonne_unit(amount: str) -> str:
    """ "tonne" when ``amount`` is exactly "1", else "tonnes" ("0.5", "1.5", "1.0", "0", "2",
    an empty or unreadable amount)."""
    return "tonne" if amount.strip() == "1" else "tonnes"


_WEEKDAYS: Final = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS: Final = (
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
)  # fmt: skip


def time_in_words(timestamp: int) -> str:
    """A unix time (seconds) in English words with its zone, e.g. ``Wednesday, 1 May 2024 at
    12:00:00 UTC`` (the same in every locale: the names are this module's, not strftime's).

    Outside 0 … 253402300799 (year 9999) the result is ``unix time <n> (out of range)``.
    """
    if not 0 <= timestamp <= _MAX_TIMESTAMP_S:
        return f"unix time {timestamp} (out of range)"
    t = datetime.fromtimestamp(timestamp, tz=UTC)
    return f"{_WEEKDAYS[t.weekday()]}, {t.day} {_MONTHS[t.month - 1]} {t.year} at {t:%H:%M:%S} UTC"


def utc_iso(timestamp: int) -> str:
    """A unix time (seconds) as ISO 8601 UTC, e.g. ``2024-05-01T12:00:00Z``.

    Outside 0 … 253402300799 (year 9999) the result is ``unix time <n> (out of range)``.
    """
    if not 0 <= timestamp <= _MAX_TIMESTAMP_S:
        return f"unix time {timestamp} (out of range)"
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class _Fields:
    """The view's fields after the text policy (still Unicode; "" where the view had none)."""

    retirement_id: str
    chain: str
    chain_name: str
    chain_id: str
    transaction_hash: str
    beneficiary_name: str
    beneficiary_address: str
    retiring_name: str
    retiring_address: str
    message: str
    amount_tonnes: str
    project_key: str
    project_name: str
    vintage: str
    registry: str
    time_utc: str
    time_words: str
    verify_url: str
    verify_is_link: bool
    view_url: str
    view_is_link: bool
    explorer_url: str
    explorer_is_link: bool
    project_country: str
    project_region: str
    methodology: str
    project_category: str
    registry_serials: tuple[str, ...]
    serials_left: int
    issuer: str


def _is_link(url: str) -> bool:
    """Whether a cleaned URL may be a link: ``http(s)://`` and not cut."""
    return url.startswith(("https://", "http://")) and ELLIPSIS not in url


def _fields(view: CertificateView) -> _Fields:
    def c(name: str) -> str:
        value = getattr(view, name)  # a caller's None shows as absent, not as "None"
        return clean_text("" if value is None else str(value), MAX_CHARS[name])

    chain_name = c("chain_name")
    chain_id = str(view.chain_id)[:_CHAIN_ID_MAX_DIGITS]
    verify_url, view_url, explorer_url = c("verify_url"), c("view_url"), c("explorer_url")
    raw_serials = tuple(view.registry_serials or ())
    serials = tuple(
        cleaned for raw in raw_serials[:MAX_SERIALS] if (cleaned := clean_text(str(raw), SERIAL_MAX_CHARS))
    )
    return _Fields(
        retirement_id=c("retirement_id"),
        chain=f"{chain_name} (chain id {chain_id})" if chain_name else f"chain id {chain_id}",
        chain_name=chain_name,
        chain_id=chain_id,
        transaction_hash=c("transaction_hash"),
        beneficiary_name=c("beneficiary_name"),
        beneficiary_address=c("beneficiary_address"),
        retiring_name=c("retiring_name"),
        retiring_address=c("retiring_address"),
        message=c("message"),
        amount_tonnes=c("amount_tonnes"),
        project_key=c("project_key"),
        project_name=c("project_name"),
        vintage=c("vintage"),
        registry=c("registry"),
        time_utc=utc_iso(view.timestamp),
        time_words=time_in_words(view.timestamp),
        verify_url=verify_url,
        verify_is_link=_is_link(verify_url),
        view_url=view_url,
        view_is_link=_is_link(view_url),
        explorer_url=explorer_url,
        explorer_is_link=_is_link(explorer_url),
        project_country=c("project_country"),
        project_region=c("project_region"),
        methodology=c("methodology"),
        project_category=c("project_category"),
        registry_serials=serials,
        serials_left=max(0, len(raw_serials) - MAX_SERIALS),
        issuer=c("issuer"),
    )


NOT_GIVEN: Final = "not given"
NOT_IN_CATALOGUE: Final = "not in the catalogue"
NO_MESSAGE: Final = "none"
SOURCES_NOTE: Final = (
    "Beneficiary, retiring address, amount, project key, vintage, registry and message come "
    "from the on-chain retirement event of the transaction above; the project name, country, "
    "methodology and category come from the project catalogue."
)


def _statement_rest(chain: str) -> str:
    return (
        f", the relayer that carried out and indexed this retirement on {chain}. The retired credits "
        "are burned on the chain and cannot be sold or retired again; anyone can check this "
        "certificate against the chain at the addresses above."
    )


def issuer_statement(issuer: str, chain: str) -> str:
    """The issuer's statement under each certificate (``issuer`` and ``chain`` as shown)."""
    return f"Issued by {issuer or NOT_GIVEN}{_statement_rest(chain)}"


def _place(country: str, region: str) -> str:
    """ "Region, Country", either alone, or "" when neither is known."""
    return ", ".join(p for p in (region, country) if p)


def _serials_text(f: _Fields) -> str:
    """The registry serial numbers shown, "" when none is known."""
    shown = ", ".join(f.registry_serials)
    if f.serials_left:
        shown += f" and {f.serials_left} more"
    return shown


def _qr(url: str) -> segno.QRCode | None:
    """The QR code of ``url`` (error correction M: 15 % of the code may be lost), None when
    ``url`` is not a link (an empty or cut value)."""
    return segno.make_qr(url, error="m", boost_error=False) if _is_link(url) else None


# --- HTML -----------------------------------------------------------------------------------

# The certificate embeds its fonts' subsets as data: URLs; it may be framed (an operator's own
# site showing it).
_CSP: Final = content_security_policy(fonts_inline=True, framed=True)

_CSS: Final = (
    BASE_CSS
    + """
main { padding: 2.25rem 2.75rem; border-top-width: 8px; }
.kicker { margin: 0; text-transform: uppercase; letter-spacing: .12em; font-size: .8rem;
  font-weight: 600; color: #2f6b4f; }
h1 { margin: .35rem 0 .25rem; font-size: 2.4rem; line-height: 1.15; }
h1 .unit { font-weight: 400; }
.for { margin: 0; font-size: 1.3rem; }
blockquote { margin: 1rem 0 0; padding: .25rem 0 .25rem 1rem; border-left: 4px solid #2f6b4f;
  color: #3b4641; font-size: 1.05rem; }
h2 { margin: 1.6rem 0 .6rem; padding-bottom: .3rem; border-bottom: 1px solid #dde3df;
  text-transform: uppercase; letter-spacing: .1em; font-size: .78rem; color: #2f6b4f; }
dl { display: grid; grid-template-columns: 12rem 1fr; gap: .45rem 1rem; margin: 0; }
dd, span, a, p { overflow-wrap: anywhere; }
code { font-size: .82rem; line-height: 1.4; }
.absent { font-style: italic; color: #6b756f; }
.verify { display: flex; gap: 1.5rem; align-items: flex-start; }
.verify .qr { flex: none; width: 9rem; }
.verify .qr svg { display: block; width: 100%; height: auto; }
.verify p { margin: 0 0 .5rem; }
footer { margin-top: 1.5rem; padding-top: .9rem; border-top: 1px solid #dde3df;
  font-size: .85rem; color: #4a5650; }
footer p { margin: 0 0 .4rem; }
@media (max-width: 36rem) { dl { grid-template-columns: 1fr; } .verify { flex-direction: column; } }
@media print { html { font-size: 10pt; } body { background: #fff; font-size: 1rem; }
  main { border: 0; border-top: 6px solid #2f6b4f; margin: 0; padding: .75rem 0 0; max-width: none; }
  a { color: inherit; } .verify, footer { break-inside: avoid; } }
@page { size: A4; margin: 16mm; }"""
)


def _font_faces(texts: list[str]) -> tuple[str, str]:
    """``@font-face`` rules embedding (as ``data:`` URLs) subsets of the fallback fonts that
    ``texts`` need (Hebrew, Arabic, CJK; :mod:`relayer.service.pdf_fonts`), so a reader
    without such fonts still sees those scripts; and the families to append to the CSS font
    stack. Latin, Greek and Cyrillic stay in the reader's own fonts. Empty when none is needed."""
    text = "".join(texts)
    faces: list[str] = []
    families: list[str] = []
    for font in pdf_fonts.fallbacks_for(texts):
        data, fmt = pdf_fonts.web_subset(font, text)
        mime = "font/otf" if fmt == "opentype" else "font/ttf"
        family = f"certificate-{font.family}"
        url = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
        faces.append(f'@font-face {{ font-family: "{family}"; src: url({url}) format("{fmt}"); }}')
        families.append(f'"{family}"')
    return "\n".join(faces), "".join(f", {f}" for f in families)


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _html_value(field: str, value: str, absent: str, *, tag: str = "span", user: bool = True) -> str:
    """One value in its ``data-field`` element; ``absent`` is shown (marked) when it is empty."""
    attrs = f' data-field="{field}"'
    if user:
        attrs += ' dir="auto"'
    if not value:
        return f'<{tag}{attrs} data-absent="true" class="absent">{_e(absent)}</{tag}>'
    return f"<{tag}{attrs}>{_e(value)}</{tag}>"


def _html_link(field: str, url: str, is_link: bool) -> str:
    """A URL as a link when it may be one (else as code, "not given" when empty)."""
    if is_link:
        return f'<a data-field="{field}" href="{_e(url)}" rel="nofollow noreferrer">{_e(url)}</a>'
    return _html_value(field, url, NOT_GIVEN, tag="code", user=False)


def _html_dl(rows: list[tuple[str, str]]) -> str:
    return (
        "<dl>\n" + "\n".join(f"<dt>{_e(label)}</dt>\n<dd>{value}</dd>" for label, value in rows) + "\n</dl>"
    )


def _html_project(f: _Fields) -> list[tuple[str, str]]:
    """The project section's rows: (label, HTML of its value)."""
    rows = [
        (
            "Project",
            '<span data-field="project">'
            + _html_value("project_key", f.project_key, NOT_GIVEN)
            + " — "
            + _html_value("project_name", f.project_name, NOT_IN_CATALOGUE)
            + "</span>",
        ),
        ("Location", _html_value("place", _place(f.project_country, f.project_region), NOT_GIVEN)),
        ("Methodology", _html_value("methodology", f.methodology, NOT_GIVEN)),
        ("Category", _html_value("project_category", f.project_category, NOT_GIVEN)),
        ("Vintage", _html_value("vintage", f.vintage, NOT_GIVEN)),
        ("Registry", _html_value("registry", f.registry, NOT_GIVEN)),
    ]
    if f.registry_serials:
        rows.append(("Registry serial numbers", _html_value("registry_serials", _serials_text(f), NOT_GIVEN)))
    return rows


def _html_retirement(f: _Fields) -> list[tuple[str, str]]:
    """The retirement section's rows: (label, HTML of its value)."""
    return [
        (
            "Retired on",
            f'<time data-field="timestamp" datetime="{_e(f.time_utc)}">{_e(f.time_words)}</time>',
        ),
        (
            "Beneficiary address",
            _html_value("beneficiary_address", f.beneficiary_address, NOT_GIVEN, tag="code", user=False),
        ),
        (
            "Retired by",
            _html_value("retiring_name", f.retiring_name, NOT_GIVEN)
            + "<br>"
            + _html_value("retiring_address", f.retiring_address, NOT_GIVEN, tag="code", user=False),
        ),
        (
            "Chain",
            '<span data-field="chain">'
            + _html_value("chain_name", f.chain_name, NOT_GIVEN)
            + f' (chain id <span data-field="chain_id">{_e(f.chain_id)}</span>)</span>',
        ),
        (
            "Transaction",
            _html_value("transaction_hash", f.transaction_hash, NOT_GIVEN, tag="code", user=False),
        ),
        ("Retirement id", _html_value("retirement_id", f.retirement_id, NOT_GIVEN, tag="code", user=False)),
    ]


def _html_verify(f: _Fields) -> str:
    """The verification block: the QR code of the page a person reads, its link, the JSON
    record and (on a public chain) the explorer's page of the transaction."""
    qr = _qr(f.view_url)
    code = ""
    if qr is not None:  # inline SVG: part of the page, not a load (the CSP forbids images)
        svg = qr.svg_inline(scale=4, border=4, dark="#1d2421", light="#fff", omitsize=True)
        label = "QR code of the verification page"
        code = f'<div class="qr" data-field="qr_code" role="img" aria-label="{label}">{svg}</div>'
    lines = [f"<p>Scan the code or open {_html_link('view_url', f.view_url, f.view_is_link)}</p>"]
    lines.append(
        f"<p>Machine-readable record: {_html_link('verify_url', f.verify_url, f.verify_is_link)}</p>"
    )
    if f.explorer_url:
        link = _html_link("explorer_url", f.explorer_url, f.explorer_is_link)
        lines.append(f"<p>The transaction on the block explorer: {link}</p>")
    return f'<section class="verify">{code}<div>{"".join(lines)}</div></section>'


@functools.lru_cache(maxsize=64)
def certificate_html(view: CertificateView) -> str:
    """The certificate as a standalone HTML5 page (UTF-8 text; inline CSS and an inline SVG
    QR code, no scripts, no network loads), laid out as a one-page A4 document when printed.

    Each value is in one element with a stable ``data-field`` attribute: ``amount_tonnes``,
    ``beneficiary_name``, ``message``, ``project`` (holding ``project_key`` and
    ``project_name``), ``place`` (region and country), ``methodology``,
    ``project_category``, ``vintage``, ``registry``, ``registry_serials`` (only when known),
    ``timestamp`` (the time in words; its ``datetime`` ISO 8601 UTC),
    ``beneficiary_address``, ``retiring_name``, ``retiring_address``, ``chain`` (holding
    ``chain_name`` and ``chain_id``), ``transaction_hash``, ``retirement_id``, ``qr_code``
    (the QR code of ``view_url``), ``view_url``, ``verify_url``, ``explorer_url`` (only on a
    public chain) and ``issuer``. An empty value shows "not given" / "not in the catalogue"
    / "none" with ``data-absent="true"``.

    Args:
        view: the retirement; strings are cleaned and bounded by the module's text policy
            (:data:`MAX_CHARS`), so the page is a few kilobytes, up to about 250 KB when
            every field is full of Chinese, Japanese or Korean (embedded font subsets).
            CPU: milliseconds for Latin text, about a second when the CJK font is read (the
            last 64 pages are kept in memory); call it off the event loop.

    Returns:
        The page as a ``str`` (encode as UTF-8; the page declares that charset).
    """
    f = _fields(view)
    amount = _html_value("amount_tonnes", f.amount_tonnes, NOT_GIVEN)
    beneficiary = _html_value("beneficiary_name", f.beneficiary_name, NOT_GIVEN, tag="strong")
    message = _html_value("message", f.message, NO_MESSAGE)
    strings = [getattr(f, n) for n in f.__slots__ if isinstance(getattr(f, n), str)]
    faces, families = _font_faces([*strings, *f.registry_serials])
    css = _CSS.replace("Arial, sans-serif;", f"Arial{families}, sans-serif;", 1)
    css = f"{faces}\n{css}" if faces else css
    issuer = _html_value("issuer", f.issuer, NOT_GIVEN)
    statement = f"Issued by {issuer}{_e(_statement_rest(f.chain))}"
    main = f"""<header>
<p class="kicker">Certificate of carbon retirement</p>
<h1>{amount} <span class="unit">{tonne_unit(f.amount_tonnes)} CO₂e retired</span></h1>
<p class="for">for the benefit of {beneficiary}</p>
<blockquote>{message}</blockquote>
</header>
<h2>Project</h2>
{_html_dl(_html_project(f))}
<h2>Retirement</h2>
{_html_dl(_html_retirement(f))}
<h2>Verify this certificate</h2>
{_html_verify(f)}
<footer>
<p>{statement}</p>
<p>{_e(SOURCES_NOTE)}</p>
</footer>"""
    return html_document(f"Carbon retirement certificate {_e(f.retirement_id)}", _CSP, css, main)


# --- PDF ------------------------------------------------------------------------------------

_MARGIN_MM: Final = 18.0
_LABEL_W_MM: Final = 40.0
_QR_MM: Final = 34.0
_MAX_SPREAD_MM: Final = 3.0  # the most space added below a body row to fill the page
_GREEN: Final = (47, 107, 79)
_GREY: Final = (74, 86, 80)
_RULE: Final = (221, 227, 223)
_BLACK: Final = (29, 36, 33)
# (font scale, wrapping) tried in turn until the page holds everything: word wrapping at full
# size fits anything but adversarial text; the last steps (smaller, broken anywhere) fit every
# view within MAX_CHARS (tests/unit/test_certificate_documents.py holds it to that).
_FIT_STEPS: Final = (
    (1.15, WrapMode.WORD),
    (1.0, WrapMode.WORD),
    (0.85, WrapMode.WORD),
    (0.72, WrapMode.CHAR),
    (0.6, WrapMode.CHAR),
)


class _Page:
    """Draws on one fpdf2 document at a font scale, with one wrapping rule for values."""

    def __init__(self, pdf: FPDF, scale: float, wrap: WrapMode, spread_mm: float = 0) -> None:
        self.pdf = pdf
        self.scale = scale
        self.wrap = wrap
        self.spread_mm = spread_mm  # added below each row and above each heading of the body
        self.gaps = 0  # rows and headings drawn: where a spread goes

    def font(self, size_pt: float, ink: tuple[int, int, int], *, bold: bool = False) -> None:
        """The main font at ``size_pt`` (times the scale) in colour ``ink``; ``bold`` draws
        the glyphs filled and stroked (faux bold: the fonts are used at their Regular)."""
        pdf = self.pdf
        pdf.set_font(pdf_fonts.MAIN.family, "", size_pt * self.scale)
        pdf.set_text_color(*ink)
        pdf.set_draw_color(*ink)
        pdf.text_mode = TextMode.FILL_STROKE if bold else TextMode.FILL
        pdf.set_line_width(pdf_fonts.BOLD_STROKE_MM * self.scale)

    def text(self, text: str, line_mm: float, *, width_mm: float = 0, link: str | None = None) -> None:
        """Wrapped text (full width, or ``width_mm`` from the current x), then the next line
        at the left margin."""
        self.pdf.multi_cell(
            width_mm,
            line_mm * self.scale,
            text,
            align=Align.L,
            link=link or "",
            wrapmode=self.wrap,
            new_x=XPos.LMARGIN,
            new_y=YPos.NEXT,
        )

    def heading(self, title: str) -> None:
        """A section's heading: small green capitals over a thin rule."""
        pdf = self.pdf
        pdf.ln(4.5 * self.scale + self.spread_mm)
        self.gaps += 1
        self.font(8.5, _GREEN, bold=True)
        self.text(title.upper(), 4.5)
        pdf.set_draw_color(*_RULE)
        pdf.set_line_width(0.3)
        pdf.line(pdf.l_margin, pdf.get_y() + 0.6, pdf.w - pdf.r_margin, pdf.get_y() + 0.6)
        pdf.ln(2.6 * self.scale)

    def row(self, label: str, value: str, *, mono: bool = False, absent: bool = False) -> None:
        """A label in the left column and its value wrapped in the right one (``mono``: a
        hex value, set smaller; ``absent``: the placeholder, in grey)."""
        pdf = self.pdf
        line_mm = 4.7 * self.scale
        pdf.set_x(pdf.l_margin)
        self.font(9, _GREY, bold=True)
        pdf.cell(_LABEL_W_MM, line_mm, label)
        self.font(8.5 if mono else 9.8, _GREY if absent else _BLACK)
        pdf.multi_cell(
            pdf.epw - _LABEL_W_MM,
            line_mm,
            value,
            align=Align.L,
            wrapmode=self.wrap,
            new_x=XPos.LMARGIN,
            new_y=YPos.NEXT,
        )
        pdf.ln(1.3 * self.scale + self.spread_mm)
        self.gaps += 1

    def qr(self, code: segno.QRCode, x: float, y: float, size_mm: float) -> None:
        """``code`` as filled squares (one rectangle per run of dark modules in a row), its
        quiet zone of 4 modules inside ``size_mm``."""
        pdf = self.pdf
        rows = code.matrix
        module = size_mm / (len(rows) + 8)
        pdf.set_fill_color(*_BLACK)
        for r, row in enumerate(rows):
            c = 0
            while c < len(row):
                if not row[c]:
                    c += 1
                    continue
                start = c
                while c < len(row) and row[c]:
                    c += 1
                pdf.rect(
                    x + (start + 4) * module, y + (r + 4) * module, (c - start) * module, module, style="F"
                )


@dataclass(frozen=True, slots=True)
class _PdfFields:
    """The PDF's strings, each through :func:`pdf_text` ("" where the view had none)."""

    retirement_id: str
    chain: str
    transaction_hash: str
    beneficiary_name: str
    beneficiary_address: str
    retiring_name: str
    retiring_address: str
    message: str
    amount_tonnes: str
    project_key: str
    project_name: str
    vintage: str
    registry: str
    verify_url: str
    view_url: str
    explorer_url: str
    project_country: str
    project_region: str
    methodology: str
    project_category: str
    issuer: str
    serials: str

    @classmethod
    def of(cls, f: _Fields) -> _PdfFields:
        def p(name: str) -> str:
            return pdf_text(getattr(f, name), MAX_CHARS[name])

        chain_name = p("chain_name")
        return cls(
            retirement_id=p("retirement_id"),
            chain=f"{chain_name} (chain id {f.chain_id})" if chain_name else f"chain id {f.chain_id}",
            serials=pdf_text(_serials_text(f)),
            **{name: p(name) for name in _PDF_PLAIN_FIELDS},
        )


_PDF_PLAIN_FIELDS: Final = tuple(
    f.name for f in dataclasses.fields(_PdfFields) if f.name not in ("retirement_id", "chain", "serials")
)
"""The PDF's fields that are the view's field of the same name through :func:`pdf_text`."""


def _new_document(texts: list[str], created: datetime) -> FPDF:
    """An empty A4 document with the fonts ``texts`` need and no page yet."""
    pdf = FPDF(orientation="portrait", unit="mm", format="A4")
    pdf.set_margins(_MARGIN_MM, _MARGIN_MM, _MARGIN_MM)
    pdf.set_auto_page_break(auto=True, margin=_MARGIN_MM)
    pdf.set_creation_date(created)
    fallbacks = pdf_fonts.fallbacks_for(texts)
    for font in (pdf_fonts.MAIN, *fallbacks):
        pdf.add_font(font.family, "", font.path, collection_font_number=font.face)
        pdf_fonts.drop_variations(pdf.fonts[font.family])
    if fallbacks:
        pdf.set_fallback_fonts([font.family for font in fallbacks])
    if any(font.rtl for font in fallbacks):
        pdf.set_text_shaping(True)
    return pdf


@dataclass(frozen=True, slots=True)
class _Drawn:
    """A drawn certificate: the document, whether it fits on one page, the space left below
    it (mm), the body's rows and headings (where that space may be spread) and the foot's
    height (mm)."""

    pdf: FPDF
    fits: bool
    free_mm: float
    gaps: int
    foot_mm: float


def _draw(
    f: _Fields,
    created: datetime,
    scale: float,
    wrap: WrapMode,
    spread_mm: float = 0,
    foot_top: float | None = None,
) -> _Drawn:
    """The whole certificate on a fresh document: ``spread_mm`` more below each body row and
    above each heading, then the foot (the verification block and the issuer's statement) at
    ``foot_top`` mm from the page's top (None: right below the body)."""
    v = _PdfFields.of(f)
    unit = tonne_unit(v.amount_tonnes)
    title = f"Carbon retirement certificate {v.retirement_id}"
    subject = f"Retirement of {v.amount_tonnes or '?'} {unit} CO₂e of {v.project_key or '?'} {v.vintage}"
    statement = pdf_text(issuer_statement(v.issuer, v.chain))
    pdf = _new_document([title, subject, statement, *(getattr(v, n) for n in v.__slots__)], created)
    pdf.set_title(title)
    pdf.set_subject(subject.rstrip())
    pdf.set_author(v.issuer or "relayer")
    pdf.set_creator("relayer")
    pdf.set_lang("en")
    pdf.add_page()
    page = _Page(pdf, scale, wrap, spread_mm)
    _draw_body(page, v, f)
    gaps = page.gaps
    page.spread_mm = 0  # the foot keeps its spacing
    foot = pdf.get_y() + 2 * scale if foot_top is None else foot_top
    pdf.set_y(foot)
    _draw_foot(page, v, f, statement)
    end = pdf.get_y()
    return _Drawn(pdf, pdf.page_no() == 1, pdf.h - _MARGIN_MM - end, gaps, end - foot)


def _draw_body(page: _Page, v: _PdfFields, f: _Fields) -> None:
    """The headline (amount, beneficiary, message), the project and the retirement."""
    pdf, scale = page.pdf, page.scale
    pdf.set_fill_color(*_GREEN)
    pdf.rect(0, 0, pdf.w, 7, style="F")
    pdf.set_y(_MARGIN_MM)
    page.font(9, _GREEN, bold=True)
    page.text("CERTIFICATE OF CARBON RETIREMENT", 5)
    pdf.ln(2.5 * scale)
    page.font(26, _BLACK, bold=True)
    page.text(f"{v.amount_tonnes or NOT_GIVEN} {tonne_unit(v.amount_tonnes)} CO₂e retired", 11)
    pdf.ln(1.5 * scale)
    page.font(13, _BLACK)
    page.text(f"for the benefit of {v.beneficiary_name or NOT_GIVEN}", 6.2)
    pdf.ln(4 * scale)
    top = pdf.get_y()
    pdf.set_x(pdf.l_margin + 5)
    page.font(10.5, _GREY)
    page.text(f"Message: {v.message or NO_MESSAGE}", 5.2, width_mm=pdf.epw - 5)
    pdf.set_draw_color(*_GREEN)
    pdf.set_line_width(1.1)
    pdf.line(pdf.l_margin + 0.6, top, pdf.l_margin + 0.6, pdf.get_y())
    page.heading("Project")
    page.row("Project", f"{v.project_key or NOT_GIVEN} — {v.project_name or NOT_IN_CATALOGUE}")
    place = _place(v.project_country, v.project_region)
    page.row("Location", place or NOT_GIVEN, absent=not place)
    page.row("Methodology", v.methodology or NOT_GIVEN, absent=not v.methodology)
    page.row("Category", v.project_category or NOT_GIVEN, absent=not v.project_category)
    page.row("Vintage", v.vintage or NOT_GIVEN)
    page.row("Registry", v.registry or NOT_GIVEN)
    if v.serials:
        page.row("Registry serial numbers", v.serials)
    page.heading("Retirement")
    page.row("Retired on", f"{f.time_words} ({f.time_utc})")
    page.row("Beneficiary address", v.beneficiary_address or NOT_GIVEN, mono=True)
    page.row("Retired by", v.retiring_name or NOT_GIVEN, absent=not v.retiring_name)
    page.row("Retiring address", v.retiring_address or NOT_GIVEN, mono=True)
    page.row("Chain", v.chain)
    page.row("Transaction", v.transaction_hash or NOT_GIVEN, mono=True)
    page.row("Retirement id", v.retirement_id or NOT_GIVEN, mono=True)


def _draw_foot(page: _Page, v: _PdfFields, f: _Fields, statement: str) -> None:
    """From the current line: the verification block (the links; the QR code of the view
    URL at the right) and the issuer's statement with the sources."""
    pdf, scale = page.pdf, page.scale
    page.heading("Verify this certificate")
    qr_top, qr_size = pdf.get_y(), _QR_MM * scale
    qr_x = pdf.w - pdf.r_margin - qr_size
    code = _qr(f.view_url)
    if code is not None:
        page.qr(code, qr_x, qr_top, qr_size)
    column = pdf.epw - qr_size - 6
    for label, url, is_link, show in (
        ("Scan the code or open", v.view_url, f.view_is_link, True),
        ("Machine-readable record", v.verify_url, f.verify_is_link, True),
        ("The transaction on the block explorer", v.explorer_url, f.explorer_is_link, bool(v.explorer_url)),
    ):
        if not show:
            continue
        page.font(8, _GREY, bold=True)
        page.text(label, 4, width_mm=column)
        page.font(8, _BLACK)
        page.text(url or NOT_GIVEN, 3.9, width_mm=column, link=url if is_link else None)
        pdf.ln(1.6 * scale)
    pdf.set_y(max(pdf.get_y(), qr_top + qr_size) + 2 * scale)
    pdf.set_draw_color(*_RULE)
    pdf.set_line_width(0.3)
    pdf.line(pdf.l_margin, pdf.get_y(), pdf.w - pdf.r_margin, pdf.get_y())
    pdf.ln(2.5 * scale)
    page.font(8, _GREY)
    page.text(statement, 4)
    pdf.ln(1 * scale)
    page.text(SOURCES_NOTE, 4)


@functools.lru_cache(maxsize=64)
def certificate_pdf(view: CertificateView) -> bytes:
    """The certificate as a one-page A4 PDF (fpdf2), its fonts embedded as subsets: the
    amount and beneficiary as the headline, the message, the project (catalogue name,
    location, methodology, category, vintage, registry, serial numbers when known), the
    retirement (time in words and ISO 8601 UTC, addresses, chain, transaction, id), and at
    the page's foot the verification block (a QR code of ``view_url``, the links, the
    explorer's page on a public chain only) and the issuer's statement.

    Shows the same values as :func:`certificate_html` under the module's PDF text rule
    (:func:`pdf_text`; fonts: :mod:`relayer.service.pdf_fonts`). Metadata: title "Carbon
    retirement certificate <retirement id>", subject naming the amount and project, author
    the issuer, creation date the retirement's block time (the Unix epoch when that is out of
    range), so the output is a pure function of ``view`` (the last 64 are kept in memory).
    Text that would run into the foot or past the page (only adversarial text near the bounds
    does) is drawn again smaller, then broken anywhere rather than at spaces.

    CPU cost: about 0.2 s for Latin, Greek or Cyrillic text; 0.3 s with Hebrew or Arabic;
    about 1.2 s when the text has Chinese, Japanese or Korean (the CJK font is read). Call it
    off the event loop.

    Args:
        view: the retirement; strings are bounded by :data:`MAX_CHARS`, which keeps even the
            worst case on one page.

    Returns:
        The PDF file's bytes (about 15 KB Latin, 18 to 30 KB with other scripts).
    """
    f = _fields(view)
    in_range = 0 <= view.timestamp <= _MAX_TIMESTAMP_S
    created = datetime.fromtimestamp(view.timestamp, tz=UTC) if in_range else _EPOCH
    for scale, wrap in _FIT_STEPS:
        drawn = _draw(f, created, scale, wrap)
        if drawn.fits or scale == _FIT_STEPS[-1][0]:
            break
        _close_fonts(drawn.pdf)
    if drawn.fits:  # fill the page: the foot at its end, the space left between the body's rows
        spread = min(_MAX_SPREAD_MM, max(0.0, drawn.free_mm - 1) / max(1, drawn.gaps))
        foot_top = drawn.pdf.h - _MARGIN_MM - drawn.foot_mm - 0.5
        _close_fonts(drawn.pdf)
        drawn = _draw(f, created, scale, wrap, spread, foot_top)
    try:
        return bytes(drawn.pdf.output())
    finally:
        _close_fonts(drawn.pdf)


def _close_fonts(pdf: FPDF) -> None:
    """Close the font files fpdf2 opened (it reads them lazily and never closes them)."""
    for font in pdf.fonts.values():
        if isinstance(font, TTFFont):
            font.ttfont.close()
