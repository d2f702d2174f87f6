"""examples/python_tool_scripted.py as documented: real sandboxed Python, tool results read back, ``#### N`` scored."""

from __future__ import annotations

import ast
import re

from tests.conftest import shared_data_dir
from tests.examples.documented import documented_command, run_example


def summary(out: str) -> tuple[int, float, dict[str, int]]:
    found = re.search(r"^(\d+) episodes: mean reward ([\d.]+); \d+ tool calls (\{.*\})$", out, re.MULTILINE)
    assert found, out
    return int(found[1]), float(found[2]), ast.literal_eval(found[3])


def test_generated_problems_are_all_solved_through_the_sandbox(tmp_path):
    out = run_example(documented_command("python_tool_scripted.py", None), tmp_path)
    episodes, mean_reward, statuses = summary(out)
    assert (episodes, mean_reward) == (8, 1.0)
    assert statuses["ok"] == 8 and statuses.get("error", 0) >= 1, out  # a typo per bug, each fixed in the next call
    assert re.search(r"^  tool said: \"NameError: name 'answr' is not defined\"$", out, re.MULTILINE), out
    sums = re.findall(r"'What is (\d+) \+ (\d+)\?'\n(?:  .*\n)*?  final reply '#### (\d+)' -> reward 1\.0", out)
    assert len(sums) == 4 and all(int(a) + int(b) == int(c) for a, b, c in sums), out  # printed, computed, rewarded


def test_gsm8k_from_the_data_file(tmp_path):
    argv = documented_command("python_tool_scripted.py", "--data-files")
    argv[argv.index("--data-files") + 1] = str(shared_data_dir() / "gsm8k" / "test.jsonl")
    out = run_example([*argv, "--episodes", "24"], tmp_path)
    episodes, mean_reward, statuses = summary(out)
    assert episodes == 24 and 0.7 <= mean_reward < 1.0 and statuses["ok"] >= 20, out  # the oracle's known misses
    assert re.search(r"^  tool call: ok .* step_1 = ", out, re.MULTILINE), out
