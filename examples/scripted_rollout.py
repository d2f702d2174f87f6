"""Roll out GRPO groups on LLMGSM8K-v0 with a scripted "policy" — no model needed.

The policy answers each problem correctly with probability ``--accuracy`` (otherwise off by one), in one
of several answer styles the checker understands. The script prints each round's per-group rewards and
the overall accuracy the env measured, which should match ``--accuracy``.

    python examples/scripted_rollout.py                       # offline: generated GSM-style problems
    python examples/scripted_rollout.py --data-files path/to/gsm8k/test.jsonl
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

import gym_llm  # noqa: F401  (registers the env ids)

STYLES = ("Step by step... so the result is {a}.\n#### {a}", "The answer is {a}.", "\\boxed{{{a}}}", "A: {a}")


@dataclass
class Args:
    num_tasks: int = 4
    """problems per round (GRPO groups)"""
    group_size: int = 4
    """samples per problem"""
    rounds: int = 5
    accuracy: float = 0.7
    """probability that the scripted policy answers correctly"""
    data_files: str | None = None
    """a GSM8K .jsonl; default: problems generated offline by reasoning-gym"""
    seed: int = 0


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in Args.__dataclass_fields__.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default.default) if default.default is not None else str,
                            default=default.default)
    return Args(**vars(parser.parse_args()))


def main() -> None:
    args = parse_args()
    source = {"data_files": args.data_files} if args.data_files else {"source": "gsm_symbolic", "num_generated": 200}
    envs = gym.make_vec("LLMGSM8K-v0", num_envs=args.num_tasks * args.group_size, group_size=args.group_size, **source)
    rng = np.random.default_rng(args.seed)
    _, info = envs.reset(seed=args.seed)
    correct = 0
    for round_ in range(args.rounds):
        answers = [episode.task.answer for episode in envs.unwrapped.episodes]
        actions = []
        for answer in answers:
            value = answer if rng.random() < args.accuracy else str(int(float(answer)) + 1)
            actions.append(STYLES[rng.integers(len(STYLES))].format(a=value))
        _, rewards, terminated, _, info = envs.step(tuple(actions))
        final = info["final_info"]
        per_group = rewards.reshape(args.num_tasks, args.group_size)
        tasks = final["task_id"].reshape(args.num_tasks, args.group_size)[:, 0]
        print(f"round {round_}: " + "  ".join(f"task {t}: {g.tolist()}" for t, g in zip(tasks, per_group)))
        correct += int(rewards.sum())
    total = args.rounds * args.num_tasks * args.group_size
    print(f"measured accuracy {correct / total:.3f} over {total} episodes (policy accuracy {args.accuracy})")
    envs.close()


if __name__ == "__main__":
    main()
