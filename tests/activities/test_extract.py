"""Fast unit tests of the extraction engine (the parse_html tool)."""

from __future__ import annotations

import pytest
from fixtures.scrape_site import ARTICLE_HTML, CHANGED_HTML, listing_html

from aiworker.activities.tools.convert import parse_datetime, parse_number
from aiworker.activities.tools.extract import HtmlParser
from aiworker.schemas.extraction_spec import SpecError, compile_spec

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


@pytest.mark.parametrize(
    "head",
    ['<base href="https://cdn.example/x/">', '<BASE\n HREF="https://cdn.example/x/">', ""],
)
def test_base_href_with_and_without_the_source_text(head: str) -> None:
    """Links resolve against ``<base href>`` whatever its case; given the source text,
    a page that never says ``<base`` skips the search and resolves against its URL."""
    page = f"<html><head>{head}</head><body><a href='p/1'>one</a></body></html>"
    spec = compile_spec({"fields": {"link": {"selector": "a", "type": "url"}}})
    expected = "https://cdn.example/x/p/1" if head else "https://site.example/list/p/1"
    for source in (None, page):
        soup = P.parse(page)
        got = P.extract_from(soup, spec, "https://site.example/list/", source=source)
        assert got.data["link"] == expected
    assert P.extract(page, spec, "https://site.example/list/").data["link"] == expected
