"""The SmolLM2 learning configs (examples/configs/smollm2_*.toml) measure what the README says they measure.

Their runs take half an hour on the project's CPU, so the suite does not repeat them (the README reports them with
their commands); what it checks is what makes the reported numbers mean something: the evaluation problems are
never training problems (neither the GRPO tasks nor the SFT warm start's worked answers), the evaluation is
greedy on 200 problems, and the run trains as the issue asked (vLLM generating, a KL term to the reference in the
loss, weights pushed to the engine after every step: the trainer always does that).
"""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym
import pytest

import gym_llm  # noqa: F401  (registers the env ids)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "examples" / "configs").glob("smollm2_*.toml"))


def _config(path: Path):
    from gym_llm_adapters.cli import parse_args
    from gym_llm_adapters.cli.train import config_from_args

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        return config_from_args(parse_args(["train", "grpo", "--config", str(path.relative_to(REPO))]))
    finally:
        os.chdir(cwd)


def _questions(env_id: str, kwargs: dict) -> set[str]:
    env = gym.make(env_id, **kwargs)
    try:
        return {task.messages[-1].content for task in env.unwrapped.parts.tasks}
    finally:
        env.close()


def test_there_is_a_smollm2_config():
    assert CONFIGS, "examples/configs/smollm2_*.toml is missing"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_held_out_problems_are_never_trained_on(path):
    config = _config(path)
    assert config.model == "smollm2" and config.engine == "vllm" and config.algorithm == "grpo"
    assert config.beta > 0, "the learning claim is made with the KL-to-reference term on"
    judged = config.judge is not None  # smollm2_judge.toml: trained on a judge, evaluated by a rule on another env
    assert config.eval_episodes >= (150 if judged else 200) and config.eval_temperature == 0.0
    train = _questions(config.env_id, config.env_kwargs)
    held_out = _questions(config.eval_env_id, dict(config.eval_env_kwargs)) if config.eval_env_id else \
        _questions(config.env_id, {**config.env_kwargs, **config.eval_env_kwargs})
    assert len(held_out) >= config.eval_episodes and len(train) >= (160 if judged else 500)
    assert not train & held_out, f"{len(train & held_out)} eval problems are training problems"
    if judged:  # the requests are split by topic: no held-out request is about a topic trained on
        import re

        from scripts.make_judge_prompts import ASKS

        patterns = [re.compile(re.escape(a).replace(re.escape("{t}"), "(.+)") + " ") for a in ASKS]

        def topic(q: str) -> str:
            return next(m.group(1) for m in (p.match(q) for p in patterns) if m)

        assert not {topic(q) for q in train} & {topic(q) for q in held_out}
        assert config.judge.env_weight == 0.0 and config.eval_env_id == "LLMIFEval-v0"
        return
    # the SFT warm start trains on the same env's tasks (their worked answers): the same disjoint set
    assert config.sft_data == "references"
