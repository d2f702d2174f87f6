"""GRPO on tree groups: each group's members share the leader's first turn(s) of a multi-turn episode, then go on on
their own, so the group's advantage compares continuations of one state (docs/branching.md, "Tree rollouts").

    bash scripts/setup.sh && .venv/bin/gym-llm train grpo --config examples/configs/smollm2_quick.toml --out runs/smollm2
    .venv/bin/python examples/tree_grpo.py --model runs/smollm2 --steps 20
    python examples/tree_grpo.py --tiny     # a smoke test: the tiny random model, 2 GRPO steps (about a minute)

The episode is tree_search.py's quiz: ``--turns`` two-digit sums asked one after another in one conversation
(``LLMChat-v0``), each reply scored by GSM8K's scorer (a per-turn reward). Training quizzes draw their operands from the
80% of pairs the README's main job trains on, evaluation quizzes from the held-out 20%. ``Trainer`` runs GRPO with
``branch_turn`` (``gym-llm train grpo --branch-turn``): in each group of ``--group-size`` the leader answers the first
``branch_turn`` questions alone, the others continue forks of its episode (``envs.branch``), and the shared turns are
context in every member (masked out of the loss). Generation saved against flat groups: ``(G - 1) * branch_turn``
replies per group, printed at the end from the trainer's own records. Evaluation: greedy, on ``--eval-quizzes``
held-out quizzes (all answers right = solved), before the first step and after the last.

What it does not show (yet): that tree groups train better than flat groups at the same generation budget — that
needs both runs side by side on held-out quizzes (docs/branching.md lists it as not done).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/_common.py, when run as a script

from _common import parse_flags  # noqa: E402
from tree_search import model_dir, quiz_reward, sum_quiz  # noqa: E402


@dataclass
class Args:
    model: str = "runs/smollm2"
    """a `gym-llm train` run folder (its newest checkpoint), a checkpoint folder, or `smollm2`/`tiny`"""
    steps: int = 20
    """GRPO steps"""
    turns: int = 3
    """questions per quiz"""
    branch_turn: int = 1
    """turns each group shares (the leader's), before its members go on on their own"""
    num_tasks: int = 4
    """quizzes (groups) per step"""
    group_size: int = 8
    """members per group"""
    learning_rate: float = 1e-5
    """AdamW learning rate"""
    beta: float = 0.02
    """KL to the starting model, in the loss"""
    max_new_tokens: int = 48
    """the most tokens per reply"""
    train_quizzes: int = 2000
    """training quizzes (operands from the main job's training pairs)"""
    eval_quizzes: int = 100
    """held-out quizzes evaluated before and after"""
    engine: Literal["vllm", "hf"] = "vllm"
    """generation engine"""
    seed: int = 0
    """draws the quizzes and seeds the run"""
    out: str = "runs/tree_grpo"
    """the run folder (metrics, rollouts, checkpoints; `gym-llm view` reads it)"""
    tiny: bool = False
    """smoke-test preset: the tiny random model, 2 steps of 2 quizzes x 4, 8 held-out quizzes, transformers engine"""


PRESETS = {"tiny": {"model": "tiny", "steps": 2, "turns": 2, "num_tasks": 2, "group_size": 4, "max_new_tokens": 8,
                    "train_quizzes": 16, "eval_quizzes": 8, "engine": "hf", "learning_rate": 1e-4,
                    "out": "runs/tree_grpo_tiny"}}


def main(args: Args) -> dict[str, Any]:
    from gym_llm_adapters.rollout_io import read_rollouts
    from gym_llm_adapters.training import TrainConfig, Trainer

    max_seq_len = args.turns * (96 + args.max_new_tokens) + 64
    cfg = TrainConfig(
        algorithm="grpo", env_id="LLMChat-v0", model=model_dir(args.model), out_dir=Path(args.out),
        engine=args.engine, device="cpu", seed=args.seed, steps=args.steps, num_tasks=args.num_tasks,
        group_size=args.group_size, branch_turn=args.branch_turn, learning_rate=args.learning_rate, beta=args.beta,
        max_new_tokens=args.max_new_tokens, max_seq_len=max_seq_len, eval_every=0,
        eval_episodes=args.eval_quizzes, save_every=max(args.steps, 1), progress=False,
        env_kwargs={"prompts": sum_quiz(args.train_quizzes, args.turns, args.seed, "train"), "max_turns": args.turns,
                    "reward_fn": quiz_reward},
        eval_env_kwargs={"prompts": sum_quiz(args.eval_quizzes, args.turns, args.seed)})
    with Trainer(cfg) as trainer:
        result = trainer.run()
    first, last = result.evals[0], result.evals[-1]
    trajectories = read_rollouts(cfg.out_dir / "rollouts.jsonl")
    shared = sum(t.shared_turns for t in trajectories)
    # an episode's return is its count of right answers; solved = every answer right
    summary = {
        "steps": result.steps, "trajectories": len(trajectories),
        "replies_saved": shared * (args.group_size - 1) // args.group_size,  # all but the leader's, per group
        "held_out_mean_right": {"before": first[1].reward_mean, "after": last[1].reward_mean},
        "eval_steps": [first[0], last[0]],
    }
    print(f"{result.steps} GRPO steps on tree groups (branch_turn={args.branch_turn}): "
          f"{summary['trajectories']} trajectories, {summary['replies_saved']} replies not generated "
          f"(shared with their group's leader)")
    print(f"held-out quizzes ({args.eval_quizzes}, greedy): {first[1].reward_mean:.2f} -> "
          f"{last[1].reward_mean:.2f} right answers per quiz (of {args.turns})")
    (cfg.out_dir / "tree_grpo.json").write_text(json.dumps({"args": vars(args), **summary}, indent=1))
    return summary


if __name__ == "__main__":
    main(parse_flags(Args, __doc__, presets=PRESETS))
