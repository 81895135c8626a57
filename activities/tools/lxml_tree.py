"""The extraction engine's page tree on lxml alone, for specs that mean the same there.

:mod:`~aiworker.activities.tools.extract` parses pages with BeautifulSoup on
the lxml builder, which builds its tree from the events of lxml's HTML
parser. Building that Python tree is most of an extraction's cost: 0.5 ms of
a 5.7 KB page, against 0.02 ms for lxml's own tree of the same page
(``bench/crawl.py``). For a spec whose every selector is in a simple subset
and that asks for no inner HTML and no metadata, this module answers the
extraction's questions on lxml's own tree, with BeautifulSoup's meaning:

- **Elements**: the same parser (``etree.HTMLParser``, ``recover=True``),
  with the same options, fed the same text (a leading byte order mark
  dropped, as BeautifulSoup drops it): the same tree.
- **Selectors**: type (``div``, any case), ``*``, ``.class``, ``#id``,
  attribute presence (``[rel]``) and equality (``a[rel=tag]``,
  ``[itemprop="price"]``: a value without spaces or escapes), compounds of
  them, the descendant and child (``>``) combinators and selector lists,
  translated to XPath here. A class matches one of the
  attribute's whitespace-separated words, split on the characters
  BeautifulSoup splits ``class`` on (Python's ``\\s``); an id matches the
  attribute exactly; a selector asked under a container matches the
  container's descendants in the whole document's context, as soupsieve
  scopes it. An attribute's value is compared as soupsieve compares it: a
  multi-valued attribute's words joined with one space, the attributes HTML
  matches without case in ASCII lowercase (an attribute that is multi-valued
  on some elements only, asked without a type, goes to BeautifulSoup).
  Anything else (other attribute operators, pseudo-classes, escapes,
  non-ASCII names) goes to BeautifulSoup.
- **Text**: the strings BeautifulSoup's ``get_text`` counts: no comments or
  processing instructions, and nothing inside ``script``, ``style``,
  ``template``, ``rt`` or ``rp`` unless the element asked is one of those
  (BeautifulSoup keeps their strings in classes of their own).
- **Attributes**: the multi-valued ones (``class``, ``rel``, ...: the
  builder's own table) split and joined with one space, as BeautifulSoup
  returns and the extractor joins them.

Pages go to BeautifulSoup where the meanings part: one with a ``<template>``
(soupsieve keeps its contents out of the document: no selector reaches them,
and none of their ancestors is above them), and one with a vertical tab, form
feed or an ASCII separator (``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1f``)
anywhere (they split classes there, and an XPath literal cannot hold them).
``tests/activities/test_extract_engines.py`` compares both engines on
generated pages and specs.

Written here rather than with cssselect: its class test splits on XML's
whitespace only (``normalize-space``), and it is not a dependency.
"""

from __future__ import annotations

import bisect
import re
from functools import lru_cache
from typing import Any

from bs4.builder import HTMLTreeBuilder
from bs4.element import nonwhitespace_re
from lxml import etree  # type: ignore[import-untyped]
from soupsieve.css_parser import HTML_CASE_INSENSITIVE_ATTRIBUTES

from aiworker.schemas.extraction_spec import CompiledSpec, FieldSpec

_IDENT = r"-?[A-Za-z_][A-Za-z0-9_-]*"
# an attribute selector this engine serves: presence, or ``=`` with an identifier or
# a quoted value without quotes, backslashes or spaces (anything else: BeautifulSoup)
_ATTR = rf"""\[({_IDENT})(?:=({_IDENT}|"[^"'\\\s]*"|'[^"'\\\s]*'))?\]"""
_COMPOUND = re.compile(rf"(?P<tag>\*|{_IDENT})?(?P<rest>(?:[.#]{_IDENT}|{_ATTR})*)")
_PART = re.compile(rf"([.#])({_IDENT})|{_ATTR}")
_CHILD = re.compile(r"\s*>\s*")
# What BeautifulSoup splits multi-valued attributes on (``\S+``'s complement) and an
# XPath literal can hold; the rest (_ODD_SPACE) sends the page to BeautifulSoup.
_SPACES = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_ODD_SPACE = re.compile("[\x0b\x0c\x1c-\x1f]")
# soupsieve keeps a <template>'s contents out of the document (no selector reaches
# them, no ancestor above them): such a page goes to BeautifulSoup
_TEMPLATE = re.compile(r"<template", re.IGNORECASE)
_XPATH_SPACES = "".join(c for c in _SPACES if not _ODD_SPACE.match(c))
# the strings BeautifulSoup keeps apart, by the element they are inside
_CONTAINERS: dict[str, type] = dict(HTMLTreeBuilder.DEFAULT_STRING_CONTAINERS)
_LIST_ATTRS: dict[str, set[str]] = HTMLTreeBuilder.DEFAULT_CDATA_LIST_ATTRIBUTES
_BOM = "\N{BYTE ORDER MARK}"
_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ASCII_LOWER = str.maketrans(_UPPER, _UPPER.lower())


def _compound_xpath(compound: str, axis: str) -> str | None:
    """One compound selector as an XPath step on ``axis``, or None outside the subset."""
    m = _COMPOUND.fullmatch(compound)
    if m is None or not compound:
        return None
    tag = m["tag"].lower() if m["tag"] and m["tag"] != "*" else None
    step = f"{axis}::{tag or '*'}"
    for kind, name, attr, value in _PART.findall(m["rest"]):
        if kind == ".":
            step += f"[contains(concat(' ', {_words('class')}, ' '), ' {name} ')]"
        elif kind == "#":
            step += f"[@id = '{name}']"
        else:
            test = _attribute_test(attr.lower(), value, tag)
            if test is None:
                return None
            step += test
    return step


def _words(attr: str) -> str:
    """The XPath of attribute ``attr`` with every space BeautifulSoup splits on made
    a plain space."""
    return f"translate(@{attr}, '{_XPATH_SPACES}', '{' ' * len(_XPATH_SPACES)}')"


def _attribute_test(name: str, value: str, tag: str | None) -> str | None:
    """``[name]`` or ``[name=value]`` as soupsieve matches it on an HTML element of
    ``tag`` (None: any), as an XPath predicate; None where the meaning depends on a
    tag the selector does not name.

    soupsieve compares a multi-valued attribute (the builder's table: ``class``
    anywhere, ``rel`` on ``a``, ...) as its words joined with one space, and the
    values of the attributes HTML matches without case (``rel``, ``type``, ``lang``,
    ...: its ``HTML_CASE_INSENSITIVE_ATTRIBUTES``) in ASCII lowercase.
    """
    if not value:
        return f"[@{name}]"
    if value[0] in "\"'":
        value = value[1:-1]
    if tag is None and any(name in names for key, names in _LIST_ATTRS.items() if key != "*"):
        return None  # a list on some elements only: which, the selector does not say
    listed = name in _LIST_ATTRS["*"] or name in _LIST_ATTRS.get(tag or "", set())
    actual = f"normalize-space({_words(name)})" if listed else f"@{name}"
    if name in HTML_CASE_INSENSITIVE_ATTRIBUTES:
        actual = f"translate({actual}, '{_UPPER}', '{_UPPER.lower()}')"
        value = value.translate(_ASCII_LOWER)
    # the attribute itself first: a function of a missing one is the empty string
    return f"[@{name} and {actual} = '{value}']"


@lru_cache(maxsize=1024)
def selector_xpath(selector: str) -> etree.XPath | None:
    """``selector`` as a compiled XPath over the document (from its root element), or
    None when it is outside the subset this engine serves."""
    paths = []
    for one in selector.split(","):
        tokens = _CHILD.sub(" > ", one.strip()).split()
        if not tokens or tokens[0] == ">" or tokens[-1] == ">":
            return None
        steps: list[str] = []
        axis = "descendant-or-self"
        for token in tokens:
            if token == ">":
                if axis == "child":
                    return None  # "a > > b"
                axis = "child"
                continue
            step = _compound_xpath(token, axis)
            if step is None:
                return None
            steps.append(step)
            axis = "descendant"
        paths.append("/".join(steps))
    try:
        return etree.XPath(" | ".join(paths))
    except etree.XPathError:  # a name CSS allows and XPath does not ("-x")
        return None


def serves(spec: CompiledSpec) -> bool:
    """Whether this engine extracts ``spec`` exactly as BeautifulSoup would (a field
    of the page itself, without a selector, is BeautifulSoup's document object)."""
    return (
        not spec.metadata
        and all(fs.selector is not None for fs in spec.fields)
        and _fields_served(spec.fields)
    )


def _fields_served(fields: tuple[FieldSpec, ...]) -> bool:
    for fs in fields:
        if fs.html or (fs.attr is not None and "{" in fs.attr):
            return False
        if fs.selector is not None and selector_xpath(fs.selector) is None:
            return False
        if fs.fields is not None and not _fields_served(fs.fields):
            return False
    return True


class LxmlPage:
    """One page's lxml tree, asked as :mod:`~aiworker.activities.tools.extract` asks
    a BeautifulSoup tree (build with :func:`parse`). The page object itself is the
    scope of the spec's top-level fields, as BeautifulSoup's document object is:
    the whole tree, its root element included."""

    def __init__(self, root: Any) -> None:
        self.root = root
        # document order of every node, built on the first scoped selection
        self._order: dict[Any, int] | None = None
        # per selector: the matches in the whole document and their positions
        self._matches: dict[str, tuple[list[Any], list[int] | None]] = {}

    def base_href(self) -> str | None:
        """The first ``<base>`` element's ``href``, as ``soup.find("base", href=True)``."""
        for el in self.root.iter("base"):
            href = el.get("href")
            if href is not None:
                return str(href)
        return None

    def select(self, scope: Any, fs: FieldSpec) -> list[Any]:
        """The elements ``fs.selector`` matches under ``scope`` (all for a list or a
        record field, else the first), in document order."""
        if fs.selector is None:
            return [scope]
        found = self._in_document(fs.selector)
        if scope is not self:
            found = self._within(scope, fs.selector, found)
        if fs.many or fs.fields is not None:
            return found
        return found[:1]

    def _in_document(self, selector: str) -> list[Any]:
        known = self._matches.get(selector)
        if known is None:
            xpath = selector_xpath(selector)
            assert xpath is not None  # serves() checked every selector
            known = (list(xpath(self.root)), None)
            self._matches[selector] = known
        return known[0]

    def _within(self, scope: Any, selector: str, found: list[Any]) -> list[Any]:
        """The matches that are descendants of ``scope`` (never ``scope`` itself)."""
        if self._order is None:
            self._order = {node: i for i, node in enumerate(self.root.iter())}
        order = self._order
        matches, positions = self._matches[selector]
        if positions is None:
            positions = [order[el] for el in matches]
            self._matches[selector] = (matches, positions)
        first = order[scope]
        last = first + sum(1 for _ in scope.iterdescendants())
        lo = bisect.bisect_right(positions, first)
        hi = bisect.bisect_right(positions, last)
        return found[lo:hi]

    @staticmethod
    def attr(el: Any, name: str) -> str | None:
        """Attribute ``name``; a multi-valued one's words joined by one space."""
        value = el.get(name)
        if value is None:
            return None
        if name in _LIST_ATTRS["*"] or name in _LIST_ATTRS.get(el.tag, set()):
            return " ".join(nonwhitespace_re.findall(value))
        return str(value)

    @staticmethod
    def text(el: Any) -> str:
        """The strings of ``el`` BeautifulSoup's ``get_text(" ")`` joins, whitespace
        collapsed."""
        want = _CONTAINERS.get(el.tag)
        if want is None:
            for up in el.iterancestors():
                if up.tag in _CONTAINERS:
                    return ""  # every string under it is of its container's class
        pieces: list[str] = []
        # (a tail string, None) or (None, an element), with the class its strings have
        stack: list[tuple[str | None, Any, type | None]] = [(None, el, want)]
        while stack:
            tail, node, kind = stack.pop()
            if tail is not None:
                pieces.append(tail)
                continue
            if kind is want and node.text:
                pieces.append(node.text)
            # reversed onto the stack: each child, then its tail (the parent's string)
            for child in reversed(node):
                if child.tail and kind is want:
                    stack.append((child.tail, None, kind))
                if isinstance(child.tag, str):  # comments and instructions count nothing
                    stack.append((None, child, _CONTAINERS.get(child.tag, kind)))
        return " ".join(" ".join(pieces).split())


def parse(text: str) -> LxmlPage | None:
    """``text``'s tree as BeautifulSoup's lxml builder parses it, or None where this
    engine does not answer for the page (a template, odd whitespace, a page lxml
    refuses)."""
    if _ODD_SPACE.search(text) or _TEMPLATE.search(text):
        return None
    if text.startswith(_BOM):
        text = text[1:]
    parser = etree.HTMLParser(recover=True)
    try:
        parser.feed(text)
        root = parser.close()
    except (etree.LxmlError, ValueError):
        return None
    if root is None:
        return None
    return LxmlPage(root)


__all__ = ["LxmlPage", "parse", "selector_xpath", "serves"]
