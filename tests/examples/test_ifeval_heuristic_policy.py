"""examples/ifeval_heuristic_policy.py on IFEval's 541 real prompts: the rule-based policy beats the naive reply."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from tests.conftest import shared_data_dir
from tests.examples.documented import REPO, documented_command, run_example


def test_rule_based_policy_follows_most_instructions(tmp_path):
    out = run_example(documented_command("ifeval_heuristic_policy.py", None), tmp_path,
                      env={"GYM_LLM_DATA": str(shared_data_dir())})
    mean = re.search(r"^mean reward over 541 prompts: policy ([\d.]+), baseline ([\d.]+); all instructions followed: "
                     r"policy (\d+), baseline (\d+)$", out, re.MULTILINE)
    assert mean, out
    assert float(mean[1]) >= 0.9 and float(mean[2]) <= 0.2 and int(mean[3]) > 5 * int(mean[4]), out
    rows = dict((m[0], (int(m[1]), float(m[2]), float(m[3])))
                for m in re.findall(r"^([a-z_]+:[a-z_]+) +(\d+) +([\d.]+) +([\d.]+)$", out, re.MULTILINE))
    assert len(rows) == 25 and sum(n for n, _, _ in rows.values()) == 834, rows  # every instruction of the file
    for easy in ("punctuation:no_comma", "change_case:english_lowercase", "startend:end_checker", "detectable_format:title"):
        assert rows[easy][1] == 1.0 and rows[easy][2] == 0.0, (easy, rows[easy])
    assert rows["language:response_language"][1] == 0.0  # the one it cannot do
    assert "reply:\n" in out and "results: [('punctuation:no_comma', True)" in out  # the first prompt, shown


def test_missing_data_says_where_it_looked(tmp_path):
    copy = tmp_path / "checkout" / "examples"
    copy.mkdir(parents=True)
    for name in ("ifeval_heuristic_policy.py", "_common.py"):
        shutil.copy(REPO / "examples" / name, copy / name)
    environ = {k: v for k, v in os.environ.items() if k != "GYM_LLM_DATA"}
    environ["PYTHONPATH"] = str(REPO)
    result = subprocess.run([sys.executable, str(copy / "ifeval_heuristic_policy.py")], cwd=tmp_path, env=environ,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "input_data.jsonl was not found" in result.stderr and "--data-files" in result.stderr, result.stderr
