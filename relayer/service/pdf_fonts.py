"""The fonts the PDF certificate embeds, from pinned PyPI packages that ship them unmodified
with their licence (SIL Open Font License 1.1 each; see the packages' ``LICENSE`` files):

================  ==============================  ===============================================
family id         package                         scripts
================  ==============================  ===============================================
``noto-sans``     ``fontpkg-noto-sans``           Latin, Greek, Cyrillic, Vietnamese, symbols
``heebo``         ``fontpkg-heebo``               Hebrew
``noto-arabic``   ``fontpkg-noto-sans-arabic``    Arabic (shaped by HarfBuzz through uharfbuzz)
``noto-cjk``      ``noto-cjk-sans-otc``           Chinese, Japanese, Korean (the SC face)
================  ==============================  ===============================================

The first is always embedded; a fallback only when the text needs it (Noto Sans CJK is a 19 MB
collection: reading it costs about a second of CPU, so a Latin certificate never opens it).
fpdf2 embeds each as a subset (the glyphs used), so a certificate is tens of kilobytes.
The variable fonts are used at their default instance (Regular); bold is drawn as fill plus
stroke (:data:`BOLD_STROKE_MM`) because instancing a variable font takes seconds.

Which characters each font has is read from its ``cmap`` once per process (cached).
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Final

from fontTools import subset as ftsubset
from fontTools.ttLib import TTFont
from fpdf.fonts import CoreFont, TTFFont


@dataclass(frozen=True, slots=True)
class PdfFont:
    """One font file: ``family`` is the id given to fpdf2, ``face`` the index in a
    collection (``.ttc``), ``rtl`` whether its script needs shaping and bidi ordering."""

    family: str
    path: Path
    face: int = 0
    rtl: bool = False


def _packaged(package: str, *parts: str) -> Path:
    return Path(str(files(package).joinpath(*parts)))


MAIN: Final = PdfFont("noto-sans", _packaged("fontpkg_noto_sans", "files", "NotoSans[wdth,wght].ttf"))
FALLBACKS: Final = (
    PdfFont("heebo", _packaged("fontpkg_heebo", "files", "Heebo[wght].ttf"), rtl=True),
    PdfFont(
        "noto-arabic",
        _packaged("fontpkg_noto_sans_arabic", "files", "NotoSansArabic[wdth,wght].ttf"),
        rtl=True,
    ),
    # faces: 0 JP, 1 KR, 2 SC, 3 TC, 4 HK (every face has Han, kana and Hangul)
    PdfFont("noto-cjk", _packaged("noto_cjk_sans_otc", "NotoSansCJK-Regular.ttc"), face=2),
)
BOLD_STROKE_MM: Final = 0.18
"""Stroke width (mm) of the faux bold (text drawn filled and stroked in its own colour)."""


@functools.cache
def coverage(font: PdfFont) -> frozenset[int]:
    """The code points ``font`` maps to a glyph (its best ``cmap``), read once per process.

    Raises:
        OSError: the font file is missing (the package is not installed).
    """
    tt = TTFont(font.path, fontNumber=font.face, lazy=True)
    try:
        return frozenset(tt.getBestCmap())
    finally:
        tt.close()


def covered(ch: str) -> bool:
    """Whether one of the fonts (main first, then each fallback) has a glyph for ``ch``."""
    cp = ord(ch)
    return cp in coverage(MAIN) or any(cp in coverage(f) for f in FALLBACKS)


def fallbacks_for(texts: Iterable[str]) -> list[PdfFont]:
    """The fallback fonts that ``texts`` need (in :data:`FALLBACKS` order): those with a
    glyph for some character the main font lacks."""
    missing = {ord(ch) for text in texts for ch in text} - coverage(MAIN)
    needed: list[PdfFont] = []
    for font in FALLBACKS:
        if not missing:
            break
        found = missing & coverage(font)
        if found:
            needed.append(font)
            missing -= found
    return needed


_VARIATION_TABLES: Final = ("fvar", "gvar", "avar", "HVAR", "MVAR", "VVAR", "STAT", "cvar")
# The glyph-level variation data only: the axes (fvar) stay, as the layout tables may refer to them.
_GLYPH_VARIATION_TABLES: Final = ("gvar", "HVAR", "MVAR", "VVAR", "cvar")


def drop_variations(font: TTFFont | CoreFont) -> None:
    """Make a variable font that fpdf2 has loaded a static one at its default instance
    (Regular): remove its variation tables, which the embedded subset would otherwise carry
    (about half its bytes) and which a PDF viewer never reads. Its ``glyf`` outlines already
    are the default instance's. A core font or a static font is left as it is."""
    if isinstance(font, TTFFont):
        for tag in _VARIATION_TABLES:
            if tag in font.ttfont:
                del font.ttfont[tag]


def web_subset(font: PdfFont, text: str) -> tuple[bytes, str]:
    """``font`` cut down to the characters of ``text`` it has (layout tables kept, so a
    browser still shapes Arabic), for an HTML page's ``@font-face``.

    Returns:
        ``(font file bytes, format)``: format ``"truetype"`` (``glyf`` outlines) or
        ``"opentype"`` (CFF, the CJK font).
    """
    tt = TTFont(font.path, fontNumber=font.face)
    try:
        for tag in _GLYPH_VARIATION_TABLES:  # the Regular outlines stay; a third of the bytes go
            if tag in tt:
                del tt[tag]
        options = ftsubset.Options(notdef_outline=True)  # default layout features (Arabic joining included)
        subsetter = ftsubset.Subsetter(options)
        subsetter.populate(unicodes={ord(ch) for ch in text} & coverage(font))
        subsetter.subset(tt)
        out = io.BytesIO()
        tt.save(out)
        return out.getvalue(), "opentype" if "CFF " in tt else "truetype"
    finally:
        tt.close()
