"""examples/tree_search.py's smoke command runs end to end (tiny model, transformers engine): both methods play every
quiz once at the same budget and the results file holds what it printed."""

from __future__ import annotations

import json
import re

import pytest

from tests.examples.documented import documented_command, run_example


@pytest.mark.slow
def test_tree_search_example_compares_both_methods_at_one_budget(tmp_path):
    out = run_example(documented_command("tree_search.py"), tmp_path)
    lines = {m.group(1): m for m in re.finditer(
        r"^(flat|tree): solved ([\d.]+)% ± [\d.]+ \((\d+)/4\), [\d.]+/2 right per quiz, ([\d.]+) replies and (\d+) "
        r"tokens per quiz", out, re.MULTILINE)}
    assert set(lines) == {"flat", "tree"}, out
    assert lines["flat"].group(4) == lines["tree"].group(4) == "4.0"  # k = 2 replies per turn, 2 turns
    assert re.search(r"^tree - flat: [+-][\d.]+ ± [\d.]+ points \(paired; \d+ quizzes gained, \d+ lost\)", out, re.M)
    results = json.loads((tmp_path / "runs" / "tree_search_tiny.json").read_text())
    for name in ("flat", "tree"):
        assert len(results[name]["paths"]) == 4 and all(len(p["replies"]) == 2 for p in results[name]["paths"])
        assert int(sum(results[name]["solved"])) == int(lines[name].group(3))
