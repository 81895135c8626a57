"""Fast unit tests of the extraction engine and the scrape tools' pure parts."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fixtures.scrape_site import ARTICLE_HTML, CHANGED_HTML, CP1252_HTML, SJIS_HTML, listing_html

from activities.artifacts import FileArtifactStore
from activities.errors import AccessDeniedError, EgressDeniedError, PayloadTooLargeError
from activities.tools.egress import EgressPolicy
from activities.tools.extract import (
    HtmlParser,
    SpecError,
    compile_spec,
    parse_datetime,
    parse_number,
)
from activities.tools.fetch import FetchLimits, FetchTool, decode_body, parse_retry_after

P = HtmlParser()
BASE = "https://shop.example/list/page"


def run(
    html: str, spec: dict[str, object]
) -> tuple[dict[str, object], list[dict[str, str]], list[str]]:
    out = P.extract(html, compile_spec(spec), BASE)
    return out.data, out.warnings, out.missing_required


def test_listing_with_nested_records_types_and_absolute_urls() -> None:
    data, warnings, missing = run(
        listing_html(2),
        {
            "fields": {
                "title": {"selector": "h1", "required": True},
                "image": {"selector": "img.hero", "attr": "src", "type": "url"},
                "tags": {"selector": ".tag", "many": True},
                "in_stock": {"selector": ".stock", "type": "boolean"},
                "on_sale": {"selector": ".sale", "type": "boolean"},
                "items": {
                    "selector": ".product",
                    "many": True,
                    "fields": {
                        "name": {"selector": ".name"},
                        "price": {"selector": ".price", "type": "number"},
                        "link": {"selector": "a", "attr": "href", "type": "url"},
                    },
                },
            }
        },
    )
    assert missing == [] and warnings == []
    assert data == {
        "title": "Products",
        "image": "https://shop.example/img/hero.png",
        "tags": ["t1", "t2"],
        "in_stock": True,
        "on_sale": False,
        "items": [
            {"name": "Item 1", "price": 1199.0, "link": "https://shop.example/item/1"},
            {"name": "Item 2", "price": 1299.0, "link": "https://shop.example/item/2"},
        ],
    }


def test_article_locale_numbers_dates_html_regex_and_metadata() -> None:
    data, warnings, _ = run(
        ARTICLE_HTML,
        {
            "fields": {
                "price": {"selector": ".price", "type": "number", "locale": "de-DE"},
                "published": {"selector": "time", "type": "datetime"},
                "day": {"selector": ".date", "type": "date", "locale": "de"},
                "body": {"selector": ".body", "html": True},
                "year": {
                    "selector": ".date",
                    "regex": r"\d{2}\.(\d{2})\.(\d{4})",
                    "type": "integer",
                },
            },
            "metadata": True,
        },
    )
    assert data["price"] == 1299.0
    assert data["published"] == "2024-03-05T10:00:00+01:00"
    assert data["day"] == "2024-03-05"
    assert data["body"] == "<p>Hallo <b>Welt</b></p>"
    assert data["year"] == 3  # the first capture group
    meta = data["metadata"]
    assert isinstance(meta, dict)
    assert meta["title"] == "Ein Artikel"
    assert meta["description"] == "Worum es geht"
    assert meta["canonical_url"] == "https://shop.example/article"
    assert meta["language"] == "de-DE"
    assert meta["opengraph"] == {"title": "OG Titel", "image": "https://shop.example/img/a.png"}
    assert meta["json_ld"] == [{"@type": "NewsArticle", "headline": "Ein Artikel"}]
    assert [w["code"] for w in warnings] == ["json_ld_invalid"]


def test_changed_markup_warns_per_missing_field_and_uses_defaults() -> None:
    data, warnings, missing = run(
        CHANGED_HTML,
        {
            "fields": {
                "title": {"selector": "h1", "required": True},
                "price": {"selector": ".price", "type": "number", "required": True},
                "note": {"selector": ".note", "default": "n/a"},
                "subtitle": {"selector": ".sub"},
                "items": {"selector": ".product", "many": True, "fields": {"n": {"selector": "b"}}},
            }
        },
    )
    assert data == {"title": None, "price": None, "note": "n/a", "subtitle": None, "items": []}
    assert missing == ["title", "price"]
    by_field = {w["field"]: w for w in warnings}
    assert set(by_field) == {"title", "price", "subtitle", "items"}
    assert "'h1'" in by_field["title"]["message"] and "'.price'" in by_field["price"]["message"]


def test_nested_warnings_are_collapsed_per_path() -> None:
    html = "<div class=p><b>a</b><i>1</i></div><div class=p><b>b</b></div><div class=p></div>"
    data, warnings, missing = run(
        html,
        {
            "fields": {
                "items": {
                    "selector": ".p",
                    "many": True,
                    "fields": {"n": {"selector": "b"}, "v": {"selector": "i", "type": "integer"}},
                }
            }
        },
    )
    assert data["items"] == [{"n": "a", "v": 1}, {"n": "b", "v": None}, {"n": None, "v": None}]
    assert missing == []
    assert sorted((w["field"], w["message"].endswith("records)")) for w in warnings) == [
        ("items[].n", True),
        ("items[].v", True),
    ]
    assert "2 of 3" in next(w for w in warnings if w["field"] == "items[].v")["message"]


def test_unparseable_value_is_a_warning_not_a_crash() -> None:
    data, warnings, missing = run(
        "<p class=n>lots</p><p class=m>1</p><p class=m>x</p>",
        {
            "fields": {
                "n": {"selector": ".n", "type": "number", "required": True},
                "m": {"selector": ".m", "type": "integer", "many": True, "required": True},
            }
        },
    )
    assert data == {"n": None, "m": [1]}
    assert missing == ["n"]
    assert [w["code"] for w in warnings] == ["field_unparseable", "field_unparseable"]


@pytest.mark.parametrize(
    "html",
    ["", "<<<>>>", "<html><body><div><p>unclosed", "\x00\x01binary\xff", "<table><tr><td>" * 300],
)
def test_never_crashes_on_any_html(html: str) -> None:
    data, _, missing = run(
        html, {"fields": {"t": {"selector": "h1", "required": True}}, "metadata": True}
    )
    assert data["t"] is None and missing == ["t"]


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"fields": {"t": {"selector": "h1[["}}}, "extraction_spec.fields.t.selector"),
        ({"fields": {"t": {"selector": "h1", "type": "money"}}}, "extraction_spec.fields.t.type"),
        ({"fields": {"t": {"selector": "h1", "regex": "("}}}, "extraction_spec.fields.t.regex"),
        (
            {"fields": {"t": {"selector": "h1", "attr": "x", "html": True}}},
            "extraction_spec.fields.t",
        ),
        ({"fields": {}}, "extraction_spec"),
        (
            {"fields": {"a": {"fields": {"b": {"selector": "]"}}}}},
            "extraction_spec.fields.a.fields.b.selector",
        ),
    ],
)
def test_bad_specs_name_the_field(spec: dict[str, object], path: str) -> None:
    with pytest.raises(SpecError) as e:
        compile_spec(spec)
    assert e.value.path == path


@pytest.mark.parametrize(
    ("text", "locale", "expected"),
    [
        ("1,299.00", None, 1299.0),
        ("1.299,00 €", "de-DE", 1299.0),
        ("1.299,00 €", None, 1299.0),
        ("€ 12,5", None, 12.5),
        ("CHF 1'299.50", None, 1299.5),
        ("1 299,99 zł", "pl", 1299.99),
        ("-3.5", None, -3.5),
        ("1,299", None, 1299.0),
        ("1.299", "de", 1299.0),
        ("$0.99", "en-US", 0.99),
    ],
)
def test_locale_tolerant_numbers(text: str, locale: str | None, expected: float) -> None:
    assert parse_number(text, locale) == expected


@pytest.mark.parametrize(
    ("text", "locale", "expected"),
    [
        ("2024-03-05", None, "2024-03-05T00:00:00"),
        ("2024-03-05T10:00:00Z", None, "2024-03-05T10:00:00+00:00"),
        ("Tue, 05 Mar 2024 10:00:00 GMT", None, "2024-03-05T10:00:00+00:00"),
        ("05.03.2024", None, "2024-03-05T00:00:00"),
        ("03/05/2024", "en-US", "2024-03-05T00:00:00"),
        ("05/03/2024", "fr", "2024-03-05T00:00:00"),
        ("March 5, 2024", None, "2024-03-05T00:00:00"),
        ("5 mars 2024", None, "2024-03-05T00:00:00"),
    ],
)
def test_dates_to_iso(text: str, locale: str | None, expected: str) -> None:
    assert parse_datetime(text, locale).isoformat() == expected


def test_charsets_header_meta_detection() -> None:
    assert decode_body(CP1252_HTML, None) == (CP1252_HTML.decode("cp1252"), "windows-1252")
    text, enc = decode_body(SJIS_HTML, "Shift_JIS")
    assert "日本語のページです" in text and enc == "shift_jis"
    text, enc = decode_body(SJIS_HTML * 20, None)
    assert "東京都港区" in text
    assert decode_body("é".encode("latin-1"), "iso-8859-1") == ("é", "windows-1252")
    assert decode_body("ü".encode(), None) == ("ü", "utf-8")


def test_retry_after_seconds_and_http_date() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412490.0) == 0.0
    assert parse_retry_after("soon") is None


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://10.1.2.3/",
        "http://192.168.0.1/",
        "http://172.16.5.4/",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/",
        "http://224.0.0.1/",
        "http://[::1]/",
        "http://[fe80::1]/",
        "http://[fc00::1]/",
        "http://[::ffff:10.0.0.1]/",
        "http://0.0.0.0/",
        "http://metadata.google.internal/",
        "file:///etc/passwd",
    ],
)
def test_egress_denies_non_public_targets(url: str) -> None:
    with pytest.raises(EgressDeniedError):
        EgressPolicy().check_url(url)


def test_egress_allow_lists_private_switch_and_trusted_endpoints() -> None:
    EgressPolicy().check_url("http://93.184.215.14/")
    open_private = EgressPolicy(allow_private_networks=True)
    open_private.check_url("http://10.1.2.3/")
    with pytest.raises(EgressDeniedError):  # metadata stays denied even then
        open_private.check_url("http://169.254.169.254/")
    listed = EgressPolicy(allow_domains=["example.com"])
    listed.check_url("https://www.example.com/x")
    for bad in ("https://example.org/", "https://notexample.com/", "http://93.184.215.14/"):
        with pytest.raises(EgressDeniedError):
            listed.check_url(bad)
    with pytest.raises(EgressDeniedError):  # a request can narrow the list, not widen it
        listed.check_url("https://www.example.com/", ["shop.example.com"])
    trusted = EgressPolicy(trusted_endpoints=[("127.0.0.1", 8080)])
    trusted.check_address("127.0.0.1", 8080)
    with pytest.raises(EgressDeniedError):
        trusted.check_address("127.0.0.1", 8081)


async def test_resolved_private_address_is_denied_at_connect() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return ["93.184.215.14", "10.0.0.5"]  # one bad answer taints the host

    fetcher = FetchTool(EgressPolicy(resolver=resolver))
    try:
        with pytest.raises(EgressDeniedError) as e:
            await fetcher.fetch("http://rebind.example/", timeout=5, respect_robots=False)
        assert e.value.context["address"] == "10.0.0.5"
    finally:
        await fetcher.aclose()


async def test_body_cap_with_mock_transport() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/html"}, content=b"x" * 2048)

    fetcher = FetchTool(
        EgressPolicy(allow_private_networks=True),
        limits=FetchLimits(max_bytes=1024),
        transport=httpx.MockTransport(handler),
    )
    try:
        with pytest.raises(PayloadTooLargeError):
            await fetcher.fetch("http://site.example/", timeout=5, respect_robots=False)
    finally:
        await fetcher.aclose()


async def test_artifacts_are_content_addressed_and_tenant_scoped(tmp_path: Path) -> None:
    store = FileArtifactStore(tmp_path)
    ref = await store.put("acme", b"<html>hi</html>", "text/html")
    again = await store.put("acme", b"<html>hi</html>", "text/html")
    assert ref == again and ref.size_bytes == 15 and ref.uri.startswith("file://")
    assert f"/artifacts/acme/{ref.sha256[:2]}/{ref.sha256}" in ref.uri
    assert await store.get("acme", ref) == b"<html>hi</html>"
    with pytest.raises(AccessDeniedError):
        await store.get("globex", ref)
    sneaky = ref.uri.replace("/acme/", "/globex/../acme/")
    with pytest.raises(AccessDeniedError):
        await store.get("globex", sneaky)
    weird = await store.put("../evil", b"x")
    assert f"/artifacts/..%2Fevil/{weird.sha256[:2]}/" in weird.uri
    assert await store.get("../evil", weird) == b"x"
