"""IFEval's optional quality guard: replies built from the instruction's own arguments meet the official checks but
get no reward with ``quality_guard=True``; the official score is unchanged without it."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import gym_llm  # noqa: F401
from gym_llm.envs.ifeval import _words, quality_problem
from tests.conftest import shared_data_dir

DATA = shared_data_dir() / "ifeval" / "input_data.jsonl"


def content_free_reply(row: dict) -> str:
    """Text built from the instruction's arguments alone (no answer to the prompt)."""
    words = _words(row["kwargs"]) or ["placeholder"]
    return " ".join((words * (1 + 60 // len(words)))[:60])


@pytest.fixture(scope="module")
def rows():
    return [json.loads(line) for line in DATA.read_text().splitlines()]


def test_content_free_replies_are_paid_officially_and_refused_by_the_guard(rows):
    sample = rows[::9][:40]
    plain = gym.make("LLMIFEval-v0", tasks=sample)
    guarded = gym.make("LLMIFEval-v0", tasks=sample, quality_guard=True)
    paid_officially = refused = 0
    for k, row in enumerate(sample):
        reply = content_free_reply(row)
        for env in (plain, guarded):
            env.reset(seed=0, options={"task_id": k})
        _, official, *_ = plain.step(reply)
        _, reward, _, _, info = guarded.step(reply)
        paid_officially += official > 0
        refused += reward == 0.0 and info["quality_problem"] != ""
        assert reward <= official
    plain.close()
    guarded.close()
    assert paid_officially >= len(sample) // 3  # the weakness the guard is for
    assert refused == len(sample)


def test_a_real_answer_passes_the_guard():
    prompt = "Write a short blog post about a trip to Japan, with at least two paragraphs."
    reply = ("Last spring I travelled across Japan for two weeks. Tokyo was loud and bright, and the trains ran "
             "exactly on time.\n\nIn Kyoto the pace slowed: temples, tea houses and quiet gardens filled each day "
             "of the trip, and I left wanting to return soon.")
    assert quality_problem(reply, prompt, [{}]) is None
    assert "fewer than" in quality_problem("Japan trip.", prompt, [{}])
    assert "repetitive" in quality_problem("japan " * 40, prompt, [{}])
    assert "no content word" in quality_problem(reply, "Describe the rules of chess to a beginner please.", [{}])


def test_the_guard_is_off_by_default_and_the_official_score_is_unchanged(rows):
    row = rows[0]
    env = gym.make("LLMIFEval-v0", tasks=[row])
    env.reset(seed=0)
    _, _, _, _, info = env.step(content_free_reply(row))
    assert "quality_problem" not in info
    env.close()
