"""Property-based bad input over HTTP against the real daemon (issue: "a property-based test
sends at least 5,000 generated bad requests and finds no 5xx"; spec: Request envelope,
Rules, Errors).

Hypothesis builds each request by mutating a VALID one (discover; quote by carbonClass
"NBO" amount "1"; prepare/retire; prepare-auth; certificate of a seeded retirement; an
``actions/retire`` body from a real 402 challenge, signed by a real payer as the demo does,
for USDC and for kVCM) so that it becomes invalid — a required field dropped, an unknown key
at the top level or inside ``details``/``authPayload``, wrong JSON types, bad amounts,
addresses, hashes, salts and signatures (high-s twins, wrong length, bad ``v``), a signed
field rebound — and sends it by each route (``GET /api/{action}?…``, ``POST /api`` with
``action``, ``POST /api/{action}``); other families send bodies that are not one JSON
object (malformed text, form fields, arrays, invalid UTF-8, deep nesting, bodies over the
daemon's limit) and hostile query strings.

Every answer must be a 4xx with the spec's envelope ``{error, message,
x402FacilitatorVersion: 2}`` whose ``error`` is a registered code the action may answer,
with the registry's status; and after the whole run nothing was recorded (``relay_jobs``,
``spent_salts``, ``relay_transactions``) or broadcast (the executor's pending nonce).

The daemon serves in pytest-asyncio's session loop; hypothesis runs in a worker thread with
a blocking ``requests`` session. A failure is shrunk by hypothesis and kept with its exact
request; its family then runs again with that failure known (counted, not raised) so that
it can find others, and the test fails at the end listing every failure. ``-s`` prints the
counts, the codes per family and the status histogram.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import urllib.parse
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import pytest
import requests
from eth_account import Account
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from relayer.admin import create_api_key
from relayer.domain.eip712 import SECP256K1_N
from relayer.domain.errors import COMMON_CODES, REGISTRY, X402_REGISTRY, allowed_codes
from relayer.domain.schemas import ACTIONS, ActionRequest, AuthPayload, Details
from tests.conftest import Daemon
from tests.helpers.facilitator import JSON_VALUES as ANY_JSON
from tests.helpers.facilitator import fresh_address, mutate, payment
from tests.helpers.relay import challenge, sign, signed_request

pytestmark = pytest.mark.integration

# ---------------------------------------------------------------------------- the request model

TOP_KEYS: Final = frozenset(f.alias or n for n, f in ActionRequest.model_fields.items())
DETAIL_KEYS: Final = frozenset(f.alias or n for n, f in Details.model_fields.items())
AUTH_KEYS: Final = frozenset(f.alias or n for n, f in AuthPayload.model_fields.items())
KNOWN_KEYS: Final = TOP_KEYS | DETAIL_KEYS | AUTH_KEYS

# The kind of every field (what a bad value of it looks like).
TOP_KINDS: Final = {
    "chainId": "uint",
    "inputToken": "token",
    "amount": "amount",
    "carbonClass": "text64",
    "creditToken": "address",
    "tokenId": "uint",
    "credit": "text80",
    "vintage": "vintage",
    "listingId": "uint",
    "from": "address",
    "txHash": "bytes32",
    "index": "int32",
    "salt": "bytes32",
    "gasAllowance": "atomic",
    "source": "source",
    "project": "text80",
    "country": "text80",
    "category": "text80",
    "methodology": "text80",
    "maxUsdcPricePerTonne": "usdc",
}
DETAIL_KINDS: Final = {
    "retiringAddress": "address",
    "beneficiaryAddress": "address",
    "beneficiaryIsPayer": "bool",
    "beneficiaryString": "text200",
    "retiringEntityString": "text200",
    "retirementMessage": "text1000",
    "beneficiaryLocation": "text200",
    "consumptionCountryCode": "country",
    "consumptionPeriodStart": "date",
    "consumptionPeriodEnd": "date",
}
AUTH_KINDS: Final = {
    "from": "address",
    "to": "address",
    "value": "atomic",
    "validAfter": "atomic",
    "validBefore": "atomic",
    "nonce": "text80",
    "signature": "signature",
    "v": "v",
    "r": "bytes32",
    "s": "bytes32",
}
assert set(TOP_KINDS) | {"action", "authPayload", "details"} == TOP_KEYS
assert set(DETAIL_KINDS) == DETAIL_KEYS
assert set(AUTH_KINDS) == AUTH_KEYS

# Fields whose absence (or null) makes the action's request invalid. Nothing else is dropped:
# an absent inputToken, chainId, creditToken, tokenId or validAfter takes a default that may
# be exactly what was signed, and an absent authPayload is the 402 challenge, not bad input.
REQUIRED: Final = {
    "discover": (),
    "quote": ("amount", "carbonClass"),
    "prepare/retire": ("amount", "carbonClass", "from"),
    "prepare-auth": ("amount", "carbonClass", "from", "details", "details.beneficiaryIsPayer"),
    "certificate": ("txHash",),
    "actions/retire": (
        "amount",
        "carbonClass",
        "from",
        "salt",
        "gasAllowance",
        "details",
        "details.beneficiaryIsPayer",
        "authPayload.from",
        "authPayload.to",
        "authPayload.value",
        "authPayload.validBefore",
        "authPayload.nonce",
        "authPayload.signature",
    ),
}
PRICED: Final = frozenset({"quote", "prepare/retire", "prepare-auth", "actions/retire"})
RETIRE: Final = "actions/retire"

N: Final = SECP256K1_N
HEX: Final = "0123456789abcdef"
# RTL mark, RTL override, zero-width space, BOM, no-break space, fullwidth 1, Arabic-Indic 1,
# superscript 2, newline: oddities that must never pass a hex, decimal or address pattern
ODD: Final = ("\u200f", "\u202e", "\u200b", "\ufeff", "\u00a0", "\uff11", "\u0661", "\u00b2", "\n")

# ---------------------------------------------------------------------------- bad values


@dataclass(frozen=True)
class Bad:
    """A bad value; ``post_only`` when a query string cannot carry it (a JSON type other
    than a string, or a lone surrogate), since a query parameter is always a string."""

    value: Any
    post_only: bool = False


def _s(values: Any) -> st.SearchStrategy[Bad]:
    return st.sampled_from(list(values)).map(Bad)


def _odd_in(template: st.SearchStrategy[str]) -> st.SearchStrategy[Bad]:
    """A character a pattern can never accept, inserted anywhere (or NUL)."""

    @st.composite
    def build(draw: st.DrawFn) -> Bad:
        text = draw(template)
        i = draw(st.integers(0, len(text)))
        ch = draw(st.sampled_from((*ODD, "\x00", " ", "+", "-", "_", ",")))
        return Bad(text[:i] + ch + text[i:])

    return build()


def _surrogate_in(template: st.SearchStrategy[str]) -> st.SearchStrategy[Bad]:
    """A lone surrogate inside a string (sent as a JSON ``\\udXXX`` escape)."""

    @st.composite
    def build(draw: st.DrawFn) -> Bad:
        text = draw(template)
        i = draw(st.integers(0, len(text)))
        sur = chr(draw(st.integers(0xD800, 0xDFFF)))
        return Bad(text[:i] + sur + text[i:], post_only=True)

    return build()


JSON_SCALARS: Final = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
JSON_VALUES: Final = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


def _not_a_string() -> st.SearchStrategy[Bad]:
    """A JSON value of the wrong type for a string field (never null: null is "absent")."""
    return st.one_of(
        st.booleans(),
        st.integers(-(2**300), 2**300),
        st.floats(allow_nan=True, allow_infinity=True),
        st.lists(JSON_SCALARS, max_size=3),
        st.dictionaries(st.text(max_size=4), JSON_SCALARS, max_size=3),
    ).map(lambda v: Bad(v, post_only=True))


def _not_a_number() -> st.SearchStrategy[Bad]:
    """A JSON value of the wrong type for an integer field (lax pydantic takes digit strings,
    integral floats and booleans as integers: none of those here)."""
    return st.one_of(
        st.lists(JSON_SCALARS, min_size=0, max_size=3).map(lambda v: Bad(v, post_only=True)),
        st.dictionaries(st.text(max_size=4), JSON_SCALARS, max_size=3).map(lambda v: Bad(v, post_only=True)),
        st.floats(allow_nan=True, allow_infinity=True)
        .filter(lambda f: f != f or f in (float("inf"), float("-inf")) or f != int(f))
        .map(lambda v: Bad(v, post_only=True)),
        st.text(alphabet="abcxyzXYZ!?#", min_size=1, max_size=6).map(Bad),
    )


def _hex(min_size: int, max_size: int) -> st.SearchStrategy[str]:
    return st.text(alphabet=HEX, min_size=min_size, max_size=max_size)


class BadValues:
    """Strategies of bad values per field kind that the strict request model refuses for
    every action (``amount-format``: only for the actions that price ``amount``). Values
    that are well-formed but wrong for an action are :func:`op_service`'s."""

    def __init__(self, addresses: list[str]) -> None:
        self.addresses = addresses
        address = st.sampled_from(addresses)
        bad_checksum = st.builds(_flip_case, address, st.integers(0, 39)).filter(
            lambda a: a is not None and a not in addresses
        )
        self._schema: dict[str, tuple[list[st.SearchStrategy[Bad]], list[st.SearchStrategy[Bad]]]] = {}
        hex40 = _hex(40, 40).map(lambda h: "0x" + h)
        hex64 = _hex(64, 64).map(lambda h: "0x" + h)
        self._schema["address"] = (
            [
                bad_checksum.map(Bad),
                _hex(0, 39).map(lambda h: Bad("0x" + h)),
                _hex(41, 66).map(lambda h: Bad("0x" + h)),
                st.builds(_replace_char, address, st.integers(2, 41), st.sampled_from("gGxXzZ-. ")).map(Bad),
                address.map(lambda a: Bad(a[2:])),
                address.map(lambda a: Bad("0X" + a[2:])),
                _s(["0x" + "0" * 40, "0X" + "0" * 40, "", "0x", "0x0"]),
                _odd_in(address),
            ],
            [_not_a_string(), _surrogate_in(hex40)],
        )
        bytes32 = [
            _hex(0, 63).map(lambda h: Bad("0x" + h)),
            _hex(65, 80).map(lambda h: Bad("0x" + h)),
            st.builds(_replace_char, hex64, st.integers(2, 65), st.sampled_from("gGxXzZ-. ")).map(Bad),
            _hex(64, 64).map(Bad),
            _hex(64, 64).map(lambda h: Bad("0X" + h)),
            _odd_in(hex64),
        ]
        self._schema["bytes32"] = (bytes32, [_not_a_string(), _surrogate_in(hex64)])
        digits = st.integers(0, 2**256 - 1).map(str)
        self._schema["atomic"] = (
            [
                st.integers(1, 2**300).map(lambda n: Bad(f"-{n}")),
                st.integers(2**256, 2**270).map(lambda n: Bad(str(n))),
                st.integers(0, 10**6).map(lambda n: Bad(f"0{n}")),
                st.tuples(st.integers(0, 10**9), st.integers(0, 10**6)).map(lambda t: Bad(f"{t[0]}.{t[1]}")),
                st.tuples(st.integers(1, 9), st.integers(0, 99)).map(lambda t: Bad(f"{t[0]}e{t[1]}")),
                _s(["", "0x10", "+1", "1,000", "NaN", "Infinity", "1" * 79]),
                _odd_in(digits),
            ],
            [
                st.integers(-(2**300), 2**300).map(lambda n: Bad(n, post_only=True)),
                _not_a_string(),
                _surrogate_in(digits),
            ],
        )
        amount = st.sampled_from(["1", "0.5", "12.345", "1.5"])
        # `amount` is text to the model (at most 40 characters, storable); its decimal form
        # is checked by the actions that price it (quote, prepare/retire, prepare-auth,
        # actions/retire), for which "amount-format" values are bad too
        self._schema["amount"] = (
            [
                st.integers(41, 120).map(lambda n: Bad("1." + "0" * (n - 2))),  # over max_length
                st.builds(lambda t, i: Bad(t[:i] + "\x00" + t[i:]), amount, st.integers(0, 6)),
            ],
            [_not_a_string(), _surrogate_in(amount)],
        )
        self._schema["amount-format"] = (
            [
                st.integers(1, 10**9).map(lambda n: Bad(f"-{n // 1000}.{n % 1000:03d}")),
                st.tuples(st.integers(1, 99), st.integers(-30, 30)).map(lambda t: Bad(f"{t[0]}e{t[1]}")),
                st.integers(10**12, 10**30).map(lambda n: Bad(str(n))),  # 13+ digits
                st.integers(10**18, 10**25).map(lambda n: Bad(f"1.{n}")),  # 19+ decimals
                st.integers(41, 120).map(lambda n: Bad("1." + "0" * (n - 2))),  # over max_length
                _s(["", "-0", "+1", ".5", "1.", "1,5", "01", "0x1", "NaN", "Infinity", "1 000", "1/2", "½"]),
                _odd_in(amount),
            ],
            [],
        )
        uint = [
            st.integers(1, 2**300).map(lambda n: Bad(f"-{n}")),
            st.integers(2**256, 2**300).map(lambda n: Bad(str(n))),
            st.tuples(st.integers(0, 10**6), st.integers(1, 9)).map(lambda t: Bad(f"{t[0]}.{t[1]}")),
            _s(["", "0x10", "1e3", "one", "\u0661\u0662", "\uff11"]),
        ]
        self._schema["uint"] = (
            uint,
            [
                st.integers(-(2**300), -1).map(lambda n: Bad(n, post_only=True)),
                st.integers(2**256, 2**300).map(lambda n: Bad(n, post_only=True)),
                _not_a_number(),
            ],
        )
        self._schema["int32"] = (
            [
                st.integers(1, 2**80).map(lambda n: Bad(f"-{n}")),
                st.integers(2**31, 2**300).map(lambda n: Bad(str(n))),
                _s(["", "x", "1.5", "0x1"]),
            ],
            [st.integers(2**31, 2**80).map(lambda n: Bad(n, post_only=True)), _not_a_number()],
        )
        self._schema["vintage"] = (
            [
                st.integers(-(10**6), 1899).map(lambda n: Bad(str(n))),
                st.integers(2201, 10**9).map(lambda n: Bad(str(n))),
                _s(["", "twenty", "2020.5", "MMXX"]),
            ],
            [st.integers(2201, 2**64).map(lambda n: Bad(n, post_only=True)), _not_a_number()],
        )
        self._schema["bool"] = (
            [_s(["maybe", "2", "-1", "", "truee", "0.5", "null", "yes please", "\u200ftrue"])],
            [
                st.integers(2, 2**70).map(lambda n: Bad(n, post_only=True)),
                st.floats(0.01, 0.99).map(lambda f: Bad(f, post_only=True)),
                st.lists(JSON_SCALARS, max_size=2).map(lambda v: Bad(v, post_only=True)),
                st.dictionaries(st.text(max_size=3), JSON_SCALARS, max_size=2).map(
                    lambda v: Bad(v, post_only=True)
                ),
            ],
        )
        for kind, limit in (("text64", 64), ("text80", 80), ("text200", 200), ("text1000", 1000)):
            base = st.text(alphabet="abcNBO ", max_size=10)
            self._schema[kind] = (
                [
                    st.integers(limit + 1, limit + 300).map(lambda n: Bad("x" * n)),
                    st.builds(lambda t, i: Bad(t[:i] + "\x00" + t[i:]), base, st.integers(0, 10)),
                ],
                [_not_a_string(), _surrogate_in(base)],
            )
        token = st.sampled_from(["USDC", "kVCM"])
        self._schema["token"] = (
            [
                st.integers(65, 200).map(lambda n: Bad("U" * n)),
                bad_checksum.map(Bad),
                st.builds(lambda t, i: Bad(t[:i] + "\x00" + t[i:]), token, st.integers(0, 4)),
            ],
            [_not_a_string(), _surrogate_in(token)],
        )
        self._schema["source"] = (
            [
                _s(
                    [
                        "",
                        "all",
                        "CarbonClass",
                        "listings",
                        "carbonClass ",
                        "carbon\u200fClass",
                        "marketplace\x00",
                    ]
                )
            ],
            [_not_a_string()],
        )
        self._schema["usdc"] = (
            [
                st.integers(1, 10**12).map(lambda n: Bad(f"-{n}")),
                st.integers(10**6, 10**9).map(lambda n: Bad(f"1.{n}")),  # 7+ decimals
                st.integers(10**12, 10**20).map(lambda n: Bad(str(n))),  # 13+ digits
                _s(["", "1e3", "01", "0x1", ".5", "1.", "\uff11", "1,5"]),
            ],
            [_not_a_string()],
        )
        self._schema["country"] = (
            [_s(["us", "USA", "U", "1A", "", "\u00dcS", "U\u200fS", "U\x00"])],
            [_not_a_string()],
        )
        self._schema["date"] = (
            [
                _s(
                    [
                        "2024-13-01",
                        "2024-00-10",
                        "2024-1-1",
                        "24-01-01",
                        "2024-01-32",
                        "2024/01/01",
                        "",
                        "2024-01-01T00:00:00Z",
                        "2024-01-01\n",
                        "\u0662024-01-01",
                    ]
                )
            ],
            [_not_a_string()],
        )
        sig = _hex(130, 130).map(lambda h: "0x" + h)
        self._schema["signature"] = (
            [
                _hex(0, 129).map(lambda h: Bad("0x" + h)),
                _hex(131, 160).map(lambda h: Bad("0x" + h)),
                st.builds(_replace_char, sig, st.integers(2, 131), st.sampled_from("gGxXzZ-. ")).map(Bad),
                _hex(130, 130).map(Bad),
                _odd_in(sig),
            ],
            [_not_a_string(), _surrogate_in(sig)],
        )
        self._schema["v"] = (
            [st.integers(0, 300).map(lambda n: Bad(str(n)))],  # StrictInt: never a string
            [
                st.integers(29, 2**80).map(lambda n: Bad(n, post_only=True)),
                st.integers(-(2**80), -1).map(lambda n: Bad(n, post_only=True)),
                st.sampled_from([27.0, 28.0, True, False, [27], {"v": 27}]).map(
                    lambda v: Bad(v, post_only=True)
                ),
            ],
        )

    def schema(self, kind: str, get: bool) -> st.SearchStrategy[Bad]:
        query_safe, post_only = self._schema[kind]
        return st.one_of(*query_safe) if get else st.one_of(*query_safe, *post_only)


def _flip_case(address: str, i: int) -> str | None:
    """``address`` with the case of its first letter at or after ``i`` swapped: a mixed-case
    address whose EIP-55 checksum is wrong (None when it would not be mixed case)."""
    body = address[2:]
    letters = [j for j, c in enumerate(body) if c.isalpha()]
    if not letters:
        return None
    j = next((j for j in letters if j >= i), letters[0])
    flipped = body[:j] + body[j].swapcase() + body[j + 1 :]
    if flipped.lower() == flipped or flipped.upper() == flipped:
        return None
    return "0x" + flipped


def _replace_char(text: str, i: int, ch: str) -> str:
    i = min(i, len(text) - 1)
    return text[:i] + ch + text[i + 1 :]


# ---------------------------------------------------------------------------- requests and checks


@dataclass
class Sent:
    """One request as sent: enough to replay it by hand."""

    family: str
    action: str | None  # the action whose codes apply (None: only the common codes)
    method: str
    path: str  # with the query string
    body: bytes | None = None
    content_type: str | None = None
    chunked: bool = False
    note: str = ""

    def describe(self) -> str:
        body = ""
        if self.body is not None:
            shown = self.body[:1500]
            more = f" … ({len(self.body)} bytes in all)" if len(self.body) > 1500 else ""
            chunked = " (chunked)" if self.chunked else ""
            body = f"\n  content-type: {self.content_type}{chunked}\n  body: {shown!r}{more}"
        path = self.path if len(self.path) <= 1500 else f"{self.path[:1500]} … ({len(self.path)} chars)"
        return f"{self.method} {path}{body}{f'  [{self.note}]' if self.note else ''}"


@dataclass
class Context:
    base_url: str
    session: requests.Session
    bases: dict[str, dict[str, Any]]
    retire_bodies: list[tuple[str, dict[str, Any], bool]]  # (what, body, valid)
    addresses: list[str]
    other_payer: str
    classes: list[str]
    missing_listing: int
    max_body: int
    bad: BadValues
    token_addresses: frozenset[str]
    sent: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    known: Counter[tuple[str, ...]] = field(default_factory=Counter)
    family_codes: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    families: dict[str, tuple[int, float]] = field(default_factory=dict)

    def send(self, req: Sent) -> None:
        """Send ``req`` and check the answer: a 4xx with the spec's envelope and a code the
        action may answer, with the registry's status. Raises AssertionError otherwise."""
        data: bytes | Iterator[bytes] | None = req.body
        headers = {}
        if req.content_type is not None:
            headers["content-type"] = req.content_type
        if req.chunked and req.body is not None:
            raw = req.body
            data = (raw[i : i + 16384] for i in range(0, len(raw), 16384))
        self.sent += 1
        try:
            resp = self.session.request(
                req.method, self.base_url + req.path, data=data, headers=headers, timeout=60
            )
        except requests.RequestException as exc:
            self.statuses[-1] += 1
            self._fail((req.family, "no HTTP answer", type(exc).__name__), f"no HTTP answer ({exc!r})", req)
            return
        self.statuses[resp.status_code] += 1
        problem = _problem(req, resp)
        if problem is None:
            self.codes[resp.json()["error"]] += 1
            self.family_codes[req.family][resp.json()["error"]] += 1
            return
        try:
            body = resp.json()
            code, cause = (body.get("error"), body.get("cause")) if isinstance(body, dict) else (None, None)
        except ValueError:
            code = cause = None
        self._fail(
            (req.family, problem, str(code), str(cause)),
            f"{problem}\n  answer: HTTP {resp.status_code} x-request-id={resp.headers.get('x-request-id')} "
            f"content-type={resp.headers.get('content-type')}\n  {resp.text[:1000]}",
            req,
        )

    def _fail(self, signature: tuple[str, ...], text: str, req: Sent) -> None:
        """A failure seen before (same family, problem, code and cause) is only counted, so
        that the family goes on looking for others; a new one is raised for hypothesis to
        shrink."""
        if signature in self.known:
            self.known[signature] += 1
            return
        raise BadAnswer(f"{text}\n  request: {req.describe()}", signature)


class BadAnswer(AssertionError):
    def __init__(self, text: str, signature: tuple[str, ...]) -> None:
        super().__init__(text)
        self.signature = signature


def _problem(req: Sent, resp: requests.Response) -> str | None:
    status = resp.status_code
    if not 400 <= status < 500:
        return f"HTTP {status}: not a 4xx"
    try:
        body = resp.json()
    except ValueError:
        return "the body is not JSON (not the spec's error envelope)"
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    missing = {"error", "message", "x402FacilitatorVersion"} - set(body)
    if missing:
        return f"the envelope lacks {sorted(missing)}"
    code = body["error"]
    if body["x402FacilitatorVersion"] != 2 or type(body["x402FacilitatorVersion"]) is not int:
        return "x402FacilitatorVersion is not the number 2"
    if not isinstance(body["message"], str):
        return "message is not a string"
    if code not in X402_REGISTRY:
        return f"error {code!r} is not a registered x402 code"
    if REGISTRY[code].http_status != status:
        return f"error {code!r} answered HTTP {status}, the registry says {REGISTRY[code].http_status}"
    allowed = allowed_codes(req.action) if req.action in ACTIONS else COMMON_CODES
    if code not in allowed:
        return f"error {code!r} is not one {req.action or 'an unknown action'} may answer"
    if status == 402 and req.action != RETIRE:
        return "402 outside actions/retire"
    return None


def _post(family: str, action: str | None, path: str, obj: Any, note: str = "") -> Sent:
    return Sent(
        family,
        action,
        "POST",
        path,
        json.dumps(obj, ensure_ascii=True).encode(),
        "application/json",
        note=note,
    )


def _query_pairs(body: dict[str, Any]) -> list[tuple[str, str]]:
    """A request body as query parameters (``details.x``, ``authPayload.x``)."""
    pairs: list[tuple[str, str]] = []
    for key, value in body.items():
        if key in ("details", "authPayload") and isinstance(value, dict):
            pairs += [(f"{key}.{k}", _query_value(v)) for k, v in value.items()]
        else:
            pairs.append((key, _query_value(value)))
    return pairs


def _query_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def _qs(pairs: list[tuple[str, str]]) -> str:
    return "&".join(
        f"{urllib.parse.quote(k, safe='.', errors='surrogatepass')}="
        f"{urllib.parse.quote(v, safe='', errors='surrogatepass')}"
        for k, v in pairs
    )


# ---------------------------------------------------------------------------- mutations

SAME: Final = object()
MISSING: Final = object()


@dataclass
class Draft:
    """A request being made bad: the body (without ``action``), the route and the
    ``action`` selector (SAME: the honest one; MISSING; or a bad value)."""

    action: str
    route: str  # "get" | "post_api" | "post_action"
    body: dict[str, Any]
    original: dict[str, Any]  # the valid request it was made from
    selector: Any = SAME
    steps: list[str] = field(default_factory=list)

    @property
    def get(self) -> bool:
        return self.route == "get"

    def sent(self, family: str) -> Sent:
        note = "; ".join(self.steps)
        codes_of = self.action if self.selector is SAME else None
        if self.route == "get":
            path = f"/api/{self.action}?{_qs(_query_pairs(self.body))}"
            return Sent(family, codes_of, "GET", path, note=note)
        if self.route == "post_api":
            selector = (
                {}
                if self.selector is MISSING
                else {"action": self.action if self.selector is SAME else self.selector}
            )
            return _post(family, codes_of, "/api", {**selector, **self.body}, note)
        extra = {} if self.selector in (SAME, MISSING) else {"action": self.selector}
        return _post(family, codes_of, f"/api/{self.action}", {**self.body, **extra}, note)


def _sub(body: dict[str, Any], name: str) -> dict[str, Any]:
    """The ``details``/``authPayload`` object of ``body``, made an object when it is not."""
    if not isinstance(body.get(name), dict):
        body[name] = {}
    sub: dict[str, Any] = body[name]
    return sub


def op_drop(data: st.DataObject, ctx: Context, d: Draft) -> None:
    path = data.draw(st.sampled_from(REQUIRED[d.action]), label="drop")
    null = not d.get and data.draw(st.booleans(), label="as null")
    head, _, tail = path.partition(".")
    target = d.body if not tail else d.body.get(head)
    if not isinstance(target, dict):
        return  # its parent is already bad
    key = tail or head
    if null:
        target[key] = None
    else:
        target.pop(key, None)
    d.steps.append(f"{'null' if null else 'drop'} {path}")


def _unknown_key(data: st.DataObject, get: bool) -> str:
    # no "." in a query key (it would name a nested field), never "action"
    alphabet = st.characters(codec="utf-8", exclude_characters="." if get else "")
    return data.draw(
        st.one_of(
            st.text(alphabet=alphabet, max_size=24),
            st.sampled_from(
                ["from_", "Amount", "AMOUNT", "beneficiary", "signature", "typedData", "__proto__"]
            ),
        ).filter(lambda k: k not in KNOWN_KEYS and k != "action" and not (get and "." in k)),
        label="unknown key",
    )


def op_unknown_key(data: st.DataObject, ctx: Context, d: Draft) -> None:
    where = data.draw(st.sampled_from(["top", "details", "authPayload"]), label="unknown key in")
    key = _unknown_key(data, d.get)
    value: Any = data.draw(st.text(max_size=12) if d.get else JSON_VALUES, label="its value")
    target = d.body if where == "top" else _sub(d.body, where)
    target[key] = value
    d.steps.append(f"unknown key {key!r} in {where}")


def op_bad_field(data: st.DataObject, ctx: Context, d: Draft) -> None:
    where = data.draw(st.sampled_from(["top", "details", "authPayload"]), label="bad field in")
    kinds = {"top": TOP_KINDS, "details": DETAIL_KINDS, "authPayload": AUTH_KINDS}[where]
    name = data.draw(st.sampled_from(sorted(kinds)), label="field")
    kind = kinds[name]
    if kind == "amount" and d.action in PRICED:
        kind = data.draw(st.sampled_from(["amount", "amount-format"]), label="amount kind")
    bad = data.draw(ctx.bad.schema(kind, d.get), label="bad value")
    target = d.body if where == "top" else _sub(d.body, where)
    target[name] = bad.value
    d.steps.append(f"{where}.{name} = bad {kind}")


def op_bad_container(data: st.DataObject, ctx: Context, d: Draft) -> None:
    name = data.draw(st.sampled_from(["details", "authPayload"]), label="container")
    if d.get:
        value: Any = data.draw(st.sampled_from(["x", "{}", "[]", "true", "1"]), label="as text")
        d.body = {k: v for k, v in d.body.items() if k != name}
    else:
        value = data.draw(
            st.one_of(
                st.lists(JSON_SCALARS, max_size=3),
                st.text(max_size=8),
                st.integers(),
                st.booleans(),
                st.floats(allow_nan=False),
            ),
            label="not an object",
        )
    d.body[name] = value
    d.steps.append(f"{name} is not an object")


def op_nested(data: st.DataObject, ctx: Context, d: Draft) -> None:
    """An unknown key holding a deep but parseable structure (within the JSON parser's
    recursion limit): the strict model must refuse it without walking it."""
    where = data.draw(st.sampled_from(["top", "details", "authPayload"]), label="nested in")
    depth = data.draw(st.integers(2, 400), label="depth")
    inner: Any = data.draw(JSON_SCALARS, label="leaf")
    as_dict = data.draw(st.booleans(), label="objects")
    for _ in range(depth):
        inner = {"a": inner} if as_dict else [inner]
    target = d.body if where == "top" else _sub(d.body, where)
    target[data.draw(st.sampled_from(["nested", "x", "deep"]), label="key")] = inner
    d.steps.append(f"{depth}-deep {'objects' if as_dict else 'lists'} under an unknown key in {where}")


def op_selector(data: st.DataObject, ctx: Context, d: Draft) -> None:
    if d.route == "post_api":
        choice = data.draw(
            st.one_of(
                st.just(MISSING),
                st.none(),
                st.text(max_size=20).filter(lambda a: a not in ACTIONS),
                st.sampled_from(
                    [a.upper() for a in ACTIONS] + [a + "/" for a in ACTIONS] + ["/" + a for a in ACTIONS]
                ),
                JSON_VALUES.filter(lambda v: not isinstance(v, str)),
            ),
            label="action",
        )
    else:  # post_action: a body action that differs from the path's
        choice = data.draw(
            st.one_of(
                st.sampled_from([a for a in ACTIONS if a != d.action]),
                JSON_VALUES.filter(lambda v: v != d.action and v is not None),
            ),
            label="body action",
        )
    d.selector = choice
    d.steps.append(f"action selector {'missing' if choice is MISSING else repr(choice)[:60]}")


def op_service(data: st.DataObject, ctx: Context, d: Draft) -> None:
    """A well-formed value that the action's own checks refuse."""
    choices = ["chainId"]
    if d.action in PRICED:
        choices += ["amount", "inputToken", "carbonClass", "listingId", "creditToken"]
    if d.action == "prepare-auth":
        choices.append("noBeneficiary")
    what = data.draw(st.sampled_from(choices), label="service-level")
    v: Any
    if what == "chainId":
        v = data.draw(st.sampled_from([0, 1, 10, 137, 8453, 11155111, 2**64, 2**256 - 1]), label="chainId")
        d.body["chainId"] = str(v) if d.get else v
    elif what == "amount":
        v = data.draw(
            st.one_of(
                st.sampled_from(["0", "0.0", "0.000", "0.000000000000000001"]),
                # a non-zero digit beyond the third decimal: not a multiple of 1 kg
                st.builds(
                    lambda w, f, tail, last: f"{w}.{f:03d}{tail}{last}",
                    st.integers(0, 50),
                    st.integers(0, 999),
                    st.text(alphabet="0123456789", max_size=12),
                    st.integers(1, 9),
                ),
                st.integers(10**7, 10**12 - 1).map(str),  # beyond any liquidity
            ),
            label="amount",
        )
        d.body["amount"] = v
    elif what == "inputToken":
        v = data.draw(
            st.one_of(
                st.sampled_from(["DAI", "ETH", "usdt", "USDC.e", "", "USD C", "kVCM2", "WETH"]),
                st.sampled_from([a for a in ctx.addresses if a not in ctx.token_addresses]),
            ),
            label="inputToken",
        )
        d.body["inputToken"] = v
    elif what == "carbonClass":
        v = data.draw(
            st.text(alphabet="QWXYZ", min_size=1, max_size=10).map(lambda t: "ZZ" + t), label="class"
        )
        d.body["carbonClass"] = v
    elif what == "listingId":  # with carbonClass: both given; alone: no such listing
        v = data.draw(st.integers(ctx.missing_listing, 2**256 - 1), label="listingId")
        d.body["listingId"] = str(v) if d.get else v
    elif what == "creditToken":
        v = data.draw(
            st.sampled_from([a for a in ctx.addresses if a != ctx.bases[RETIRE]["creditToken"]]),
            label="creditToken",
        )
        d.body["creditToken"] = v
    else:
        details = _sub(d.body, "details")
        details.pop("beneficiaryAddress", None)
        if data.draw(st.booleans(), label="false or absent"):
            details["beneficiaryIsPayer"] = "false" if d.get else False
        else:
            details.pop("beneficiaryIsPayer", None)
    d.steps.append(f"service-level bad {what}")


def op_signature(data: st.DataObject, ctx: Context, d: Draft) -> None:
    """actions/retire: a signature that must be refused (never the signed one in another
    form: v 0/1 and v/r/s of the same signature are valid)."""
    auth = _sub(d.body, "authPayload")
    sig = bytes.fromhex(str(d.original["authPayload"]["signature"])[2:])
    r, s, v = sig[:32], int.from_bytes(sig[32:64], "big"), sig[64]
    kind = data.draw(
        st.sampled_from(
            ["high-s", "bad v", "r=0", "s=0", "s>=n", "r>=n", "flip", "random", "vrs high-s", "vrs bad v"]
        ),
        label="signature",
    )
    new: bytes | None = None
    if kind == "high-s":
        keep_v = data.draw(st.booleans(), label="keep v")
        new = r + (N - s).to_bytes(32, "big") + bytes([v if keep_v else 55 - v])
    elif kind == "bad v":
        bad_v = data.draw(st.integers(0, 255).filter(lambda x: x not in (0, 1, 27, 28)), label="v")
        new = sig[:64] + bytes([bad_v])
    elif kind == "r=0":
        new = bytes(32) + sig[32:]
    elif kind == "s=0":
        new = r + bytes(32) + sig[64:]
    elif kind == "s>=n":
        new = r + data.draw(st.integers(N, 2**256 - 1), label="s").to_bytes(32, "big") + sig[64:]
    elif kind == "r>=n":
        new = data.draw(st.integers(N, 2**256 - 1), label="r").to_bytes(32, "big") + sig[32:]
    elif kind == "flip":
        i = data.draw(st.integers(0, 63), label="byte")
        x = data.draw(st.integers(1, 255), label="xor")
        b = bytearray(sig)
        b[i] ^= x
        new = bytes(b)
    elif kind == "random":
        new = data.draw(st.binary(min_size=64, max_size=64), label="r||s") + bytes(
            [data.draw(st.sampled_from([27, 28]), label="v")]
        )
    elif kind == "vrs high-s":
        auth.pop("signature", None)
        auth.update(r="0x" + r.hex(), s="0x" + (N - s).to_bytes(32, "big").hex())
        auth["v"] = data.draw(st.integers(0, 28), label="v")
    else:  # vrs bad v
        auth.pop("signature", None)
        auth.update(r="0x" + r.hex(), s="0x" + sig[32:64].hex())
        auth["v"] = data.draw(st.integers(2, 26), label="v")
    if new is not None:
        auth["signature"] = "0x" + new.hex()
    d.steps.append(f"signature {kind}")


def op_rebind(data: st.DataObject, ctx: Context, d: Draft) -> None:
    """actions/retire: one signed field changed to another well-formed value, so the
    signature, the nonce binding or the value no longer matches."""
    base = d.original
    auth = _sub(d.body, "authPayload")
    what = data.draw(
        st.sampled_from(
            [
                "amount",
                "salt",
                "value",
                "validBefore",
                "from",
                "beneficiaryString",
                "gasAllowance",
                "carbonClass",
                "to",
                "nonce",
            ]
        ),
        label="rebind",
    )
    if what == "amount":
        d.body["amount"] = data.draw(
            st.sampled_from(["2", "0.5", "1.5", "3", "0.25", "0.01", "0.002"]).filter(
                lambda a: a != base["amount"]
            ),
            label="amount",
        )
    elif what == "salt":
        d.body["salt"] = data.draw(
            _hex(64, 64).map(lambda h: "0x" + h).filter(lambda s: s != base["salt"]), label="salt"
        )
    elif what in ("value", "validBefore"):
        delta = data.draw(st.integers(-(10**6), 10**6).filter(bool), label="delta")
        current = int(str(base["authPayload"][what]))
        auth[what] = str(current + delta if current + delta >= 0 else current + abs(delta))
    elif what == "from":
        d.body["from"] = auth["from"] = ctx.other_payer
    elif what == "beneficiaryString":
        _sub(d.body, "details")["beneficiaryString"] = data.draw(
            st.text(alphabet="abcdefgh XYZ", max_size=30).filter(
                lambda t: t != base["details"].get("beneficiaryString")
            ),
            label="text",
        )
    elif what == "gasAllowance":
        delta = data.draw(st.integers(1, 10**6), label="delta")
        d.body["gasAllowance"] = str(int(str(base["gasAllowance"])) + delta)
    elif what == "carbonClass":
        d.body["carbonClass"] = data.draw(
            st.sampled_from([c for c in ctx.classes if c != base["carbonClass"]]), label="class"
        )
    elif what == "to":
        auth["to"] = data.draw(
            st.sampled_from([a for a in ctx.addresses if a != base["authPayload"]["to"]]), label="to"
        )
    elif str(base["authPayload"]["nonce"]).startswith("0x"):
        # another USDC bytes32 (in lower case: the upper case of a nonce is the same nonce)
        auth["nonce"] = data.draw(
            _hex(64, 64).map(lambda h: "0x" + h).filter(lambda n: n != base["authPayload"]["nonce"]),
            label="nonce",
        )
    else:  # another kVCM permit nonce, or one that is not a decimal uint256
        auth["nonce"] = data.draw(
            st.one_of(
                st.integers(0, 2**256 - 1).map(str),
                st.sampled_from(["\u00b2", "-1", "0x0", "1e2", " 1", "01", str(2**256), "\u0661"]),
            ).filter(lambda n: n != base["authPayload"]["nonce"]),
            label="nonce",
        )
    d.steps.append(f"rebind {what}")


Op = Callable[[st.DataObject, Context, Draft], None]


def _ops(d: Draft) -> list[tuple[str, Op]]:
    ops: list[tuple[str, Op]] = [
        ("unknown key", op_unknown_key),
        ("bad field", op_bad_field),
        ("bad field", op_bad_field),  # twice the weight: the richest family
        ("not an object", op_bad_container),
        ("service", op_service),
    ]
    if REQUIRED[d.action]:
        ops.append(("drop", op_drop))
    if not d.get:
        ops += [("nested", op_nested), ("selector", op_selector)]
    if d.action == RETIRE:  # weighted towards what only the verifier can refuse
        ops += [("signature", op_signature)] * 4 + [("rebind", op_rebind)] * 3
    return ops


def _draft(data: st.DataObject, ctx: Context, actions: list[str], routes: list[str]) -> Draft:
    action = data.draw(st.sampled_from(actions), label="action")
    route = data.draw(st.sampled_from(routes), label="route")
    valid = True
    if action == RETIRE:
        label, signed, valid = data.draw(st.sampled_from(ctx.retire_bodies), label="signed body")
        body = copy.deepcopy(signed)
    else:
        body = copy.deepcopy(ctx.bases[action])
    body.pop("action", None)
    d = Draft(action, route, body, copy.deepcopy(body))
    if not valid:
        d.steps.append(label)
    # a valid request gets at least one mutation; a signed bad one may go as it is
    for _ in range(data.draw(st.integers(1 if valid else 0, 3), label="mutations")):
        _name, op = data.draw(st.sampled_from(_ops(d)), label="op")
        op(data, ctx, d)
    return d


# ---------------------------------------------------------------------------- bodies that are not one object


def _json_text(ctx: Context, action: str) -> str:
    base = ctx.bases[action] if action != RETIRE else ctx.retire_bodies[0][1]
    return json.dumps({"action": action, **base})


@st.composite
def malformed_body(draw: st.DrawFn, ctx: Context) -> tuple[bytes, str]:
    """Not parseable as JSON, or not one object: (body, what)."""
    action = draw(st.sampled_from(list(ACTIONS)), label="of action")
    text = _json_text(ctx, action)
    kind = draw(
        st.sampled_from(
            [
                "truncated",
                "corrupted",
                "single quotes",
                "trailing",
                "form",
                "not an object",
                "bad utf-8",
                "empty",
                "js",
            ]
        ),
        label="malformed",
    )
    if kind == "truncated":
        cut = draw(st.integers(0, len(text) - 1), label="cut")
        return text[:cut].encode(), kind
    if kind == "corrupted":
        i = draw(st.integers(0, len(text)), label="at")
        ch = draw(
            st.sampled_from([*'{}[]:,"\\', "'", "x", "\x00", "\x1f", "NaN", "//", "/*"]), label="insert"
        )
        out = text[:i] + ch + text[i:]
        return out.encode(), kind
    if kind == "single quotes":
        return text.replace('"', "'").encode(), kind
    if kind == "trailing":
        tail = draw(st.sampled_from([",", "}", "]", "x", "{}", "\x00", " //c", "\n{", "1"]), label="tail")
        return (text + tail).encode(), kind
    if kind == "form":
        pairs = _query_pairs({"action": action, **json.loads(text)})
        return urllib.parse.urlencode(pairs).encode(), kind
    if kind == "not an object":
        value = draw(
            st.one_of(
                st.lists(JSON_VALUES, max_size=4),
                st.just([json.loads(text)]),
                st.text(max_size=20),
                st.integers(-(10**30), 10**30),
                st.floats(allow_nan=False, allow_infinity=False),
                st.booleans(),
                st.none(),
            ),
            label="value",
        )
        return json.dumps(value).encode(), kind
    if kind == "bad utf-8":
        raw = text.encode()
        i = draw(st.integers(0, len(raw)), label="at")
        junk = draw(
            st.sampled_from(
                [b"\xff", b"\xc0\xae", b"\xed\xa0\x80", b"\x80", b"\xf8\x88\x80\x80\x80", b"\xe2\x82"]
            ),
            label="bytes",
        )
        return raw[:i] + junk + raw[i:], kind
    if kind == "empty":
        return draw(st.sampled_from([b"", b" ", b"\n", b"\t\r\n "]), label="blank"), kind
    return f"{{action: '{action}', amount: 1}}".encode(), kind


def deep_body(data: st.DataObject, ctx: Context) -> tuple[bytes, str]:
    """Deep nesting beyond the JSON parser's recursion limit, within the body limit (drawn
    as parameters, so that a failing example shows them rather than the body)."""
    kind = data.draw(
        st.sampled_from(["lists", "objects", "unclosed", "in details", "in a key", "mixed"]), label="deep"
    )
    cap = {"objects": (ctx.max_body - 200) // 6, "mixed": (ctx.max_body - 200) // 7}.get(
        kind, (ctx.max_body - 200) // 2
    )
    depth = data.draw(st.one_of(st.integers(1_000, cap), st.just(min(10_000, cap))), label="depth")
    if kind == "lists":
        return b"[" * depth + b"]" * depth, f"{depth} nested lists"
    if kind == "objects":
        return b'{"a":' * depth + b"1" + b"}" * depth, f"{depth} nested objects"
    if kind == "unclosed":
        return b"[" * depth, f"{depth} unclosed lists"
    if kind == "mixed":
        return b'[{"a":' * depth + b"0" + b"}]" * depth, f"{depth} nested lists of objects"
    head = json.dumps({"action": "quote", **ctx.bases["quote"]})[:-1].encode()
    inner = b"[" * depth + b"]" * depth
    if kind == "in details":
        return head + b', "details": {"x": ' + inner + b"}}", f"{depth} lists inside details"
    return head + b', "x": ' + inner + b"}", f"{depth} lists under an unknown key"


def huge_body(data: st.DataObject, ctx: Context) -> tuple[bytes, str, bool]:
    """A body over the daemon's limit (sometimes chunked, so with no content-length)."""
    size = data.draw(
        st.one_of(
            st.integers(ctx.max_body + 1, ctx.max_body + 64), st.integers(ctx.max_body + 1, 4 * ctx.max_body)
        ),
        label="size",
    )
    kind = data.draw(st.sampled_from(["long text", "long array", "garbage", "many keys"]), label="huge")
    chunked = data.draw(st.booleans(), label="chunked")
    if kind == "long text":
        head = json.dumps({"action": "prepare-auth", **ctx.bases["prepare-auth"]})[:-1] + ', "x": "'
        body = head.encode() + b"x" * max(0, size - len(head) - 2) + b'"}'
    elif kind == "long array":
        body = b"[" + b"1," * ((size - 2) // 2) + b"1]"
    elif kind == "garbage":
        body = b"\x00\xff" * (size // 2 + 1)
    else:
        n = size // 12 + 1
        body = ("{" + ",".join(f'"k{i:07d}":1' for i in range(n)) + "}").encode()
    return body, f"{kind}, {len(body)} bytes", chunked


def _parses(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return True


# ---------------------------------------------------------------------------- families


def _settings(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=True,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        report_multiple_bugs=False,
        print_blob=False,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.large_base_example,
        ],
    )


ROUTES: Final = ["get", "post_api", "post_action"]
NON_RETIRE: Final = [a for a in ACTIONS if a != RETIRE]
CONTENT_TYPES: Final = [
    "application/json",
    "application/json; charset=utf-8",
    "application/x-www-form-urlencoded",
    "text/plain",
    "multipart/form-data; boundary=xyz",
    None,
]

# (family, examples): 5,450 bad requests when every one passes (a failure adds its shrinking
# and a re-run of its family)
BUDGET: Final = {
    "mutated request, every action but actions/retire, each route": 2300,
    "mutated signed actions/retire (USDC and kVCM), POST routes": 1500,
    "body not one JSON object (malformed, form, array, bad UTF-8)": 700,
    "deep nesting beyond the parser's limit": 250,
    "body over the size limit": 150,
    "hostile query strings and paths": 500,
    "request line over 8 KiB (under the server's 64 KiB)": 50,
}


def families(ctx: Context) -> list[tuple[str, Callable[[], None]]]:
    names = list(BUDGET)

    @_settings(BUDGET[names[0]])
    @given(st.data())
    def mutated(data: st.DataObject) -> None:
        ctx.send(_draft(data, ctx, NON_RETIRE, ROUTES).sent(names[0]))

    @_settings(BUDGET[names[1]])
    @given(st.data())
    def mutated_retire(data: st.DataObject) -> None:
        # GET of actions/retire is only ever not_found: one in ten
        route = data.draw(st.sampled_from(["post_api"] * 5 + ["post_action"] * 4 + ["get"]), label="way")
        d = _draft(data, ctx, [RETIRE], [route])
        ctx.send(d.sent(names[1]))

    @_settings(BUDGET[names[2]])
    @given(
        malformed_body(ctx),
        st.sampled_from(["/api", *(f"/api/{a}" for a in ACTIONS)]),
        st.sampled_from(CONTENT_TYPES),
    )
    def malformed(body: tuple[bytes, str], path: str, content_type: str | None) -> None:
        raw, what = body
        if what == "corrupted":  # the inserted character may have kept it valid JSON
            assume(not _parses(raw))
        if what == "form":
            content_type = "application/x-www-form-urlencoded"
        action = path.removeprefix("/api/") if path != "/api" else None
        ctx.send(Sent(names[2], action, "POST", path, raw, content_type, note=what))

    @_settings(BUDGET[names[3]])
    @given(st.data(), st.sampled_from(["/api", *(f"/api/{a}" for a in ACTIONS)]))
    def deep(data: st.DataObject, path: str) -> None:
        raw, what = deep_body(data, ctx)
        action = path.removeprefix("/api/") if path != "/api" else None
        ctx.send(Sent(names[3], action, "POST", path, raw, "application/json", note=what))

    @_settings(BUDGET[names[4]])
    @given(st.data(), st.sampled_from(["/api", *(f"/api/{a}" for a in ACTIONS)]))
    def huge(data: st.DataObject, path: str) -> None:
        raw, what, chunked = huge_body(data, ctx)
        action = path.removeprefix("/api/") if path != "/api" else None
        ctx.send(Sent(names[4], action, "POST", path, raw, "application/json", chunked=chunked, note=what))

    @_settings(BUDGET[names[5]])
    @given(st.data())
    def query(data: st.DataObject) -> None:
        ctx.send(_hostile_query(data, ctx, names[5]))

    @_settings(BUDGET[names[6]])
    @given(st.sampled_from(NON_RETIRE), st.integers(8200, 60_000), st.sampled_from(["value", "key", "path"]))
    def long_line(action: str, size: int, where: str) -> None:
        pairs = _query_pairs(ctx.bases[action])
        path = f"/api/{action}"
        if where == "value":
            pairs.append(("carbonClass", "N" * size))
        elif where == "key":
            pairs.append(("k" * size, "1"))
        else:
            path += "/" + "p" * size
        ctx.send(
            Sent(names[6], None if where == "path" else action, "GET", f"{path}?{_qs(pairs)}", note=where)
        )

    return [
        (names[0], mutated),
        (names[1], mutated_retire),
        (names[2], malformed),
        (names[3], deep),
        (names[4], huge),
        (names[5], query),
        (names[6], long_line),
    ]


PATTERN_FIELDS: Final = ("amount", "from", "txHash", "chainId", "creditToken", "salt", "gasAllowance")


def _hostile_query(data: st.DataObject, ctx: Context, family: str) -> Sent:
    """GET oddities: repeated parameters, keys nested too deep or clashing, raw bytes that
    are not UTF-8 in a pattern field, long query strings (under the server's 64 KiB request
    line), and paths naming no action."""
    action = data.draw(st.sampled_from(NON_RETIRE), label="action")
    pairs = _query_pairs(ctx.bases[action])
    kind = data.draw(
        st.sampled_from(
            ["repeated", "too deep", "clash", "raw bytes", "long", "empty key", "bad path", "retire by GET"]
        ),
        label="query",
    )
    raw_extra = ""
    path = f"/api/{action}"
    codes_of: str | None = action
    if kind == "repeated":
        key = data.draw(
            st.sampled_from([k for k, _ in pairs] + ["amount", "details.beneficiaryIsPayer", "x"]),
            label="key",
        )
        value = data.draw(st.sampled_from(["", "1", dict(pairs).get(key, "1")]), label="value")
        times = data.draw(st.integers(1, 3), label="times") + (key not in dict(pairs))
        pairs += [(key, value)] * times
    elif kind == "too deep":
        head = data.draw(st.sampled_from(["details", "authPayload", "x", "amount"]), label="head")
        depth = data.draw(st.integers(2, 6), label="depth")
        pairs.append((".".join([head, *["a"] * depth]), "1"))
    elif kind == "clash":  # a scalar and a nested key of the same name, in either order
        name = data.draw(st.sampled_from(["amount", "from", "details", "carbonClass"]), label="name")
        both = [(name, "1"), (f"{name}.x", "1")]
        if name == "details" and data.draw(st.booleans(), label="nested first"):
            both.reverse()  # details.x=1&details=1: details is then a string
        pairs = [p for p in pairs if p[0] != name] + both
    elif kind == "raw bytes":
        fields = [f for f in PATTERN_FIELDS if f != "amount" or action in PRICED]
        name = data.draw(st.sampled_from(fields), label="field")
        junk = data.draw(
            st.sampled_from(
                ["%FF", "%C0%AE", "%ED%A0%80", "%00", "%E2%80%8F", "%F0%9F%92%A9", "%zz", "%", "%2"]
            ),
            label="bytes",
        )
        pairs = [p for p in pairs if p[0] != name]
        raw_extra = f"&{name}=1{junk}"
    elif kind == "long":
        size = data.draw(st.integers(1000, 7000), label="length")
        where = data.draw(st.sampled_from(["value", "key", "many"]), label="where")
        if where == "value":
            name = data.draw(
                st.sampled_from(["amount", "carbonClass", "project", "txHash", "x"]), label="field"
            )
            pairs = [p for p in pairs if p[0] != name] + [(name, "1" * size)]
        elif where == "key":
            pairs.append(("k" * size, "1"))
        else:
            pairs += [(f"u{i}", "1") for i in range(size // 8)]
    elif kind == "empty key":
        pairs.append(
            data.draw(
                st.sampled_from([("", "1"), ("", ""), (".", "1"), ("details.", "1"), (".x", "1")]),
                label="key",
            )
        )
    elif kind == "bad path":
        path = data.draw(
            st.one_of(
                st.sampled_from(
                    [
                        "/api/QUOTE",
                        "/api/quote/",
                        "/api//quote",
                        "/api/prepare",
                        "/api/retire",
                        "/api/actions",
                        "/api/discover%00",
                        "/api/%2e%2e/discover",
                        "/api/prepare%2Fretire",
                        "/api/certificate.json",
                    ]
                ),
                st.text(alphabet="abcxyz-_/%.", min_size=1, max_size=20).map(
                    lambda t: "/api/" + t.lstrip("/")
                ),
            ),
            label="path",
        )
        decoded = urllib.parse.unquote(path.removeprefix("/api/"))
        codes_of = None if decoded not in ACTIONS else decoded
        if decoded in ACTIONS:  # a valid action after all: make the request bad anyway
            pairs.append(("unknownKey", "1"))
    else:
        path = f"/api/{RETIRE}"
        codes_of = RETIRE
        pairs = _query_pairs(ctx.retire_bodies[0][1])
    return Sent(family, codes_of, "GET", f"{path}?{_qs(pairs)}{raw_extra}", note=kind)


# ---------------------------------------------------------------------------- the test


MAX_FAILURES_PER_FAMILY: Final = 6


def _cap(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else f"{text[:limit]} … ({len(text)} chars)"


def _report(family: str, exc: BaseException, signature: tuple[str, ...] | None) -> str:
    notes = "\n".join(_cap(n) for n in getattr(exc, "__notes__", []))
    return f"[{family}] {signature or type(exc).__name__}\n{exc}\n{notes}"


def _resigned(ch: dict[str, Any], key: str, **message: Any) -> dict[str, Any]:
    """The challenge's ``actionsRetireRequest`` with ``message`` fields changed in both the
    typed data and ``authPayload`` (``value``; USDC ``validBefore``), signed by ``key``."""
    typed = copy.deepcopy(ch["typedData"])
    body = copy.deepcopy(ch["actionsRetireRequest"])
    for name, value in message.items():
        old = typed["message"][name]
        typed["message"][name] = str(value) if isinstance(old, str) else value
        body["authPayload"][name] = str(value)
    body["authPayload"]["signature"] = sign(typed, key)
    return body


IN_FLIGHT: Final = ("accepted", "simulated", "signed", "submitted")


async def _quiet(daemon: Daemon, within_s: float = 60) -> None:
    """Wait until no job of an earlier test is in flight (none can sign or broadcast while
    this test counts), at most ``within_s``."""
    executor = daemon.chain["executor"]["address"]
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        busy = await daemon.runtime.db.fetchval(
            "SELECT count(*) FROM relay_jobs WHERE state = ANY($1::text[])", list(IN_FLIGHT)
        )
        chain = daemon.runtime.executor
        if not busy and await chain.pending_nonce(executor) == await chain.mined_nonce(executor):
            return
        await asyncio.sleep(0.5)


async def _counts(daemon: Daemon) -> dict[str, int]:
    db = daemon.runtime.db
    out = {
        t: int(await db.fetchval(f"SELECT count(*) FROM {t}"))
        for t in ("relay_jobs", "spent_salts", "relay_transactions")
    }
    out["executor pending nonce"] = await daemon.runtime.executor.pending_nonce(
        daemon.chain["executor"]["address"]
    )
    return out


@pytest.mark.timeout(300)
async def test_generated_bad_requests_answer_4xx_envelopes_and_record_nothing(daemon: Daemon) -> None:
    chain = daemon.chain
    await _quiet(daemon)
    before = await _counts(daemon)
    usdc_payer, kvcm_payer, other = chain["payers"][0], chain["payers"][2], chain["payers"][1]
    ch_usdc = await challenge(daemon, usdc_payer, carbonClass="NBO", amount="1", inputToken="USDC")
    ch_kvcm = await challenge(daemon, kvcm_payer, carbonClass="RE", amount="0.01", inputToken="kVCM")
    retire_usdc = signed_request(ch_usdc, usdc_payer["privateKey"])
    retire_kvcm = signed_request(ch_kvcm, kvcm_payer["privateKey"])
    # signed, well-formed and still bad: what only the verifier can refuse (and its code)
    key = usdc_payer["privateKey"]
    value = int(str(ch_usdc["typedData"]["message"]["value"]))
    kvcm_value = int(str(ch_kvcm["typedData"]["message"]["value"]))
    signed_bad = {
        "signed for half the value": (
            _resigned(ch_usdc, key, value=value // 2),
            "insufficient_authorized_value",
        ),
        "kVCM permit signed for half the value": (
            _resigned(ch_kvcm, kvcm_payer["privateKey"], value=kvcm_value // 2),
            "insufficient_authorized_value",
        ),
        "signed by another key": (_resigned(ch_usdc, other["privateKey"]), "invalid_auth_payload"),
        "signed to expire within 30 s": (
            _resigned(ch_usdc, key, validBefore=int(time.time()) + 10),
            "invalid_auth_payload",
        ),
    }
    for label, (body, code) in signed_bad.items():
        status, answer = await daemon.post(body)
        assert answer.get("error") == code and status == REGISTRY[code].http_status, (label, answer)
    quote = {"carbonClass": "NBO", "amount": "1", "inputToken": "USDC"}
    bases: dict[str, dict[str, Any]] = {
        "discover": {},
        "quote": quote,
        "prepare/retire": {**quote, "from": usdc_payer["address"]},
        "prepare-auth": {**quote, "from": usdc_payer["address"], "details": {"beneficiaryIsPayer": True}},
        "certificate": {"txHash": chain["seededRetirements"][0]["transactionHash"]},
        RETIRE: retire_usdc,
    }
    # every base is a valid request: what the mutations change is what makes them bad
    for action, body in bases.items():
        if action != RETIRE:
            status, answer = await daemon.post({"action": action, **body})
            assert status == 200 or (action == "certificate" and status == 404), (action, answer)
    for body in (retire_usdc, retire_kvcm):
        parsed = ActionRequest.model_validate({k: v for k, v in body.items() if k != "action"})
        assert parsed.authPayload is not None and parsed.authPayload.signature is not None
    contracts = chain["contracts"]
    addresses = sorted(
        {p["address"] for p in chain["payers"]}
        | {v for v in contracts.values() if isinstance(v, str) and v.startswith("0x") and len(v) == 42}
        | {chain["executor"]["address"], chain["feeRecipient"]["address"]}
    )
    classes = [c["symbol"] for c in chain["carbonClasses"]]
    listings = [int(li["listingId"]) for li in chain["listings"]]

    with requests.Session() as session:
        ctx = Context(
            base_url=daemon.base_url,
            session=session,
            bases=bases,
            retire_bodies=[
                ("signed USDC authorization", retire_usdc, True),
                ("signed kVCM permit", retire_kvcm, True),
                *((label, body, False) for label, (body, _code) in signed_bad.items()),
            ],
            addresses=[a for a in addresses if a.lower() != a],  # checksummed, mixed case
            other_payer=other["address"],
            classes=classes,
            missing_listing=max(listings, default=0) + 10**6,
            max_body=daemon.runtime.settings.max_body_bytes,
            bad=BadValues([a for a in addresses if a.lower() != a]),
            token_addresses=frozenset({contracts["usdc"], contracts["kvcm"]}),
        )

        def run() -> None:
            for name, family in families(ctx):
                sent, started = ctx.sent, time.perf_counter()
                # a failure found is reported shrunk, then the family runs again with it
                # known (counted, not raised) so that it can find the others
                for _ in range(MAX_FAILURES_PER_FAMILY):
                    try:
                        family()
                    except BadAnswer as exc:
                        ctx.known[exc.signature] += 1
                        ctx.failures.append(_report(name, exc, exc.signature))
                        continue
                    except Exception as exc:
                        ctx.failures.append(_report(name, exc, None))
                    break
                ctx.families[name] = (ctx.sent - sent, time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.to_thread(run)
        elapsed = time.perf_counter() - started

    after = await _counts(daemon)
    print(f"\nproperty-based bad input: {ctx.sent} requests in {elapsed:.1f} s")
    for name, (n, seconds) in ctx.families.items():
        print(f"  {n:5d} requests, {seconds:5.1f} s  {name}")
        print("        " + ", ".join(f"{c}: {k}" for c, k in ctx.family_codes[name].most_common()))
    print("  statuses: " + ", ".join(f"{s}: {n}" for s, n in sorted(ctx.statuses.items())))
    print("  codes: " + ", ".join(f"{c}: {n}" for c, n in ctx.codes.most_common()))
    print(f"  before {before}\n  after  {after}")
    for signature, hits in ctx.known.items():
        print(f"  FAILURE {signature}: {hits} requests")
    assert not ctx.failures, "\n\n".join(ctx.failures)
    assert ctx.sent >= 5000, ctx.sent
    assert after == before, "a bad request was recorded or broadcast"
    assert all(400 <= s < 500 for s in ctx.statuses), ctx.statuses


# ---------------------------------------------------------------------------- the x402 facilitator

FACILITATOR_PATHS: Final = ("/facilitator/verify", "/facilitator/settle", "/facilitator/supported")
# Headers that frame the HTTP message itself: a bad one is the client library's problem.
FRAMING: Final = frozenset({"content-length", "transfer-encoding", "host", "connection", "expect"})
HEADER_NAME: Final = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,24}", fullmatch=True).filter(
    lambda n: n.lower() not in FRAMING
)
HEADER_VALUE: Final = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=120).map(
    str.lstrip  # requests refuses leading whitespace itself
)
PAYMENT_IDS: Final = st.one_of(
    st.from_regex(r"[A-Za-z0-9_-]{16,128}", fullmatch=True),
    st.text(max_size=140),
    ANY_JSON,
)


def _identified(body: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """``body`` with a ``payment-identifier`` extension made of good and bad parts."""
    info = data.draw(
        st.one_of(
            st.fixed_dictionaries({"required": st.booleans(), "id": PAYMENT_IDS}),
            st.dictionaries(st.sampled_from(["required", "id", "other"]), ANY_JSON, max_size=3),
            ANY_JSON,
        ),
        label="info",
    )
    extension = data.draw(st.sampled_from(["info", "bare", "value"]), label="extension")
    body = copy.deepcopy(body)
    body["paymentPayload"]["extensions"] = {
        "payment-identifier": {"info": info, "schema": {"type": "object"}}
        if extension == "info"
        else info
        if extension == "value"
        else {"info": info}
    }
    return body


def _facilitator_body(data: st.DataObject, base: dict[str, Any]) -> tuple[bytes | None, str]:
    """A body for a facilitator route: a mutated valid one (with or without an identifier),
    any JSON value, or bytes that may not be JSON at all."""
    kind = data.draw(st.sampled_from(["mutated", "identified", "json", "bytes", "none"]), label="kind")
    if kind == "mutated":
        return json.dumps(mutate(base, data.draw)).encode(), kind
    if kind == "identified":
        body = _identified(base, data)
        if data.draw(st.booleans(), label="mutate too"):
            body = mutate(body, data.draw)
        return json.dumps(body).encode(), kind
    if kind == "json":
        return json.dumps(data.draw(ANY_JSON, label="json")).encode(), kind
    if kind == "bytes":
        return data.draw(st.binary(max_size=300), label="bytes"), kind
    return None, kind


def _facilitator_headers(data: st.DataObject, key: str) -> dict[str, str]:
    headers = data.draw(st.dictionaries(HEADER_NAME, HEADER_VALUE, max_size=4), label="headers")
    auth = data.draw(
        st.sampled_from(["key", "key", "key", "none", "bearer junk", "junk", "lowercase scheme"]),
        label="auth",
    )
    headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    if auth == "key":
        headers["Authorization"] = f"Bearer {key}"
    elif auth == "bearer junk":
        headers["Authorization"] = "Bearer " + data.draw(HEADER_VALUE, label="token")
    elif auth == "junk":
        headers["Authorization"] = data.draw(HEADER_VALUE, label="authorization")
    elif auth == "lowercase scheme":
        headers["Authorization"] = f"bearer {key}"
    if not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = data.draw(
            st.sampled_from([*CONTENT_TYPES_FACILITATOR]), label="content type"
        )
    return headers


CONTENT_TYPES_FACILITATOR: Final = (
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "",
)


@pytest.mark.timeout(300)
async def test_generated_facilitator_requests_never_answer_5xx(daemon: Daemon) -> None:
    """Random bodies (mutated valid payments, ``payment-identifier`` extensions good and bad,
    any JSON, any bytes, none) and headers (API key good, bad or missing; any content type;
    extra headers) by any method on ``/facilitator/verify``, ``/settle`` and ``/supported``:
    never a 5xx; every answer is one JSON object; a payment answered 200 is invalid (the payer
    holds nothing); and nothing is recorded for the payer."""
    key = await create_api_key(
        daemon.runtime.settings, "property-facilitator", ["facilitator"], rate_limit="100000/second"
    )
    broke = Account.create()
    base = payment(daemon, fresh_address(), 5_000, key=broke.key.hex(), payer=broke.address)
    seen: Counter[int] = Counter()
    url = daemon.base_url

    def run() -> None:
        with requests.Session() as session:

            @_settings(800)
            @given(
                st.data(),
                st.sampled_from(FACILITATOR_PATHS),
                st.sampled_from(["POST"] * 6 + ["GET", "PUT", "DELETE"]),
            )
            def check(data: st.DataObject, path: str, method: str) -> None:
                if path.endswith("supported") and data.draw(st.booleans(), label="plain GET"):
                    method = "GET"
                raw, kind = _facilitator_body(data, base)
                headers = _facilitator_headers(data, key)
                r = session.request(method, url + path, data=raw, headers=headers, timeout=60)
                seen[r.status_code] += 1
                assert r.status_code < 500, (r.status_code, r.text[:500], method, path, kind, headers, raw)
                answer = r.json()
                assert isinstance(answer, dict), answer
                if r.status_code == 200 and method == "POST" and not path.endswith("supported"):
                    flag = "isValid" if path.endswith("verify") else "success"
                    assert answer[flag] is False, (answer, raw)

            check()

    await asyncio.to_thread(run)
    print(f"\nfacilitator bad input: {sum(seen.values())} requests, statuses {dict(sorted(seen.items()))}")
    assert sum(seen.values()) >= 800 and all(s < 500 for s in seen)
    assert seen[200] > 0 and seen[401] > 0
    recorded = await daemon.runtime.db.fetchval(
        "SELECT count(*) FROM relay_jobs WHERE payer = $1", broke.address
    )
    assert recorded == 0
