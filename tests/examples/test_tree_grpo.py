"""examples/tree_grpo.py's smoke command runs end to end (tiny model, transformers engine): GRPO steps on tree groups,
an evaluation on held-out quizzes before and after, and the generation the shared turns saved, read from the run's
own rollouts."""

from __future__ import annotations

import json
import re

import pytest

from gym_llm_adapters.rollout_io import read_rollouts
from tests.examples.documented import documented_command, run_example


@pytest.mark.slow
def test_tree_grpo_example_trains_on_tree_groups(tmp_path):
    out = run_example(documented_command("tree_grpo.py"), tmp_path)
    match = re.search(r"^2 GRPO steps on tree groups \(branch_turn=1\): (\d+) trajectories, (\d+) replies not "
                      r"generated", out, re.MULTILINE)
    assert match, out
    assert re.search(r"^held-out quizzes \(8, greedy\): [\d.]+ -> [\d.]+ right answers per quiz \(of 2\)", out, re.M)
    run = tmp_path / "runs" / "tree_grpo_tiny"
    trajectories = read_rollouts(run / "rollouts.jsonl")
    assert len(trajectories) == int(match.group(1)) == 2 * 2 * 4  # steps x quizzes x group size
    # each group's members share its leader's first reply: the same records, masked out of every member's loss
    groups: dict = {}
    for t in trajectories:
        groups.setdefault((t.group_id, t.round, t.task_id, t.steps[0].version), []).append(t)
    for members in groups.values():
        assert len(members) == 4 and {t.shared_turns for t in members} == {1}
        first = {tuple(m.steps[0].completion_ids.tolist()) for m in members}
        assert len(first) == 1
    assert int(match.group(2)) == len(groups) * 3  # (G - 1) * shared turns per group
    summary = json.loads((run / "tree_grpo.json").read_text())
    assert summary["steps"] == 2 and summary["replies_saved"] == int(match.group(2))
