"""Article-body F1 of trafilatura and readability-lxml on a local benchmark clone.

Usage::

    python -m bench.article_eval /path/to/article-extraction-benchmark [--configs a,b]

The benchmark (scrapinghub/article-extraction-benchmark: 181 real pages with
hand-labelled article bodies) is read straight from its git repository with
``git show`` / ``git ls-tree``, so a bare mirror works; nothing of it is copied
into this repository. The metric is re-implemented here to the letter of the
benchmark's ``evaluate.py``: ``\\w+`` tokens, 4-token shingles counted as a
multiset, per-page TP/FP/FN normalised to sum 1, precision and recall averaged
over pages, F1 from those two means. No bootstrap: the point estimates are
what the docs quote.

The ``aiworker`` rows run the worker's own extraction path
(:func:`aiworker.activities.tools.content.extract_content`) on each page, so
the figure in ``docs/scrape-content.md`` is the shipped configuration's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

_TOKEN_RE = re.compile(r"\w+", re.UNICODE | re.MULTILINE | re.IGNORECASE | re.DOTALL)

TpFpFn = tuple[float, float, float]


def _tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text or "")


def _shingles(text: str, n: int = 4) -> Counter[tuple[str, ...]]:
    tokens = _tokenize(text)
    out: Counter[tuple[str, ...]] = Counter()
    for i in range(max(1, len(tokens) - n + 1)):
        shingle = tuple(tokens[i : i + n])
        if shingle:
            out[shingle] += 1
    return out


def shingle_match(true: str, pred: str) -> TpFpFn:
    """TP/FP/FN over 4-token shingles, normalised so each page weighs the same."""
    t, p = _shingles(true), _shingles(pred)
    tp = fp = fn = 0.0
    for key in set(t) | set(p):
        tc, pc = t.get(key, 0), p.get(key, 0)
        tp += min(tc, pc)
        fp += max(0, pc - tc)
        fn += max(0, tc - pc)
    s = tp + fp + fn
    return (tp / s, fp / s, fn / s) if s > 0 else (tp, fp, fn)


def _precision(tp: float, fp: float, fn: float) -> float:
    if fp == fn == 0:
        return 1.0
    if tp == fp == 0:
        return 0.0
    return tp / (tp + fp)


def _recall(tp: float, fp: float, fn: float) -> float:
    if fp == fn == 0:
        return 1.0
    if tp == fn == 0:
        return 0.0
    return tp / (tp + fn)


def metrics(rows: list[TpFpFn]) -> dict[str, float]:
    """Mean precision, mean recall and their F1, as the benchmark computes them."""
    precision = statistics.mean(_precision(*r) for r in rows if r[0] + r[1] > 0)
    recall = statistics.mean(_recall(*r) for r in rows if r[0] + r[2] > 0)
    return {
        "f1": 2 * precision * recall / (precision + recall),
        "precision": precision,
        "recall": recall,
    }


def load_pages(repo: Path) -> tuple[dict[str, str], dict[str, str]]:
    """``(html by id, labelled body by id)`` read from the repository's HEAD."""

    def git(*args: str) -> bytes:
        return subprocess.run(
            ["git", "-C", str(repo), *args], check=True, capture_output=True
        ).stdout

    truth = json.loads(git("show", "HEAD:ground-truth.json"))
    bodies = {k: v.get("articleBody", "") or "" for k, v in truth.items()}
    html: dict[str, str] = {}
    for line in git("ls-tree", "HEAD", "html/").decode().splitlines():
        path = line.split("\t", 1)[1]
        item = Path(path).name.split(".")[0]
        html[item] = gzip.decompress(git("show", f"HEAD:{path}")).decode("utf8")
    if html.keys() != bodies.keys():
        raise SystemExit("html/ and ground-truth.json name different pages")
    return html, bodies


def _trafilatura(**options: object) -> Callable[[str], str]:
    import trafilatura

    def run(page: str) -> str:
        return trafilatura.extract(page, include_comments=False, **options) or ""  # type: ignore[arg-type]

    return run


def _readability(page: str) -> str:
    import lxml.html
    from readability import Document

    summary = Document(page).summary(html_partial=True)
    tree = lxml.html.fromstring(summary)
    # Block elements end a line, as html_text does for the benchmark's own runner.
    for el in tree.iter("p", "div", "li", "h1", "h2", "h3", "h4", "h5", "h6", "br", "tr", "td"):
        el.tail = ("\n" + el.tail) if el.tail else "\n"
    return str(tree.text_content())


def _aiworker(mode: str) -> Callable[[str], str]:
    from aiworker.activities.tools.content import extract_content

    def run(page: str) -> str:
        return str(extract_content(page, mode, "https://example.com/").get("text") or "")

    return run


def _aiworker_markdown(page: str) -> str:
    from aiworker.activities.tools.content import extract_content

    return str(extract_content(page, "article", "https://example.com/").get("markdown") or "")


CONFIGS: dict[str, Callable[[], Callable[[str], str]]] = {
    "trafilatura": lambda: _trafilatura(),
    "trafilatura-precision": lambda: _trafilatura(favor_precision=True),
    "trafilatura-recall": lambda: _trafilatura(favor_recall=True),
    "trafilatura-no-tables": lambda: _trafilatura(include_tables=False),
    "trafilatura-links": lambda: _trafilatura(include_links=True),
    "trafilatura-markdown": lambda: _trafilatura(output_format="markdown"),
    "trafilatura-markdown-links-tables": lambda: _trafilatura(
        output_format="markdown", include_links=True, include_tables=True, include_formatting=True
    ),
    "trafilatura-fast": lambda: _trafilatura(fast=True),
    "trafilatura-precision-fast": lambda: _trafilatura(favor_precision=True, fast=True),
    "readability-lxml": lambda: _readability,
    "aiworker-article-text": lambda: _aiworker("article"),
    "aiworker-article-markdown": lambda: _aiworker_markdown,
    "aiworker-page-text": lambda: _aiworker("page"),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", type=Path, help="a clone or bare mirror of the benchmark")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma list of configurations")
    ap.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = ap.parse_args(argv)
    html, bodies = load_pages(args.repo)
    results: dict[str, dict[str, float]] = {}
    print(f"{len(html)} pages")
    print(f"{'configuration':<36} {'F1':>6} {'prec':>6} {'recall':>6} {'s':>6}")
    for name in args.configs.split(","):
        extract = CONFIGS[name]()
        started = time.perf_counter()
        rows = [shingle_match(bodies[k], extract(html[k])) for k in sorted(html)]
        m = metrics(rows) | {"seconds": time.perf_counter() - started}
        results[name] = m
        print(
            f"{name:<36} {m['f1']:6.3f} {m['precision']:6.3f} {m['recall']:6.3f} "
            f"{m['seconds']:6.1f}",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
