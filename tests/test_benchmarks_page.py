"""docs/benchmarks.md stays one short page of current figures; its history lives in docs/benchmarks-log.md
under the same section numbers, so that every "benchmarks §N" reference in the tree finds its section."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
LOG = ROOT / "docs" / "benchmarks-log.md"
#: the page's size limit in bytes (15 KB): a page to read, not a history
MAX_BYTES = 15_000
#: "benchmarks §6", "docs/benchmarks.md §3, §6", "benchmarks-log §4", "[docs/benchmarks-log.md](...) §6"
REFERENCE = re.compile(r"benchmarks(-log)?(?:\.md)?(?:\]\([^)]*\))? (§\d+(?:, §\d+)*)")
#: the files that cite sections (the log's own text cites its own sections)
CITING = ("README.md", "Makefile", "docs/*.md", "config/**/*.yaml", "bench/*", "profiles/**/*.yaml", "src/**/*.py")


def sections(path: Path) -> dict[int, str]:
    """Section number -> title of the ``## N. Title`` headings."""
    return {int(n): title for n, title in re.findall(r"^## (\d+)\. (.+)$", path.read_text(), flags=re.M)}


def references(text: str) -> list[tuple[bool, int]]:
    """(cites the log, section number) of each section reference in ``text``."""
    return [(bool(log), int(n)) for log, numbers in REFERENCE.findall(text) for n in re.findall(r"\d+", numbers)]


def test_page_is_at_most_15_kb():
    size = len(PAGE.read_bytes())
    assert size <= MAX_BYTES, f"docs/benchmarks.md is {size} bytes: move older figures to docs/benchmarks-log.md"


def test_page_and_log_share_their_sections():
    page = sections(PAGE)
    assert sorted(page) == list(range(1, 9)), page
    assert sections(LOG) == page


def test_reference_pattern_reads_every_form():
    text = "(benchmarks §4) docs/benchmarks.md §3, §6 [docs/benchmarks-log.md](docs/benchmarks-log.md) §6 benchmarks-log §8"
    assert references(text) == [(False, 4), (False, 3), (False, 6), (True, 6), (True, 8)]


def test_every_section_reference_names_a_section():
    known = set(sections(PAGE))
    bad, found = [], 0
    for pattern in CITING:
        for path in ROOT.glob(pattern):
            if not path.is_file() or path in (PAGE, LOG) or ".venv" in path.parts:
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            cited = references(text)
            found += len(cited)
            bad += [f"{path.relative_to(ROOT)}: §{n}" for _, n in cited if n not in known]
    assert found >= 10, found  # README, docs, configs and bench cite sections
    assert not bad, bad
