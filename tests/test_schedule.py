"""tests/schedule.py orders pytest-xdist work units longest first, keeping each group's tests together and in order."""

from __future__ import annotations

import json

import pytest

from tests import schedule


class Item:  # the two things the scheduler reads from a pytest item
    def __init__(self, nodeid: str, group: str | None = None):
        self.nodeid = nodeid
        self._marks = [pytest.mark.xdist_group(group).mark] if group else []

    def iter_markers(self, name):
        return iter(m for m in self._marks if m.name == name)


def test_units_go_longest_first_and_groups_stay_whole():
    items = [Item("a.py::fast"), Item("b.py::g1", "ray"), Item("a.py::slow"), Item("b.py::g2", "ray"),
             Item("c.py::new"), Item("d.py::unknown")]
    table = {"a.py::fast": 1.0, "a.py::slow": 100.0, "b.py::g1": 30.0, "b.py::g2": 40.0, "c.py::*": 5.0}
    order = [item.nodeid for item in schedule.longest_first(items, table)]
    # slow (100) > the ray group (30 + 40 = 70) > c.py's mean (5) > fast (1) > unknown (DEFAULT_S)
    assert order == ["a.py::slow", "b.py::g1", "b.py::g2", "c.py::new", "a.py::fast", "d.py::unknown"]


def test_group_suffixes_are_ignored_and_ties_keep_collection_order():
    table = {"x.py::t": 2.0}
    assert schedule.estimate(["x.py::t@vllm", "y.py::u"], table) == {"x.py::t@vllm": 2.0, "y.py::u": schedule.DEFAULT_S}
    items = [Item(f"z.py::t{i}") for i in range(5)]
    assert schedule.longest_first(items, {}) == items


def test_recorded_durations_become_the_table(tmp_path):
    folder = tmp_path / "rec"
    folder.mkdir()
    rows = [{"id": "a.py::slow", "s": 12.34}, {"id": "a.py::fast", "s": 0.1}, {"id": "b.py::t", "s": 0.7}]
    (folder / "gw0-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "durations.json"
    assert schedule.write_table(folder, out) == 4
    table = json.loads(out.read_text())
    assert table == {"a.py::*": 6.22, "a.py::slow": 12.3, "b.py::*": 0.7, "b.py::t": 0.7}
    assert schedule.load_table(out) == table
    assert schedule.load_table(tmp_path / "missing.json") == {}


def test_the_committed_table_names_tests_that_exist():
    """A table of renamed or deleted tests only costs balance, but it should be regenerated when that happens."""
    from pathlib import Path

    root = Path(schedule.__file__).resolve().parents[1]
    table = schedule.load_table()
    assert len(table) > 100
    missing = sorted({k.split("::", 1)[0] for k in table} - {p for p in {k.split("::", 1)[0] for k in table}
                                                               if (root / p).is_file()})
    assert not missing, f"tests/durations.json names files that are gone: {missing}; regenerate it (tests/schedule.py)"
