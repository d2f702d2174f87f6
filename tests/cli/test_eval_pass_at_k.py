"""``gym-llm eval --samples-per-task``: the unbiased pass@k estimator against exact enumeration, its per-task and
overall table, and a run of the command on LLMCode-v0."""

from __future__ import annotations

import itertools
import json
from fractions import Fraction
from math import comb

import pytest

from gym_llm_adapters.cli.evaluate import pass_at_k, pass_at_k_table


def enumerated(n: int, c: int, k: int) -> Fraction:
    """pass@k by definition: of every k-subset of n samples (c of them passing), the share holding a pass."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(outcomes[i] for i in subset) for subset in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 11))
def test_pass_at_k_equals_exact_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(enumerated(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_where_the_binomials_are_huge():
    exact = 1 - Fraction(comb(1000 - 3, 100), comb(1000, 100))
    assert pass_at_k(1000, 3, 100) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(100_000, 1, 1) == pytest.approx(1e-5, rel=1e-9)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-15)
    for bad in ((5, 6, 1), (5, 2, 0), (5, 2, 6), (3, -1, 1)):
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(*bad)


def test_the_table_per_task_and_overall():
    samples = [(7, True), (7, False), (7, False), (7, True), (2, False), (2, False), (2, False), (2, False)]
    per_task, overall = pass_at_k_table(samples, [1, 2, 4])
    assert per_task[0] == {"task_id": 7, "samples": 4, "passed": 2, "pass@1": 0.5, "pass@2": pytest.approx(5 / 6),
                           "pass@4": 1.0}
    assert per_task[1]["passed"] == 0 and per_task[1]["pass@4"] == 0.0
    assert overall == {"pass@1": 0.25, "pass@2": pytest.approx(5 / 12), "pass@4": 0.5}
    _, overall = pass_at_k_table([(1, True), (2, True), (2, False)], [1, 2])  # task 1 has too few samples for k=2
    assert overall == {"pass@1": 0.75, "pass@2": 1.0}


def test_eval_samples_per_task_on_the_code_env(tmp_path, capsys):
    from gym_llm_adapters.cli import main

    out = tmp_path / "code.jsonl"
    argv = ["eval", "LLMCode-v0", "--model", "tiny", "--engine", "hf", "--n", "2", "--samples-per-task", "3",
            "--temperature", "1.0", "--max-new-tokens", "8", "--no-progress", "--out", str(out),
            "--env-arg", "source=basic", "--env-arg", "size=5"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "2 tasks x 3 samples: pass@1 0.000, pass@2 0.000, pass@3 0.000" in printed
    summary = json.loads(out.with_name("code.summary.json").read_text())
    assert summary["episodes"] == 6 and summary["samples_per_task"] == 3
    assert [row["task_id"] for row in summary["per_task"]] == [0, 1]
    assert summary["pass_at_k"] == {"pass@1": 0.0, "pass@2": 0.0, "pass@3": 0.0}
    assert main(["eval", "LLMCode-v0", "--model", "tiny", "--samples-per-task", "2"]) == 2
    assert "--temperature 0: greedy samples of a task are all the same" in capsys.readouterr().err
