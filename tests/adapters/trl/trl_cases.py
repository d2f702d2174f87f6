"""Shared settings of the TRL tests (imported by conftest.py and the tests): real GSM8K tasks, a tool env, and the
episodes that teach the tiny model to use the tool (see conftest.py)."""

from __future__ import annotations

import numpy as np

from gym_llm_adapters.types import Trajectory

TASK = 305  # GSM8K test row: "John arm wrestles 20 people.  He beats 80%.  How many people did he lose to?" -> 4
CODE_REPLY = "```python\nprint(20-16)\n```<|im_end|>"
ANSWER_REPLIES = ("#### 4<|im_end|>", "Not sure.<|im_end|>")
PLAIN_CHATML = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
                "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
"""ChatML without a tools section in the system prompt: keeps the test episodes short (~120 tokens)."""
TRAINING_CHATML = ("{%- for m in messages %}{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
                   "{% generation %}{{- m.content + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
                   "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
                   "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
"""``PLAIN_CHATML`` with ``{% generation %}`` markers around assistant turns (what SFT's assistant_only_loss needs)."""
TOOL_ENV = dict(max_turns=3, system_prompt="Run code.", prompt_template="{question}\nUse python.",
                chat_template=PLAIN_CHATML, sandbox={"timeout_s": 10.0})
"""``LLMPythonTool-v0`` arguments of the tests (besides ``data_files``)."""


def _ids(obs):
    return obs["input_ids"][obs["attention_mask"] == 1].tolist()


def teaching_episodes(tokenizer, data_files) -> list[tuple[list[int], list[int]]]:
    """``(token_ids, loss_mask)`` of the episodes to learn, recorded from the envs themselves."""
    import gymnasium as gym

    import gym_llm  # noqa: F401

    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    tokens = dict(mode="tokens", tokenizer=tokenizer, max_seq_len=512, max_action_tokens=64, data_files=data_files)
    episodes = []
    gsm8k = gym.make("LLMGSM8K-v0", **tokens)
    prompt = _ids(gsm8k.reset(options={"task_id": TASK})[0])
    for reply in ANSWER_REPLIES:
        episodes.append((prompt + encode(reply), [0] * len(prompt) + [1] * len(encode(reply))))
    tool = gym.make("LLMPythonTool-v0", **tokens, **TOOL_ENV)
    tool.reset(options={"task_id": TASK})
    obs, _, terminated, _, info = tool.step(np.asarray(encode(CODE_REPLY)))
    assert not terminated and '"status": "ok"' in info["tool_calls"], info
    so_far, mask = _ids(obs), info["policy_mask"][: len(_ids(obs))].tolist()
    for reply in ANSWER_REPLIES:
        episodes.append((so_far + encode(reply), mask + [1] * len(encode(reply))))
    tool.close()
    gsm8k.close()
    return episodes


def env_spans(trajectory: Trajectory) -> list[tuple[int, int]]:
    """``[start, stop)`` of the tokens the env appended between turns, read off the observations: turn ``k+1``'s
    observation is turn ``k``'s observation + its sampled ids + what the env added."""
    spans = []
    for before, after in zip(trajectory.steps, trajectory.steps[1:]):
        start = len(before.prompt_ids) + len(before.completion_ids)
        assert after.prompt_ids[:start].tolist() == before.prompt_ids.tolist() + before.completion_ids.tolist()
        spans.append((start, len(after.prompt_ids)))
    return spans


def check_trl_fields(fields: dict, trajectories: list[Trajectory], tokenizer) -> int:
    """The TRL fields are the trajectories, token-exact, with ``env_mask == 0`` exactly on env tokens; returns how
    many env tokens were masked."""
    masked = 0
    for i, t in enumerate(trajectories):
        P = len(t.steps[0].prompt_ids)
        last = t.steps[-1]
        full = last.prompt_ids.tolist() + last.completion_ids.tolist()  # what the env saw, in the end
        assert fields["prompt_ids"][i] == full[:P] and fields["prompt_ids"][i] + fields["completion_ids"][i] == full
        expected_mask = np.ones(len(full) - P, dtype=int)
        for start, stop in env_spans(t):
            expected_mask[start - P: stop - P] = 0
            masked += stop - start
            env_text = tokenizer.decode(full[start:stop])
            assert "<|im_start|>tool\n" in env_text and env_text.endswith("<|im_start|>assistant\n"), env_text
        assert fields["env_mask"][i] == expected_mask.tolist()
        sampled = np.concatenate([s.logprobs for s in t.steps]).tolist()
        logprobs = np.asarray(fields["logprobs"][i])
        assert logprobs[expected_mask == 1].tolist() == sampled and (logprobs[expected_mask == 0] == 0).all()
        assert fields["env_reward"][i] == sum(s.reward for s in t.steps) and fields["num_turns"][i] == len(t.steps)
    return masked
