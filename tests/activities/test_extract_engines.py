"""The extraction engine on lxml's own tree answers exactly as on BeautifulSoup's.

:mod:`aiworker.activities.tools.lxml_tree` serves the specs it can serve with
BeautifulSoup's meaning; these tests generate pages (misnested and unclosed
tags, comments, scripts, styles, templates, ruby text, every whitespace
BeautifulSoup splits classes on, entities, a ``<base>``) and specs from its
selector subset (attribute tests included), and compare its extraction with BeautifulSoup's field by
field, warnings included.
"""

from __future__ import annotations

import html
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiworker.activities.tools.extract import HtmlParser
from aiworker.activities.tools.lxml_tree import _SPACES, parse, selector_xpath, serves

P = HtmlParser()
URL = "https://shop.example/list/"

TAGS = ["div", "p", "span", "a", "ul", "li", "b", "section", "td", "tr", "table", "h1"]
HIDDEN = ["script", "style", "rt", "rp", "ruby"]
CLASSES = ["x", "y", "item", "price", "Price"]
# presence and equality; rel is multi-valued on a and matched without case, class
# multi-valued everywhere, id and href neither
ATTRIBUTE_TESTS = [
    "[rel]",
    "[rel=next]",
    "[REL=Next]",
    "[rel='nofollow']",
    '[rel=""]',
    "[href]",
    '[href="/p/1"]',
    "[id=main]",
    "[class=x]",
    "[datetime]",
    "[lang=EN]",
    "[lang='']",
]
# the separators BeautifulSoup splits class on: XPath-safe ones and ASCII's
SPACES = [" ", "  ", "\t", "\n", "\r\n", "\xa0", "\u3000", "\u2009", "\x85"]
WORDS = ["alpha", "Beta", "12.50", "1,234", "yes", "no", "&amp;", "&lt;b&gt;", "caf\xe9", ""]


@st.composite
def attrs(draw: Any) -> str:
    out = []
    if draw(st.booleans()):
        names = draw(st.lists(st.sampled_from(CLASSES), max_size=3))
        sep = draw(st.sampled_from(SPACES))
        out.append(f'class="{draw(st.sampled_from(SPACES))}{sep.join(names)}"')
    if draw(st.booleans()):
        out.append(f'id="{draw(st.sampled_from(["main", "x", "Main", "main "]))}"')
    if draw(st.booleans()):
        out.append(f'href="{draw(st.sampled_from(["/p/1", "../up", "https://o.example/", ""]))}"')
    if draw(st.booleans()):
        rels = ["next", " nofollow  next ", "", "Next", "nofollow", "NOFOLLOW\xa0"]
        out.append(f'rel="{draw(st.sampled_from(rels))}"')
    if draw(st.booleans()):
        out.append(f'lang="{draw(st.sampled_from(["en", "EN", "en-GB"]))}"')
    if draw(st.booleans()):
        out.append('datetime="2026-11-29"')
    return (" " + " ".join(out)) if out else ""


def nodes(depth: int) -> st.SearchStrategy[str]:
    text = st.lists(st.sampled_from(WORDS + SPACES), max_size=3).map("".join)
    comment = text.map(lambda t: f"<!-- {t} -->")
    if depth == 0:
        return st.one_of(text, comment)
    child = nodes(depth - 1)

    @st.composite
    def element(draw: Any) -> str:
        tag = draw(st.sampled_from(TAGS + HIDDEN))
        inner = "".join(draw(st.lists(child, max_size=3)))
        close = draw(st.sampled_from([f"</{tag}>", f"</{tag}>", ""]))  # unclosed sometimes
        return f"<{tag}{draw(attrs())}>{inner}{close}"

    return st.one_of(text, comment, element())


@st.composite
def pages(draw: Any) -> str:
    body = "".join(draw(st.lists(nodes(3), min_size=1, max_size=5)))
    base = draw(st.sampled_from(["", '<base href="/root/">', "<base>"]))
    stray = draw(st.sampled_from(["", "</div></p>", "<p><div>x</p></div>"]))
    return f"<html><head>{base}<title>t</title></head><body>{body}{stray}</body></html>"


def compounds() -> st.SearchStrategy[str]:
    tag = st.sampled_from(["", "*", "div", "P", "span", "a", "li", "script", "rt", "td"])
    parts = st.lists(
        st.sampled_from([".x", ".y", ".item", ".Price", "#main", "#x", *ATTRIBUTE_TESTS]),
        max_size=2,
    ).map("".join)
    # an attribute test whose meaning depends on the element (rel without a type) is
    # BeautifulSoup's alone: not in the subset
    return st.tuples(tag, parts).map("".join).filter(lambda c: bool(c) and _served(c))


def _served(selector: str) -> bool:
    return selector_xpath(selector) is not None


def selectors() -> st.SearchStrategy[str]:
    one = st.lists(
        st.tuples(st.sampled_from([" ", " > ", ">"]), compounds()), min_size=1, max_size=3
    ).map(lambda steps: "".join(c + s for c, s in steps)[len(steps[0][0]) :])
    return st.lists(one, min_size=1, max_size=2).map(", ".join)


@st.composite
def fields(draw: Any, depth: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i in range(draw(st.integers(1, 3))):
        f: dict[str, Any] = {"selector": draw(selectors())}
        kind = draw(st.sampled_from(["text", "attr", "number", "url", "date", "bool", "rec"]))
        if kind == "attr":
            f["attr"] = draw(st.sampled_from(["class", "id", "rel", "href", "missing"]))
        elif kind == "number":
            f["type"] = "number"
        elif kind == "url":
            f["type"] = "url"
        elif kind == "date":
            f["type"] = "date"
        elif kind == "bool":
            f["type"] = "boolean"
        elif kind == "rec" and depth > 0:
            f["fields"] = draw(fields(depth - 1))
        f["many"] = draw(st.booleans())
        f["required"] = draw(st.booleans())
        if draw(st.booleans()) and depth == 0:
            del f["selector"]  # the element itself
        out[f"f{i}"] = f
    return out


def both(page: str, spec: dict[str, Any]) -> tuple[Any, Any]:
    compiled = P.compile(spec)
    assert serves(compiled), spec
    assert parse(page) is not None  # the lxml engine really answers this page
    fast = P.extract(page, compiled, URL)
    soup = P.extract_from(P.parse(page), compiled, URL, source=page)
    return fast, soup


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(page=pages(), spec=fields().map(lambda f: {"fields": f}))
def test_lxml_engine_extracts_what_beautifulsoup_extracts(page: str, spec: dict[str, Any]) -> None:
    fast, soup = both(page, spec)
    assert fast.data == soup.data
    assert fast.warnings == soup.warnings
    assert fast.missing_required == soup.missing_required


def test_text_skips_what_beautifulsoup_keeps_apart() -> None:
    """Comments, processing instructions, scripts, styles and ruby text are not an
    element's text; asked of a script itself (raw text: no elements in it), its text
    is."""
    page = (
        "<html><body><div id='d'>a<!-- c -->b<script>s()</script>c<style>x{}</style>"
        "<ruby>漢<rt>kan</rt><rp>(</rp></ruby><span>d</span>e<?pi x?>f</div>"
        "<script id='s'>run()<b>in</b></script><rt id='r'>k<style>z</style>j</rt>"
        "</body></html>"
    )
    spec = {"fields": {"d": "#d", "s": "#s", "r": "#r", "b": "script b"}}
    fast, soup = both(page, spec)
    assert fast.data == soup.data
    assert fast.data == {"d": "a b c 漢 d e f", "s": "run()<b>in</b>", "r": "k j", "b": None}


def test_template_pages_go_to_beautifulsoup() -> None:
    """soupsieve keeps a template's contents out of the document: such a page is
    extracted on BeautifulSoup's tree, with its meaning."""
    page = "<html><body><template><p><div>x</p></div></template><div>y</div></body></html>"
    assert parse(page) is None
    got = P.extract(page, P.compile({"fields": {"d": {"selector": "div", "many": True}}}), URL)
    assert got.data == {"d": ["y"]}


def test_classes_split_on_every_space_beautifulsoup_splits_on() -> None:
    page = "<html><body><p class='x\xa0price'>1</p><p class='x\u3000y'>2</p></body></html>"
    fast, soup = both(page, {"fields": {"p": {"selector": ".price"}, "y": ".y", "c": {
        "selector": "p", "attr": "class", "many": True}}})  # fmt: skip
    assert fast.data == soup.data == {"p": "1", "y": "2", "c": ["x price", "x y"]}


def test_nested_fields_are_scoped_like_soupsieve() -> None:
    """Under a container, a selector matches the container's descendants in the whole
    page's context ("section li" from an li's parent ul, which is in a section), never
    the container itself (the root element as a container included)."""
    page = (
        "<html><body><section><ul class='x'><li>1</li><li>2</li></ul></section>"
        "<ul class='x'><li>3</li></ul></body></html>"
    )
    inner = {"items": {"selector": "section li", "many": True}, "self": {"selector": "ul"}}
    spec = {"fields": {"lists": {"selector": "ul.x", "many": True, "fields": inner}}}
    fast, soup = both(page, spec)
    assert fast.data == soup.data
    assert fast.data["lists"][0]["items"] == ["1", "2"] and fast.data["lists"][1]["items"] == []
    every = {"all": {"selector": "*", "many": True}}
    spec = {"fields": {"top": {"selector": "html, p", "fields": every}}}
    fast, soup = both(page, spec)
    assert fast.data == soup.data and len(fast.data["top"]["all"]) == 7  # body and below


def test_what_the_lxml_engine_leaves_to_beautifulsoup() -> None:
    for selector in (
        "a[href^=x]",
        "[rel=tag]",
        'a[rel="a b"]',
        "a[href='x' i]",
        'a[title="\\"]',
        "li:nth-child(2)",
        "a > > b",
        "> a",
        "a >",
        "\\61",
        "é",
        "",
        "-x",
    ):
        assert selector_xpath(selector) is None, selector
    for selector in ("div.x#y > p", "*", "A B, c>d", "h1.title", "p.category > a", "a[rel=tag]"):
        assert selector_xpath(selector) is not None, selector
    assert not serves(P.compile({"fields": {"h": {"selector": "div", "html": True}}}))
    assert not serves(P.compile({"metadata": True}))
    assert not serves(P.compile({"fields": {"a": "a[href^=x]"}}))
    assert serves(P.compile({"fields": {"a": "a[href]", "t": "span.byline a[rel=tag]"}}))
    assert not serves(P.compile({"fields": {"page": {"type": "boolean"}}}))  # no selector
    # a class split on a form feed: XPath cannot say it, BeautifulSoup reads the page
    page = "<html><body><p class='x\x0cy'>1</p></body></html>"
    assert parse(page) is None
    got = P.extract(page, P.compile({"fields": {"y": ".y"}}), URL)
    assert got.data == {"y": "1"}


def test_the_spaces_are_the_ones_python_splits_on() -> None:
    """BeautifulSoup splits classes with ``\\S+``: the engine's list is Python's ``\\s``."""
    assert set(_SPACES) == {chr(c) for c in range(0x110000) if re.match(r"\s", chr(c))}


def test_entities_and_a_byte_order_mark() -> None:
    page = "\ufeff<html><body><h1>Caf&eacute; &amp; Bar&nbsp;2</h1></body></html>"
    fast, soup = both(page, {"fields": {"h": "h1"}})
    assert fast.data == soup.data == {"h": html.unescape("Café & Bar\xa02").replace("\xa0", " ")}
