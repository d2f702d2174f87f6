"""examples/chat_user_simulator.py's smoke command: multi-turn LLMChat-v0 conversations with the tiny model, a
simulated user and a reward hook, token-exact."""

from __future__ import annotations

import re

import pytest

from tests.examples.documented import documented_command, run_example


@pytest.mark.slow
def test_chat_example_runs_as_documented(tmp_path):
    out = run_example(documented_command("chat_user_simulator.py"), tmp_path)
    headers = re.findall(r"^conversation \d \(task \d\): (\d) assistant turns, (terminated|truncated), rewards (\[.*\]) "
                         r"for replies of (\[.*\]) characters$", out, re.MULTILINE)
    assert len(headers) == 2, out
    for turns, _, rewards, lengths in headers:  # one brevity reward per assistant turn: min(1, 40 / characters)
        values, chars = ([float(x) for x in text.strip("[]").split(",")] for text in (rewards, lengths))
        assert len(values) == len(chars) == int(turns)
        assert values == [round(min(1.0, 40 / max(n, 1)), 2) for n in chars], (values, chars)
    # each shown conversation alternates env and policy segments, starting with the env's prompt
    segments = re.findall(r"^  (env   |policy) +\d+ tokens: ", out, re.MULTILINE)
    assert segments[0] == "env   " and "policy" in segments
    assert re.search(r"Thanks! Can you give me one more example\?|Please say it in fewer than 40", out)
    summary = re.search(r"^4 conversations: (\d) ended by the user, (\d) truncated; assistant turns (\d)-(\d);", out,
                        re.MULTILINE)
    assert summary and int(summary[1]) + int(summary[2]) == 4 and int(summary[4]) >= 2, out  # multi-turn
    assert re.search(r"^token-exact: 4/4 sequences = prompt \+ \(sampled \+ env\) per turn; policy mask counts \d+ "
                     r"sampled tokens, env wrote \d+$", out, re.MULTILINE), out
