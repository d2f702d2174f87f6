"""Longest-first scheduling of the suite over pytest-xdist workers, from a committed table of measured durations.

pytest-xdist (``--dist loadgroup``) hands out work units — a whole ``xdist_group``, or a single ungrouped test — in
the order it receives them, one more to a worker whenever it runs low. Left to itself it sorts units by their
number of tests, so a one-test unit that runs for minutes (the SmolLM2 learning run) starts wherever it falls among
the single tests and the run ends with one worker busy and the other idle (measured: 49 s of a 643 s run). Sending
the units longest first (the LPT rule) bounds that tail by the length of the last units, which are the short ones.

``tests/durations.json`` maps test ids (without the ``@group`` suffix) to seconds — setup, call and teardown — as
measured on a full run, for the tests that took at least half a second, and ``FILE::*`` to the mean of all of a
file's tests. A test missing from it counts as its file's mean, else :data:`DEFAULT_S`. Regenerate it after adding slow tests::

    GYM_LLM_RECORD_DURATIONS=/tmp/durations .venv/bin/python -m pytest
    .venv/bin/python -m tests.schedule /tmp/durations     # rewrites tests/durations.json

The order only changes when tests start, never what they assert; a stale table only costs balance.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("durations.json")
DEFAULT_S = 0.3  # most tests take well under a second
RECORD_ENV = "GYM_LLM_RECORD_DURATIONS"


def _base_id(nodeid: str) -> str:
    return nodeid.split("@", 1)[0] if "@" in nodeid.rsplit("::", 1)[-1] else nodeid


def load_table(path: Path = TABLE) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        return {}


def estimate(nodeids: list[str], table: dict[str, float]) -> dict[str, float]:
    """Seconds expected for each test id: the table's value, else its file's mean, else :data:`DEFAULT_S`."""
    out = {}
    for nodeid in nodeids:
        base = _base_id(nodeid)
        out[nodeid] = table.get(base, table.get(base.split("::", 1)[0] + "::*", DEFAULT_S))
    return out


def unit_of(item) -> str:
    """pytest-xdist's work unit for an item under ``--dist loadgroup``: its group, or the test itself."""
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "@" + "_".join(names) if names else item.nodeid


def longest_first(items: list, table: dict[str, float] | None = None) -> list:
    """``items`` reordered so that work units come longest first; a unit's tests keep their order (stable)."""
    table = load_table() if table is None else table
    cost = estimate([item.nodeid for item in items], table)
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(unit_of(item), []).append(item)
    total = {unit: sum(cost[item.nodeid] for item in members) for unit, members in units.items()}
    order = sorted(units, key=lambda unit: -total[unit])  # sorted() is stable: ties keep collection order
    return [item for unit in order for item in units[unit]]


class DurationRecorder:
    """Appends each test's setup + call + teardown seconds to ``$GYM_LLM_RECORD_DURATIONS/<worker>.jsonl``, with the
    CPU seconds its worker and the child processes it waited for used meanwhile (``cpu``: what to cut when the suite
    is CPU-bound; a Ray actor's or a server's CPU is not counted) and when it started (``t``, Unix time)."""

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}.jsonl"
        self.started: dict[str, tuple[float, float, float]] = {}

    @staticmethod
    def _cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    def pytest_runtest_logstart(self, nodeid, location):
        self.started[nodeid] = (time.monotonic(), self._cpu(), time.time())

    def pytest_runtest_logfinish(self, nodeid, location):
        start, cpu, when = self.started.pop(nodeid, (time.monotonic(), self._cpu(), time.time()))
        row = {"id": _base_id(nodeid), "s": round(time.monotonic() - start, 2), "cpu": round(self._cpu() - cpu, 2),
               "t": round(when, 2)}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def write_table(folder: Path, out: Path = TABLE, min_s: float = 0.5) -> int:
    """Write the recorded durations (the last value per test) to ``out``: each test of at least ``min_s`` and each
    file's mean (``FILE::*``). Returns the number of entries written."""
    seen: dict[str, float] = {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            seen[row["id"]] = float(row["s"])
    per_file: dict[str, list[float]] = defaultdict(list)
    for nodeid, seconds in seen.items():
        per_file[nodeid.split("::", 1)[0]].append(seconds)
    table = {k: round(v, 1) for k, v in seen.items() if v >= min_s}
    table.update({f"{name}::*": round(sum(v) / len(v), 2) for name, v in per_file.items()})
    table = dict(sorted(table.items()))
    out.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    return len(table)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python -m tests.schedule FOLDER  (the {RECORD_ENV} folder of a full run)")
    print(f"{write_table(Path(sys.argv[1]))} durations written to {TABLE}")
