"""examples/browser_scripted.py's smoke command: a real Chromium browses the env's site; answers read off the pages."""

from __future__ import annotations

import re

import pytest

from tests.examples.documented import documented_command, run_example


@pytest.mark.slow
def test_browser_example_solves_the_documented_tasks(tmp_path):
    argv = documented_command("browser_scripted.py", "--tasks")
    out = run_example(argv, tmp_path)
    tasks = [int(t) for t in argv[argv.index("--tasks") + 1].split(",")]
    assert re.findall(r"^task (\d+) \(", out, re.MULTILINE) == [str(t) for t in tasks], out
    calls = re.findall(r"^  browser_(\w+) (\{.*\})  (\w+) [\d.]+ s -> '(.*)'$", out, re.MULTILINE)
    assert len(calls) == 3 * len(tasks) and all(status == "ok" for _, _, status, _ in calls), out
    assert ("type", '{"field": "Password", "text": "saltwater", "submit": true}', "ok",
            "Your account - Larkspur Harbor") in calls  # logged in through the form
    replies = re.findall(r"^  reply 'Answer: (.*)' -> reward ([\d.]+) \(accepted: '(.*)'\)$", out, re.MULTILINE)
    assert [answer for answer, _, _ in replies] == ["barley", "1.8 kg", "HS-40317", "17:40"], out
    assert all(reward == "1.0" and answer == accepted for answer, reward, accepted in replies), out
    assert re.search(rf"^{len(tasks)} tasks: mean reward 1\.000 over {3 * len(tasks)} browser calls$", out, re.MULTILINE)
