"""Registration of every gym-llm env id with Gymnasium (entry points are strings: importing gym_llm stays cheap)."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym

__all__ = ["ENVS", "EnvInfo", "register_envs"]


@dataclass(frozen=True)
class EnvInfo:
    """What ``gym-llm list`` shows for one env id."""

    id: str
    entry_point: str
    vector_entry_point: str
    description: str
    reward_range: str
    action: str = "reply text (UnicodeText), or sampled token ids in tokens mode"
    observation: str = "the conversation rendered up to the generation prompt (text), or its ids + mask"
    commands: tuple[str, ...] = ("play", "eval", "train")
    """The ``gym-llm`` subcommands that work with this env (the others refuse it up front, saying why)."""
    not_for: str = ""
    """Why the other subcommands do not apply (shown when one is refused)."""


ENVS: tuple[EnvInfo, ...] = (
    EnvInfo("LLMBrowser-v0", "gym_llm.envs.browser:LLMBrowserEnv", "gym_llm.envs.browser:LLMBrowserVectorEnv",
            "answer questions by browsing a local website with a real headless Chromium (Playwright)",
            "{0, 1} (+ format_reward)"),
    EnvInfo("LLMChat-v0", "gym_llm.envs.chat:LLMChatEnv", "gym_llm.envs.chat:LLMChatVectorEnv",
            "multi-turn chat; scripted or simulated user turns; reward hook", "reward_fn (default 0)"),
    EnvInfo("LLMGSM8K-v0", "gym_llm.envs.gsm8k:LLMGSM8KEnv", "gym_llm.envs.gsm8k:LLMGSM8KVectorEnv",
            "grade-school math word problems, scored on the final answer", "{0, 1} (+ format_reward)"),
    EnvInfo("LLMIFEval-v0", "gym_llm.envs.ifeval:LLMIFEvalEnv", "gym_llm.envs.ifeval:LLMIFEvalVectorEnv",
            "instruction following (IFEval), official strict/loose checks", "[0, 1] (fraction or all-or-nothing)"),
    EnvInfo("LLMHashing-v0", "gym_llm.envs.hashing:LLMHashingEnv", "gym_llm.envs.hashing:LLMHashingVectorEnv",
            "token-level env for tree search: one token per step, 64-bit chain hash", "reward_fn at episode end (default 0)",
            action="one token id (Discrete(V))",
            observation="token ids + mask + 64-bit chain hash (+ incrementally decoded text)",
            commands=("play",),
            not_for="it is a token-level env for tree search (one action = one token id), while `gym-llm eval` and "
                    "`train` sample whole replies; drive it from Python (examples/mcts_hashing.py), or play it "
                    "yourself with `gym-llm play LLMHashing-v0`"),
    EnvInfo("LLMPythonTool-v0", "gym_llm.envs.python_tool:LLMPythonToolEnv",
            "gym_llm.envs.python_tool:LLMPythonToolVectorEnv",
            "chat with a sandboxed persistent Python interpreter; default task GSM8K with code",
            "task reward: {0, 1} on GSM8K (+ format_reward)"),
    EnvInfo("LLMTokens-v0", "gym_llm.envs.tokens:LLMTokensEnv", "gym_llm.envs.tokens:LLMTokensVectorEnv",
            "generic token/text concatenation; eos or length ends an episode", "reward_fn (default 0)",
            action="token ids (MultiDiscrete + mask), or text", observation="the sequence so far (ids + mask, or text)"),
)


def register_envs() -> None:
    """Register every env id (idempotent)."""
    for info in ENVS:
        if info.id in gym.registry:
            continue
        gym.register(
            id=info.id,
            entry_point=info.entry_point,
            vector_entry_point=info.vector_entry_point,
            disable_env_checker=False,
        )
