"""Shared settings of the TRL tests (imported by conftest.py and the tests): real GSM8K tasks, a tool env, and the
episodes that teach the tiny model to use the tool (see conftest.py)."""

from __future__ import annotations

TASK = 305  # GSM8K test row: "John arm wrestles 20 people.  He beats 80%.  How many people did he lose to?" -> 4
CODE_REPLY = "```python\nprint(20-16)\n```<|im_end|>"
ANSWER_REPLIES = ("#### 4<|im_end|>", "Not sure.<|im_end|>")
PLAIN_CHATML = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
                "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
"""ChatML without a tools section in the system prompt: keeps the test episodes short (~120 tokens)."""
TOOL_ENV = dict(max_turns=3, system_prompt="Run code.", prompt_template="{question}\nUse python.",
                chat_template=PLAIN_CHATML, sandbox={"timeout_s": 10.0})
"""``LLMPythonTool-v0`` arguments of the tests (besides ``data_files``)."""


def _ids(obs):
    return obs["input_ids"][obs["attention_mask"] == 1].tolist()


def teaching_episodes(tokenizer, data_files) -> list[tuple[list[int], list[int]]]:
    """``(token_ids, loss_mask)`` of the episodes to learn, recorded from the envs themselves."""
    import gymnasium as gym
    import numpy as np

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
