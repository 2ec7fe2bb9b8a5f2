"""`rnngraph report`: docs/performance.md and README.md's headline table, rendered from the stored results in
experiments/results (nothing is measured); `--check` exits 1 when a page differs.

Example::

    rnngraph report            # rewrite docs/performance.md and the README's headline table
    rnngraph report --check    # exit 1 (naming the pages) when either is out of date
"""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import RnnGraphError
from .experiments import REPO, RESULTS
from .report_bench import headline
from .report_data import Results, rel
from .report_page import render_page

PAGE = REPO / "docs" / "performance.md"
README = REPO / "README.md"
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"


def add_arguments(p) -> None:
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 naming the pages that differ from the stored results")
    p.add_argument("--results", metavar="DIR", default=str(RESULTS),
                   help="folder of stored results (default: %(default)s)")


def run(args) -> int:
    results = Results(args.results)
    pages = {PAGE: render_page(results), README: with_headline(_read(README), headline(results))}
    stale = [p for p, text in pages.items() if not p.exists() or _read(p) != text]
    if args.check:
        for p in stale:
            print(f"rnngraph: {rel(p)} is out of date (stored results: {rel(results.root)}); run `rnngraph report`",
                  file=sys.stderr)
        return 1 if stale else 0
    for p in stale:
        p.write_text(pages[p])
        print(f"wrote {rel(p)}")
    if not stale:
        print("rnngraph: the pages are current")
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise RnnGraphError(f"cannot read {path}: {e.strerror or e}") from None


def with_headline(readme: str, text: str) -> str:
    """README.md with `text` between its headline markers."""
    return between(readme, BEGIN, END, text, README)


def between(page: str, begin: str, end: str, text: str, where: Path) -> str:
    """`page` with `text` on the lines between its one `begin` marker and the `end` marker after it."""
    if page.count(begin) != 1 or page.count(end) != 1 or page.index(begin) > page.index(end):
        raise RnnGraphError(f"{where} needs one {begin} line followed by one {end} line")
    start, stop = page.index(begin) + len(begin), page.index(end)
    return page[:start] + "\n" + text + "\n" + page[stop:]
