"""The whole visible page as Markdown and as plain text (``content: "page"``).

trafilatura renders Markdown only from its own intermediate tree, which it
builds for the main content after pruning boilerplate; "page" mode wants
everything a reader sees, navigation and footer included. No HTML-to-Markdown
library is installed, so this is a small renderer over the lxml tree that
trafilatura already parsed: headings, paragraphs, lists (nested), links made
absolute, tables as pipe tables, ``pre`` as fenced code, block quotes. What a
browser does not show (``script``, ``style``, ``template``, ``head``, elements
marked ``hidden`` or ``aria-hidden``) is skipped.

Bounded: one pass over the elements; lxml's HTML parser stops nesting at 256
levels, and the walk also stops descending at :data:`MAX_DEPTH` (deeper text
is kept flat), so recursion stays far below Python's limit.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urljoin

MAX_DEPTH = 300

_SKIP = frozenset(
    {"script", "style", "noscript", "template", "head", "svg", "math", "iframe", "object",
     "canvas", "select", "option", "datalist", "title", "meta", "link", "input", "textarea"}
)  # fmt: skip
_BLOCK = frozenset(
    {"p", "div", "section", "article", "main", "header", "footer", "nav", "aside", "form",
     "figure", "figcaption", "address", "details", "summary", "dl", "dt", "dd", "fieldset",
     "body", "html", "center", "hgroup", "legend", "caption"}
)  # fmt: skip
_HEADINGS = {f"h{n}": n for n in range(1, 7)}


def render(root: Any, base_url: str) -> tuple[str, str]:
    """``(markdown, text)`` of every visible element under ``root`` (an lxml element)."""
    md = _Renderer(base_url, plain=False)
    md.block(root, 0, 0)
    text = _Renderer(base_url, plain=True)
    text.block(root, 0, 0)
    return md.result(), text.result()


class _Renderer:
    def __init__(self, base_url: str, plain: bool) -> None:
        self.base_url = base_url
        self.plain = plain
        self.blocks: list[str] = []
        self.inline: list[str] = []

    def result(self) -> str:
        self.flush()
        return ("\n" if self.plain else "\n\n").join(self.blocks)

    def flush(self, prefix: str = "") -> None:
        text = " ".join("".join(self.inline).split())
        self.inline = []
        if text:
            self.blocks.append(prefix + text)

    # -- block level -------------------------------------------------------

    def block(self, el: Any, depth: int, list_depth: int) -> None:
        """Render ``el``'s content (not its tail) at block level."""
        if el.text:
            self.inline.append(el.text)
        for child in el:
            self.child(child, depth + 1, list_depth)
            if child.tail:
                self.inline.append(child.tail)

    def child(self, el: Any, depth: int, list_depth: int) -> None:
        tag = el.tag if isinstance(el.tag, str) else None
        if tag is None or _hidden(el, tag):
            return
        if depth > MAX_DEPTH:
            self.inline.append(" " + _flat(el) + " ")
            return
        if tag in _HEADINGS:
            self.flush()
            self.span(el, depth)
            self.flush("" if self.plain else "#" * _HEADINGS[tag] + " ")
        elif tag in ("ul", "ol"):
            self.flush()
            self.items(el, depth, list_depth, ordered=tag == "ol")
        elif tag == "table":
            self.flush()
            self.table(el)
        elif tag == "pre":
            self.flush()
            code = el.text_content().strip("\n")
            if code.strip():
                self.blocks.append(code if self.plain else f"```\n{code}\n```")
        elif tag == "blockquote":
            self.flush()
            inner = _Renderer(self.base_url, self.plain)
            inner.block(el, depth, list_depth)
            quoted = inner.result()
            if quoted:
                self.blocks.append(quoted if self.plain else "> " + quoted.replace("\n", "\n> "))
        elif tag == "hr":
            self.flush()
            if not self.plain:
                self.blocks.append("---")
        elif tag == "br":
            self.inline.append("\n")
            self.flush()
        elif tag in _BLOCK or tag == "li":
            self.flush()
            self.block(el, depth, list_depth)
            self.flush()
        else:
            self.span(el, depth)

    def items(self, el: Any, depth: int, list_depth: int, ordered: bool) -> None:
        start = len(self.blocks)
        self._items(el, depth, list_depth, ordered)
        if list_depth == 0 and len(self.blocks) > start + 1:  # one tight list, not loose items
            self.blocks[start:] = ["\n".join(self.blocks[start:])]

    def _items(self, el: Any, depth: int, list_depth: int, ordered: bool) -> None:
        indent = "  " * list_depth
        n = 0
        for li in el:
            if not isinstance(li.tag, str) or _hidden(li, li.tag):
                continue
            if li.tag != "li":  # stray content directly inside a list
                self.child(li, depth + 1, list_depth)
                self.flush()
                continue
            n += 1
            marker = f"{indent}{n}. " if ordered else f"{indent}- "
            if li.text:
                self.inline.append(li.text)
            for c in li:
                if isinstance(c.tag, str) and c.tag in ("ul", "ol"):
                    self.flush(marker)
                    marker = ""
                    self._items(c, depth + 2, list_depth + 1, ordered=c.tag == "ol")
                else:
                    self.child(c, depth + 2, list_depth + 1)
                if c.tail:
                    self.inline.append(c.tail)
            self.flush(marker)

    def table(self, el: Any) -> None:
        rows: list[list[str]] = []
        for tr in el.iter("tr"):
            cells = [
                " ".join(_inline_text(td, self.base_url, self.plain).split()).replace("|", "\\|")
                for td in tr
                if isinstance(td.tag, str) and td.tag in ("td", "th")
            ]
            if any(cells):
                rows.append(cells)
        if not rows:
            return
        if self.plain:
            self.blocks.extend(" | ".join(r) for r in rows)
            return
        width = max(len(r) for r in rows)
        lines = ["| " + " | ".join(r + [""] * (width - len(r))) + " |" for r in rows]
        lines.insert(1, "|" + "---|" * width)
        self.blocks.append("\n".join(lines))

    # -- inline level ------------------------------------------------------

    def span(self, el: Any, depth: int) -> None:
        """Inline content of ``el`` (a link, emphasis, plain span) into the paragraph."""
        self.inline.append(_inline_text(el, self.base_url, self.plain, depth))


def _inline_text(el: Any, base_url: str, plain: bool, depth: int = 0) -> str:
    parts: list[str] = []
    tag = el.tag if isinstance(el.tag, str) else ""
    if el.text:
        parts.append(el.text)
    for c in el:
        ctag = c.tag if isinstance(c.tag, str) else None
        if ctag is not None and not _hidden(c, ctag):
            if ctag == "br":
                parts.append(" ")
            elif depth > MAX_DEPTH:
                parts.append(_flat(c))
            else:
                parts.append(_inline_text(c, base_url, plain, depth + 1))
        if c.tail:
            parts.append(c.tail)
    text = "".join(parts)
    if plain or not text.strip():
        return text
    # the markup hugs the words; spaces inside the element stay outside it
    inner = " ".join(text.split())
    lead = " " if text[0].isspace() else ""
    trail = " " if text[-1].isspace() else ""
    href = (el.get("href") or "").strip()
    if tag == "a" and href and not href.startswith(("#", "javascript:")):
        return f"{lead}[{inner}]({urljoin(base_url, href)}){trail}"
    marks = {"strong": "**", "b": "**", "em": "*", "i": "*", "code": "`"}
    if tag in marks:
        return f"{lead}{marks[tag]}{inner}{marks[tag]}{trail}"
    return text


def _hidden(el: Any, tag: str) -> bool:
    return (
        tag in _SKIP
        or el.get("hidden") is not None
        or el.get("aria-hidden") == "true"
        or "display:none" in (el.get("style") or "").replace(" ", "")
    )


def _flat(el: Any) -> str:
    return " ".join(str(el.text_content()).split())
