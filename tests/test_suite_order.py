"""``make test`` hands whole files to its workers in the collection's order (tests/conftest.py): the long files
first, by their place in ``LONG_FILES``, then the others by their number of tests, each file's tests in order."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import conftest

TESTS = Path(__file__).resolve().parent


def test_every_long_file_is_a_test_file_of_the_suite():
    missing = [name for name in conftest.LONG_FILES if not (TESTS / name).is_file()]
    assert missing == []  # a renamed file would lose its place silently


def test_a_worker_runs_the_long_files_first_then_the_others_by_test_count():
    first, second = conftest.LONG_FILES[:2]
    items = [SimpleNamespace(path=Path(name), order=i) for i, name in enumerate(
        ["test_few.py", second, "test_many.py", "test_many.py", first, second, "test_few.py", "test_many.py"])]
    conftest.pytest_collection_modifyitems(SimpleNamespace(workerinput={}), items)
    assert [(str(i.path), i.order) for i in items] == [
        (first, 4), (second, 1), (second, 5), ("test_many.py", 2), ("test_many.py", 3), ("test_many.py", 7),
        ("test_few.py", 0), ("test_few.py", 6)]


def test_outside_a_worker_the_order_is_left_alone():
    items = [SimpleNamespace(path=Path(name)) for name in ("test_few.py", conftest.LONG_FILES[0])]
    before = list(items)
    conftest.pytest_collection_modifyitems(SimpleNamespace(), items)
    assert items == before
