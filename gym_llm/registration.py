"""Registration of every gym-llm env id with Gymnasium (entry points are strings: importing gym_llm stays cheap)."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym

__all__ = ["CLIENT_ENVS", "CHECKOUT_ENVS", "ENVS", "EnvInfo", "markdown_table", "register_envs"]


@dataclass(frozen=True)
class EnvInfo:
    """One env id: what Gymnasium registers, what ``gym-llm list`` shows and the README's env table holds
    (``gym-llm list --markdown`` writes that table from these; ``tests/test_readme.py`` checks it)."""

    id: str
    entry_point: str
    """``"module:Class"`` of the scalar env."""
    description: str
    reward_range: str
    """What a step pays, in short (``gym-llm list``)."""
    reward: str = ""
    """The README table's reward column, in full (default: ``reward_range``)."""
    action: str = "reply text (UnicodeText), or sampled token ids in tokens mode"
    observation: str = "the conversation rendered up to the generation prompt (text), or its ids + mask"
    commands: tuple[str, ...] = ("play", "eval", "train")
    """The ``gym-llm`` subcommands that work with this env (the others refuse it up front, saying why)."""
    not_for: str = ""
    """Why the other subcommands do not apply (shown when one is refused)."""
    vector_entry_point: str = ""
    """``"module:Class"`` of the native vector env; by default the one :class:`~gym_llm.core.env.LLMEnv` derives
    for an env declared with ``build=`` (``LLMFooEnv`` -> ``LLMFooVectorEnv`` in the same module)."""
    variants: str = ""
    """Optional ``"module:function"`` returning the names of what the env can be pointed at (e.g. every
    reasoning-gym dataset), listed by ``gym-llm list``; imported only then."""

    def __post_init__(self) -> None:
        if not self.vector_entry_point:
            from gym_llm.core.env import vector_name

            module, name = self.entry_point.split(":")
            object.__setattr__(self, "vector_entry_point", f"{module}:{vector_name(name)}")


ENVS: tuple[EnvInfo, ...] = (
    EnvInfo("LLMChat-v0", "gym_llm.envs.chat:LLMChatEnv",
            "multi-turn chat; scripted or simulated user; reward hook", "reward_fn (default 0)",
            reward="`reward_fn(task, messages)`, default 0"),
    EnvInfo("LLMGSM8K-v0", "gym_llm.envs.gsm8k:LLMGSM8KEnv",
            "grade-school math (local jsonl, `datasets`, or generated offline)", "{0, 1} (+ format_reward)",
            reward="1.0 if the final answer is right under the one-answer rule ([docs/verifiers.md](docs/verifiers.md): "
            "exactly one final answer — no candidate lists, negations, hedges, operators or multipliers; math-verify "
            "under a hard deadline), else 0.0; + `format_reward` for `#### N`"),
    EnvInfo("LLMIFEval-v0", "gym_llm.envs.ifeval:LLMIFEvalEnv",
            "instruction following (IFEval's 541 prompts), scored exactly like the official evaluation",
            "[0, 1] (fraction or all-or-nothing)",
            reward="fraction of instructions followed (strict; or all-or-nothing, or loose), per-instruction results in "
            "`info`"),
    EnvInfo("LLMCountdown-v0", "gym_llm.envs.countdown:LLMCountdownEnv",
            "Countdown (TinyZero): reach the target with + - * / over the given numbers, each at most once; "
            "generated offline with known solutions, or TinyZero's `nums`/`target` files", "{0, 1} (+ format_reward)",
            reward="1.0 if the expression in `<answer>` is valid and equals the target (exact arithmetic, no `eval`), else "
            "0.0; + `format_reward` for a parseable `<answer>`"),
    EnvInfo("LLMReasoningGym-v0", "gym_llm.envs.reasoning_gym:LLMReasoningGymEnv",
            "any of reasoning-gym's procedural datasets by name (arithmetic, logic, puzzles, ...), difficulty "
            "settings passed through", "[0, 1]: the dataset's score_answer (+ format_reward)",
            reward="the dataset's own `score_answer` on the `<answer>` (0.0–1.0); + `format_reward` for an `<answer>` tag",
            variants="gym_llm.envs.reasoning_gym:dataset_names"),
    EnvInfo("LLMPythonTool-v0", "gym_llm.envs.python_tool:LLMPythonToolEnv",
            "chat with a sandboxed persistent Python interpreter; default task GSM8K solved with code",
            "task reward: {0, 1} on GSM8K (+ format_reward)", reward="the task's reward (GSM8K correctness)",
            observation="the conversation rendered up to the generation prompt (text), or its ids + mask; tool "
                        "results come back as `tool` turns"),
    EnvInfo("LLMCode-v0", "gym_llm.envs.code:LLMCodeEnv",
            "write a program that passes the task's unit tests, run in sandboxes (HumanEval offline, CodeI/O, "
            "generated function tasks, your jsonl)", "{0, 1} (or the fraction of tests passed)",
            reward="1.0 if the reply's program passes every test (the program in one sandbox, the tests in another, "
            "plain data between: [docs/code.md](docs/code.md)), else 0.0; or the fraction passed"),
    EnvInfo("LLMBrowser-v0", "gym_llm.envs.browser:LLMBrowserEnv",
            "answer questions by browsing a local website the env serves on 127.0.0.1 with a real headless Chromium "
            "(Playwright); built-in site: an invented town's wiki, shop, accounts, ferry", "{0, 1} (+ format_reward)",
            reward="1.0 if the `Answer:` line matches an accepted answer, else 0.0 (+ `format_reward`)",
            observation="the conversation rendered up to the generation prompt (text), or its ids + mask; browser "
                        "results come back as `tool` turns"),
    EnvInfo("LLMHashing-v0", "gym_llm.envs.hashing:LLMHashingEnv",
            "token-level env for tree search: one action = one token, 64-bit chain hash per node",
            "reward_fn at episode end (default 0)", reward="`reward_fn` at episode end, default 0",
            action="one token id (`Discrete(V)`)",
            observation="token ids + mask + 64-bit chain `hash` (uint64) (+ incrementally decoded text)",
            commands=("play",),
            not_for="it is a token-level env for tree search (one action = one token id), while `gym-llm eval` and "
                    "`train` sample whole replies; drive it from Python (examples/mcts_hashing.py), or play it "
                    "yourself with `gym-llm play LLMHashing-v0`"),
    EnvInfo("LLMTokens-v0", "gym_llm.envs.tokens:LLMTokensEnv",
            "generic token/text concatenation; eos / stop strings / length end it", "reward_fn (default 0)",
            reward="`reward_fn(task, sequence, done)`, default 0",
            action="token ids (MultiDiscrete + mask), or text", observation="the sequence so far (ids + mask, or text)"),
)


def markdown_table(envs: tuple[EnvInfo, ...] = ENVS) -> str:
    """The README's env table: one row per id; a cell equal to the one above it reads "same"."""
    rows = ["| id | what | action | observation | reward |", "|---|---|---|---|---|"]
    previous: tuple[str, ...] = ()
    for info in envs:
        cells = (info.description, info.action, info.observation, info.reward or info.reward_range)
        shown = ["same" if previous and cell == previous[i] else cell.replace("|", "\\|")
                 for i, cell in enumerate(cells)]
        rows.append(f"| `{info.id}` | " + " | ".join(shown) + " |")
        previous = cells
    return "\n".join(rows)


CLIENT_ENVS: dict[str, str] = {
    "OpenEnv-v0": "gym_llm.integrations.openenv_client:OpenEnvClientEnv",
}
"""Ids of envs that are clients of an env somewhere else (``gym.make("OpenEnv-v0", base_url=...)`` drives an OpenEnv
server: docs/peers.md), id -> entry point. Not in :data:`ENVS`: they need a server, so ``gym-llm list``, the README
table and the every-env tests leave them out."""


CHECKOUT_ENVS: tuple[EnvInfo, ...] = (
    EnvInfo("LLMMLGym-v0", "gym_llm.envs.mlgym:LLMMLGymEnv",
            "MLGym's ML research tasks from a user's MLGym checkout (edit, run, validate, submit in a sandboxed "
            "workspace; graded by the task's own evaluation in a separate sandbox), no Docker",
            "{0, 1} vs the baseline (or the metric, or its improvement)",
            reward="1.0 if the task's metric reaches its baseline (or `threshold`), else 0.0; or the metric, or its "
                   "improvement over the baseline ([docs/mlgym.md](docs/mlgym.md))",
            observation="the conversation rendered up to the generation prompt (text), or its ids + mask; command "
                        "outputs come back as `tool` turns"),
)
"""Envs over tasks read from a checkout the user points them at (``gym.make("LLMMLGym-v0", task_config_path=...)``):
registered with their native vector envs, but not in :data:`ENVS` — nothing to build them from by default, so
``gym-llm list``, the README table and the every-env tests leave them out."""


def register_envs() -> None:
    """Register every env id, the :data:`CHECKOUT_ENVS` and the :data:`CLIENT_ENVS` (idempotent)."""
    for info in ENVS:
        if info.id in gym.registry:
            continue
        gym.register(
            id=info.id,
            entry_point=info.entry_point,
            vector_entry_point=info.vector_entry_point,
            disable_env_checker=False,
        )
    for info in CHECKOUT_ENVS:
        if info.id not in gym.registry:
            gym.register(id=info.id, entry_point=info.entry_point, vector_entry_point=info.vector_entry_point,
                         disable_env_checker=False)
    for env_id, entry_point in CLIENT_ENVS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=False)
