"""examples/tokens_env.py's smoke command: LLMTokens-v0 episodes from the tiny model, endings and token-exactness."""

from __future__ import annotations

import re

import pytest

from tests.examples.documented import documented_command, run_example


@pytest.mark.slow
def test_tokens_env_example_runs_as_documented(tmp_path):
    out = run_example(documented_command("tokens_env.py"), tmp_path)
    assert len(re.findall(r"^episode \d+ \(task \d\): \d steps \[", out, re.MULTILINE)) == 3, out
    endings = re.search(r"^endings over 8 episodes: eos (\d+), stop token (\d+), length (\d+); mean reward ([\d.]+)$",
                        out, re.MULTILINE)
    assert endings, out
    eos, stop, length, mean_reward = int(endings[1]), int(endings[2]), int(endings[3]), float(endings[4])
    assert eos + stop + length == 8 and length > 0 and mean_reward == pytest.approx(stop / 8)  # reward = stop endings
    exact = re.search(r"^token-exact: 8/8 sequences = prompt \+ sampled ids; policy tokens (\d+) = generated tokens "
                      r"(\d+); max \|engine log-prob - teacher-forced\| (\S+)$", out, re.MULTILINE)
    assert exact and exact[1] == exact[2] and float(exact[3]) < 1e-4, out
