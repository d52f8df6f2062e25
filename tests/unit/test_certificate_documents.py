"""The certificate renderers (relayer/service/documents.py): every field in both documents,
the PDF's determinism and one page, the text policy (control characters, bidi controls,
bounds), the PDF's scripts, embedded fonts and replacement names, singular and plural, and
hostile input that must neither raise nor get through the HTML's escaping."""

from __future__ import annotations

import dataclasses
import io
import re
from datetime import UTC, datetime

import pytest
from pypdf import PdfReader

from relayer.service.documents import (
    MAX_CHARS,
    MAX_SERIALS,
    NO_MESSAGE,
    NOT_GIVEN,
    NOT_IN_CATALOGUE,
    SERIAL_MAX_CHARS,
    CertificateView,
    certificate_html,
    certificate_pdf,
    clean_text,
    pdf_text,
    time_in_words,
    tonne_unit,
    utc_iso,
)
from tests.browser import read_dom
from tests.helpers.certificates import EXPECTED_FIELDS, HOSTILE_IMG, RID, TIMESTAMP, TX, view

# What Windows-1252 has beyond Latin-1 (ellipsis, euro, trade mark, S and z caron, per mille,
# bullet, curly double and single quotes, en and em dash): the PDF keeps them.
WINDOWS_1252_EXTRAS = "\u2026 \u20ac \u2122 \u0160 \u017e \u2030 \u2022 \u201c\u201d\u2018\u2019 \u2013\u2014"


def pdf_pages(data: bytes) -> list[str]:
    return [page.extract_text() for page in PdfReader(io.BytesIO(data)).pages]


def one_line(text: str) -> str:
    """The PDF's text with its line breaks (where values wrap) taken out."""
    return "".join(text.split("\n"))


# --- the PDF ---------------------------------------------------------------------------------


def words(text: str) -> str:
    """The PDF's text with its line breaks (where values wrap) read as spaces."""
    return " ".join(text.split())


def test_pdf_shows_every_field() -> None:
    (text,) = pdf_pages(certificate_pdf(view()))
    shown = words(text)
    for expected in (
        "for the benefit of Alice Müller",
        "Message: Offsetting our 2024 flights",
        "Beneficiary address 0x5B38Da6a701c568545dCfcB03FcB875f56beddC4",
        "1.5 tonnes CO₂e retired",
        "Project VCS-10 — Kariba REDD+",
        "Location Mashonaland West, Zimbabwe",
        "Methodology VM0009 — Methodology for Avoided Ecosystem Conversion",
        "Category Forestry",
        "Vintage 2019",
        "Registry VCS",
        f"Transaction {TX}",
        f"Retirement id {RID}",
        "Chain Base Sepolia (chain id 84532)",
        "Retired by Acme Travel",
        "Retiring address 0xAb8483F64d9C6d1EcF9b849Ae677dD3315835cb2",
        "Retired on Wednesday, 1 May 2024 at 12:00:00 UTC (2024-05-01T12:00:00Z)",
        "Issued by Carbon Relay Ltd, the relayer that carried out and indexed this retirement on Base",
        "on-chain retirement event",
        "project catalogue",
        "The transaction on the block explorer",
    ):
        assert expected in shown, expected
    flat = one_line(text)
    for url in (
        f"http://127.0.0.1:8402/retirements/{RID}",
        f"http://127.0.0.1:8402/retirements/{RID}/certificate?format=html",
        f"https://sepolia.basescan.org/tx/{TX}",
    ):
        assert url in flat, url
    assert "Registry serial numbers" not in shown  # none known: no row


def test_pdf_shows_registry_serials_when_known_and_sums_up_the_rest() -> None:
    serials = tuple(f"VCS-10-2019-{n:04d}" for n in range(MAX_SERIALS + 2))
    shown = words(pdf_pages(certificate_pdf(view(registry_serials=serials)))[0])
    assert "Registry serial numbers " + ", ".join(serials[:MAX_SERIALS]) + " and 2 more" in shown
    dom = read_dom(certificate_html(view(registry_serials=serials[:2])))
    assert dom.text("registry_serials") == "VCS-10-2019-0000, VCS-10-2019-0001"


def test_no_explorer_link_off_the_public_chain() -> None:
    local = view(explorer_url="")
    assert "block explorer" not in words(pdf_pages(certificate_pdf(local))[0])
    page = certificate_html(local)
    assert "explorer_url" not in read_dom(page).fields and "basescan" not in page


@pytest.mark.parametrize(
    ("ts", "spoken"),
    [
        (0, "Thursday, 1 January 1970 at 00:00:00 UTC"),
        (TIMESTAMP, "Wednesday, 1 May 2024 at 12:00:00 UTC"),
        (951_825_599, "Tuesday, 29 February 2000 at 11:59:59 UTC"),
        (253_402_300_799, "Friday, 31 December 9999 at 23:59:59 UTC"),
        (253_402_300_800, "unix time 253402300800 (out of range)"),
        (-1, "unix time -1 (out of range)"),
    ],
)
def test_time_in_words(ts: int, spoken: str) -> None:
    assert time_in_words(ts) == spoken


def test_pdf_is_one_a4_page_with_metadata_from_the_view() -> None:
    reader = PdfReader(io.BytesIO(certificate_pdf(view())))
    assert len(reader.pages) == 1
    box = reader.pages[0].mediabox
    assert (round(float(box.width)), round(float(box.height))) == (595, 842)  # A4 in points
    meta = reader.metadata
    assert meta is not None
    assert meta.title == f"Carbon retirement certificate {RID}"
    assert meta.subject == "Retirement of 1.5 tonnes CO₂e of VCS-10 2019"
    assert meta.creation_date == datetime.fromtimestamp(TIMESTAMP, tz=UTC)


def test_pdf_is_deterministic() -> None:
    first = certificate_pdf(view())
    assert certificate_pdf(view()) == first
    assert certificate_pdf(dataclasses.replace(view())) == first
    # ... and a function of the view: another block time is another document.
    assert certificate_pdf(view(timestamp=TIMESTAMP + 1)) != first


def test_pdf_says_what_is_absent() -> None:
    (text,) = pdf_pages(
        certificate_pdf(view(beneficiary_name="", retiring_name="", message="", project_name=""))
    )
    assert f"for the benefit of {NOT_GIVEN}" in text
    assert f"Retired by {NOT_GIVEN}" in text
    assert f"Message: {NO_MESSAGE}" in text
    assert NOT_IN_CATALOGUE in text


MULTI_SCRIPT = "Café Zürich — 北京 Ёж Ελλάδα 東京 서울"
HEBREW = "שלום"
ARABIC = "مرحبا"


def pdf_text_of(data: bytes) -> str:
    """The page's text as pypdf reads it; pypdf puts a NUL before each code of the CJK font's
    two-byte CMap (poppler's pdftotext reads the same file without them), so NULs go."""
    (text,) = pdf_pages(data)
    return text.replace("\x00", "")


def test_pdf_shows_every_script_with_embedded_fonts() -> None:
    name = MULTI_SCRIPT + " 🌳"
    data = certificate_pdf(view(beneficiary_name=name, message=f"{HEBREW} {ARABIC} ok"))
    text = pdf_text_of(data)
    assert f"for the benefit of {MULTI_SCRIPT} [deciduous tree]" in words(text)
    # right-to-left words are stored in visual order; each word is whole and shaped
    for word in (HEBREW[::-1], HEBREW):
        if word in text:
            break
    else:
        raise AssertionError(f"no Hebrew in {text!r}")
    assert "?" not in text.replace("/certificate?format=html", "")  # no glyph replaced by "?"
    # every font is embedded (TrueType subsets, the CJK one as CFF); no core (unembedded) font
    assert data.count(b"/FontFile2") == 3  # Noto Sans, Heebo, Noto Sans Arabic
    assert data.count(b"/FontFile3") == 1  # Noto Sans CJK
    assert b"/Helvetica" not in data and b"/Courier" not in data
    assert len(data) < 40_000


def test_pdf_latin_embeds_only_the_main_font() -> None:
    data = certificate_pdf(view())
    assert data.count(b"/FontFile2") == 1
    assert b"NotoSans" in data and b"NotoSansCJK" not in data
    assert len(data) < 20_000  # about 15.5 KB: the subset, the text and the QR code's squares


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain ASCII", "plain ASCII"),
        ("Ünïcödé àçcénts ÿ", "Ünïcödé àçcénts ÿ"),
        (WINDOWS_1252_EXTRAS, WINDOWS_1252_EXTRAS),
        ("Привет Ελλάδα Tiếng Việt", "Привет Ελλάδα Tiếng Việt"),
        ("日本語 中文 한국어", "日本語 中文 한국어"),
        (f"{HEBREW} {ARABIC}", f"{HEBREW} {ARABIC}"),
        ("😀", "[grinning face]"),
        ("🌳", "[deciduous tree]"),
        ("❤️", "[heavy black heart]"),  # U+2764 + variation selector 16 (dropped)
        ("👍🏽", "[thumbs up sign]"),  # the skin tone modifier goes
        ("👨\u200d👩\u200d👧", "[man]\u200d[woman]\u200d[girl]"),  # the joiners are kept (invisible)
        ("🇩🇪🇫🇷", "[flag DE][flag FR]"),
        ("\U000f0000", "\ufffd"),  # private use: no name
        ("x\u0301\u20dd", "x\u0301\u20dd"),  # combining acute and enclosing circle: Noto has them
        ("CO\u2082 \u2212 1 \u2010 2 \u2011 3", "CO\u2082 \u2212 1 \u2010 2 \u2011 3"),
        ("soft\u00adhyphen", "softhyphen"),
    ],
)
def test_pdf_text_rule(raw: str, shown: str) -> None:
    assert pdf_text(clean_text(raw, 100)) == shown


def test_pdf_text_names_are_cut_at_the_bound() -> None:
    assert pdf_text("🌳" * 10, 20) == "[deciduous tree][dec…"


@pytest.mark.parametrize(
    ("amount", "unit"),
    [
        ("1", "tonne"),
        ("2", "tonnes"),
        ("0", "tonnes"),
        ("0.5", "tonnes"),
        ("1.5", "tonnes"),
        ("1.0", "tonnes"),  # a decimal takes the plural, as in "1.0 tonnes"
        ("0.001", "tonnes"),
        ("11", "tonnes"),
        ("21", "tonnes"),
        ("1000000", "tonnes"),
        ("", "tonnes"),
    ],
)
def test_tonne_unit(amount: str, unit: str) -> None:
    assert tonne_unit(amount) == unit


@pytest.mark.parametrize(
    ("amount", "heading"), [("1", "1 tonne CO₂e"), ("0.5", "0.5 tonnes CO₂e"), ("2", "2 tonnes CO₂e")]
)
def test_both_documents_agree_on_the_unit(amount: str, heading: str) -> None:
    data = certificate_pdf(view(amount_tonnes=amount))
    assert f"{heading} retired" in pdf_text_of(data)
    reader = PdfReader(io.BytesIO(data))
    assert reader.metadata is not None and reader.metadata.subject is not None
    assert reader.metadata.subject.startswith(f"Retirement of {heading} of")
    page = certificate_html(view(amount_tonnes=amount))
    unit = heading.split(" ", 1)[1]
    assert f'<span class="unit">{unit} retired</span>' in page


def test_pdf_wraps_long_unbroken_text_and_keeps_to_one_page() -> None:
    data = certificate_pdf(view(message="x" * 10_000, beneficiary_name="B" * 10_000))
    (text,) = pdf_pages(data)
    flat = one_line(text)
    assert "x" * MAX_CHARS["message"] + "…" in flat
    assert "x" * (MAX_CHARS["message"] + 1) not in flat
    assert "B" * MAX_CHARS["beneficiary_name"] + "…" in flat


@pytest.mark.parametrize("word_len", [1, 7, 13, 22, 30, 45, 70, 200])
@pytest.mark.parametrize("letter", ["@", "W", "m", "😀"])
def test_pdf_fits_one_page_with_every_field_at_its_bound(word_len: int, letter: str) -> None:
    """The widest letters (and the longest emoji name), in words that waste the most of each line."""
    word = letter * word_len + " "
    filled = {name: word * (bound // len(word) + 2) for name, bound in MAX_CHARS.items()}
    serials = (word * (SERIAL_MAX_CHARS // len(word) + 2),) * (MAX_SERIALS + 5)
    data = certificate_pdf(view(chain_id=10**40, registry_serials=serials, **filled))
    assert len(PdfReader(io.BytesIO(data)).pages) == 1


@pytest.mark.parametrize("word_len", [1, 22, 200])
@pytest.mark.parametrize("letter", ["北", "ש"])
def test_pdf_fits_one_page_in_cjk_and_hebrew_at_every_bound(word_len: int, letter: str) -> None:
    """Full-width CJK and right-to-left text (about 1.2 s of CPU each: the CJK font is read)."""
    test_pdf_fits_one_page_with_every_field_at_its_bound(word_len, letter)


def test_pdf_timestamp_out_of_range_does_not_raise() -> None:
    for ts in (-1, 10**12, 2**70):
        reader = PdfReader(io.BytesIO(certificate_pdf(view(timestamp=ts))))
        assert f"unix time {ts} (out of range)" in reader.pages[0].extract_text()
        assert reader.metadata is not None
        assert reader.metadata.creation_date == datetime(1970, 1, 1, tzinfo=UTC)


# --- the HTML --------------------------------------------------------------------------------


def test_html_shows_every_field_once() -> None:
    page = certificate_html(view())
    dom = read_dom(page)
    for name, expected in EXPECTED_FIELDS.items():
        assert dom.text(name) == expected, name
    assert set(dom.fields) == set(EXPECTED_FIELDS)
    assert f"<title>Carbon retirement certificate {RID}</title>" in page
    assert "on-chain retirement event" in page
    assert "project catalogue" in page
    assert dom.field_attrs["timestamp"][0]["datetime"] == "2024-05-01T12:00:00Z"
    for link in ("verify_url", "view_url", "explorer_url"):
        assert dom.field_attrs[link][0]["href"] == EXPECTED_FIELDS[link], link
    assert "<svg" in page and 'aria-label="QR code of the verification page"' in page


def test_html_is_standalone() -> None:
    """No scripts, nothing loaded: no src attributes, no stylesheets, no CSS url()/@import,
    and a CSP that would refuse them anyway. The http URLs are the three links' (href and
    text); the QR code is an inline SVG (part of the page, not a load)."""
    page = certificate_html(view())
    dom = read_dom(page)
    assert page.startswith("<!DOCTYPE html>")
    assert "script" not in dom.tags
    loading = {"img", "link", "iframe", "object", "embed", "video", "audio", "source", "base"}
    assert not loading & set(dom.tags)
    lowered = page.lower()
    for banned in ("<script", " src=", "url(", "@import", "@font-face", "javascript:"):
        assert banned not in lowered, banned
    assert lowered.count("http://") == 4  # href and text of the verify and view links
    assert lowered.count("https://") == 2  # the explorer link
    assert "default-src 'none'" in page


def test_html_embeds_the_fonts_of_scripts_a_reader_may_lack() -> None:
    page = certificate_html(view(beneficiary_name=MULTI_SCRIPT, message=f"{HEBREW} {ARABIC}"))
    faces = re.findall(r'@font-face \{ font-family: "([^"]+)"; src: url\(data:font/(ttf|otf);base64,', page)
    assert faces == [
        ("certificate-heebo", "ttf"),
        ("certificate-noto-arabic", "ttf"),
        ("certificate-noto-cjk", "otf"),
    ]
    assert '"certificate-heebo", "certificate-noto-arabic", "certificate-noto-cjk", sans-serif;' in page
    assert "font-src data:;" in page
    assert len(page) < 150_000  # about 110 KB: the three subsets, base64-encoded
    assert read_dom(page).text("beneficiary_name") == MULTI_SCRIPT
    assert "@font-face" not in certificate_html(view())  # Latin: the reader's fonts


def test_html_says_what_is_absent() -> None:
    dom = read_dom(certificate_html(view(beneficiary_name="", retiring_name="", message="", project_name="")))
    assert dom.text("beneficiary_name") == NOT_GIVEN
    assert dom.text("retiring_name") == NOT_GIVEN
    assert dom.text("message") == NO_MESSAGE
    assert dom.text("project_name") == NOT_IN_CATALOGUE
    for name in ("beneficiary_name", "retiring_name", "message", "project_name"):
        assert dom.field_attrs[name][0]["data-absent"] == "true"
    # A name that says "not given" is a name: not marked absent.
    dom = read_dom(certificate_html(view(beneficiary_name=NOT_GIVEN)))
    assert "data-absent" not in dom.field_attrs["beneficiary_name"][0]


def test_html_escapes_markup_in_every_user_field() -> None:
    hostile = f'{HOSTILE_IMG}<script>alert("x")</script>" onmouseover="alert(2)'
    page = certificate_html(
        view(
            beneficiary_name=hostile,
            retiring_name=hostile,
            message=hostile,
            project_name=hostile,
            project_key=hostile,
            registry=hostile,
            vintage=hostile,
            chain_name=hostile,
        )
    )
    dom = read_dom(page)
    assert "<script" not in page.lower()
    assert "<img" not in page.lower()
    assert "img" not in dom.tags and "script" not in dom.tags
    attributes = [attrs for found in dom.field_attrs.values() for attrs in found]
    assert not any("onmouseover" in attrs or "onerror" in attrs for attrs in attributes)
    for name in ("beneficiary_name", "retiring_name", "message", "project_name", "registry", "chain_name"):
        assert dom.text(name) == clean_text(hostile, MAX_CHARS[name]), name
    assert dom.text("beneficiary_name") == hostile


def test_html_verify_url_is_a_link_only_when_http() -> None:
    dom = read_dom(certificate_html(view(verify_url="javascript:alert(1)")))
    assert "href" not in dom.field_attrs["verify_url"][0]
    assert dom.text("verify_url") == "javascript:alert(1)"
    dom = read_dom(certificate_html(view(view_url="javascript:alert(1)", explorer_url="data:x")))
    assert "qr_code" not in dom.fields  # no QR code of what is not a link
    assert "href" not in dom.field_attrs["view_url"][0] and "href" not in dom.field_attrs["explorer_url"][0]
    dom = read_dom(certificate_html(view(verify_url='https://x.test/"><script>')))
    assert dom.field_attrs["verify_url"][0]["href"] == 'https://x.test/"><script>'


HOSTILE_INPUTS = [
    pytest.param("😀🌍🔥", id="emoji"),
    pytest.param("中文名字 日本語 한국어", id="cjk"),
    pytest.param("\u202eevil\u202c مرحبا שלום \u2067x\u2069", id="rtl-and-bidi-controls"),
    pytest.param("<script>alert(1)</script>", id="script"),
    pytest.param(HOSTILE_IMG, id="img-onerror"),
    pytest.param("a\x00b\x01c\x1bd\x7fe\x85f\x9fg", id="nul-and-controls"),
    pytest.param("\ud800\udfff lone surrogates", id="surrogates"),
    pytest.param("m" * 10_000, id="10k-no-spaces"),
    pytest.param("word " * 2_000, id="10k-words"),
    pytest.param("\n" * 10_000 + "x", id="10k-newlines"),
    pytest.param("", id="empty"),
    pytest.param(" \t\r\n\u3000 ", id="only-whitespace"),
    pytest.param("e" + "\u0301" * 5_000, id="combining-flood"),
    pytest.param("\ufeff\ufffe\uffff\U0010ffff", id="noncharacters"),
]


@pytest.mark.parametrize("raw", HOSTILE_INPUTS)
def test_hostile_text_in_every_string_field(raw: str) -> None:
    hostile = view(**dict.fromkeys(MAX_CHARS, raw))
    page = certificate_html(hostile)
    encoded = page.encode("utf-8")  # no lone surrogate survives
    assert b"\x00" not in encoded
    assert "<script" not in page.lower() and "<img" not in page.lower()
    assert not any(c in page for c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
    assert len(encoded) < 64_000
    dom = read_dom(page)
    assert "script" not in dom.tags and "img" not in dom.tags
    for name in ("beneficiary_name", "message", "retiring_name"):
        assert len(dom.text(name)) <= MAX_CHARS[name] + 1
    data = certificate_pdf(hostile)
    assert len(PdfReader(io.BytesIO(data)).pages) == 1
    assert certificate_pdf(hostile) == data


def test_hostile_bidi_is_removed_and_user_text_is_isolated() -> None:
    dom = read_dom(certificate_html(view(beneficiary_name="\u202eevil\u202c name")))
    assert dom.text("beneficiary_name") == "evil name"
    assert dom.field_attrs["beneficiary_name"][0]["dir"] == "auto"


# --- the text policy -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "cleaned"),
    [
        ("  Alice \t\n Müller  ", "Alice Müller"),
        ("a\x00b\x07c", "abc"),
        ("line\x0bbreak\x1cand\x85next", "line break and next"),  # whitespace controls: spaces
        ("e\u0301", "é"),  # NFC
        ("\u202eabc\u202c\u2066d\u2069", "abcd"),
        ("\ud83dx", "x"),  # a lone surrogate
        ("\u200d\u200e\u200f", "\u200d\u200e\u200f"),  # ZWJ and the direction marks stay
        ("", ""),
    ],
)
def test_clean_text(raw: str, cleaned: str) -> None:
    assert clean_text(raw, 50) == cleaned


def test_clean_text_bounds() -> None:
    assert clean_text("x" * 10, 10) == "x" * 10
    assert clean_text("x" * 11, 10) == "x" * 10 + "…"
    assert clean_text("abcd efgh", 5) == "abcd…"  # no space before the ellipsis
    # Only 16 times the bound is read: whatever follows a flood of controls is not seen.
    assert clean_text("\x00" * 160 + "late", 10) == ""
    assert clean_text("\x00" * 150 + "late", 10) == "late"


def test_every_string_field_has_a_bound() -> None:
    strings = {f.name for f in dataclasses.fields(CertificateView) if f.type == "str"}
    assert set(MAX_CHARS) == strings
    assert MAX_CHARS["message"] == 500
    assert (MAX_SERIALS, SERIAL_MAX_CHARS) == (5, 40)


@pytest.mark.parametrize(
    ("ts", "iso"),
    [
        (0, "1970-01-01T00:00:00Z"),
        (TIMESTAMP, "2024-05-01T12:00:00Z"),
        (253_402_300_799, "9999-12-31T23:59:59Z"),
        (253_402_300_800, "unix time 253402300800 (out of range)"),
        (-5, "unix time -5 (out of range)"),
    ],
)
def test_utc_iso(ts: int, iso: str) -> None:
    assert utc_iso(ts) == iso
