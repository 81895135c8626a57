"""The docs stand alone: every relative link in the README, docs/, deploy/README
and ARCHITECTURE.md resolves to a file in the repository (and an anchor to a
heading), links that leave the repository go to public sites, and nothing
points at team documents outside it."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [
        REPO / "README.md",
        REPO / "CHANGELOG.md",
        REPO / "ARCHITECTURE.md",
        REPO / "deploy" / "README.md",
        *(REPO / "docs").rglob("*.md"),
    ]
)
# Inline links and images `[text](target)`, and autolinks `<https://...>`.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|<(https?://[^>\s]+)>")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LOCAL_HOSTS = re.compile(r"^(localhost|127\.|0\.0\.0\.0|10\.|192\.168\.|\[::1\])")


def prose(text: str) -> str:
    """The page without code blocks and code spans: links there are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]{2,}|`", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text("utf-8"))
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def links(page: Path) -> list[str]:
    return [a or b for a, b in LINK.findall(prose(page.read_text("utf-8")))]


def test_the_pages_exist() -> None:
    names = {p.relative_to(REPO).as_posix() for p in PAGES}
    for page in ("docs/README.md", "docs/tutorial.md", "docs/reference/pipeline.md"):
        assert page in names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_links_resolve_inside_the_repository(page: Path) -> None:
    problems = []
    for target in links(page):
        parts = urlsplit(target)
        if parts.scheme in ("http", "https"):
            if LOCAL_HOSTS.match(parts.hostname or ""):
                problems.append(f"{target}: not a public site")
            continue
        if parts.scheme:
            problems.append(f"{target}: only relative links and public http(s) sites")
            continue
        dest = (page.parent / unquote(parts.path)).resolve() if parts.path else page
        if not dest.is_relative_to(REPO):
            problems.append(f"{target}: leaves the repository")
        elif not dest.exists():
            problems.append(f"{target}: {dest.relative_to(REPO)} does not exist")
        elif parts.fragment and dest.suffix == ".md" and parts.fragment not in anchors(dest):
            problems.append(f"{target}: no heading #{parts.fragment} in {dest.name}")
    assert problems == [], f"{page.relative_to(REPO)}: " + "; ".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_page_points_outside_the_project(page: Path) -> None:
    text = page.read_text("utf-8")
    for outside in ("../shared", "shared/DESIGN", "DESIGN.md", "STYLE.md"):
        assert outside not in text, f"{page.relative_to(REPO)} mentions {outside}"


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "# Title\n[a](missing.md) [b](#title) `[c](nope.md)`\n```\n[d](nope.md)\n```\n"
        "<http://127.0.0.1:8233>\n"
    )
    assert links(page) == ["missing.md", "#title", "http://127.0.0.1:8233"]
    assert anchors(page) == {"title"}
    heading = "`on_failure`: fail, continue or escalate"
    assert slug(heading) == "on_failure-fail-continue-or-escalate"
