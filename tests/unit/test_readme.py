"""The README stays a guide: small, the quick start in the first screen, and no link to a page that is not there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

MAX_BYTES = 25_000  # measurements and detail belong in docs/, not in the guide
QUICK_START_WITHIN = 40  # the first screen
# [text](target) where target has no scheme (http:, mailto:) and is not only an anchor
RELATIVE_LINK = re.compile(r"\[[^\]]*\]\((?![a-z][a-z0-9+.-]*:)([^)#\s]+)(?:#[^)\s]*)?\)")


def test_readme_is_under_25_kb() -> None:
    size = README.stat().st_size
    assert size < MAX_BYTES, f"README.md is {size} bytes; move detail or measurements to docs/ (limit {MAX_BYTES})"


def test_quick_start_is_in_the_first_screen() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    headings = [i for i, line in enumerate(lines[:QUICK_START_WITHIN], start=1) if line.startswith("## Quick start")]
    assert headings, f"no '## Quick start' heading within the first {QUICK_START_WITHIN} lines of README.md"


def test_relative_links_point_to_files_that_exist() -> None:
    targets = RELATIVE_LINK.findall(README.read_text(encoding="utf-8"))
    assert targets, "README.md links to no docs page: the pattern no longer matches its links"
    missing = sorted({t for t in targets if not (REPO / t).exists()})
    assert not missing, f"README.md links to files that do not exist: {missing}"
