"""Does each reasoning-gym dataset's scorer give 1.0 to the dataset's own reference answers, through LLMReasoningGym-v0?

For every dataset (or those named), generates ``--size`` tasks, answers each with its reference inside
``<answer>`` tags, steps the env, and prints one row per dataset: rewards, the share that scored 1.0, and why not
(no single reference answer — the dataset checks validity instead —, settings it needs, an error).

    python scripts/reasoning_gym_scorers.py                 # all datasets, 5 tasks each (about 2 minutes on 2 cores)
    python scripts/reasoning_gym_scorers.py chain_sum maze --size 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def measure(name: str, size: int, seed: int) -> dict:
    import gymnasium as gym

    import gym_llm  # noqa: F401  (registers the envs)

    start = time.perf_counter()
    try:
        env = gym.make("LLMReasoningGym-v0", dataset=name, size=size, seed=seed, task_order="sequential")
    except Exception as e:
        return {"dataset": name, "error": f"{type(e).__name__}: {str(e)[:160]}"}
    rewards, no_reference = [], 0
    try:
        for task_id in range(size):
            env.reset(options={"task_id": task_id})
            task = env.unwrapped.episode.task
            if task.answer is None:
                no_reference += 1
            _, reward, *_ = env.step(f"<answer>{task.answer}</answer>")
            rewards.append(float(reward))
    finally:
        env.close()
    return {"dataset": name, "rewards": rewards, "full_marks": sum(r >= 1.0 for r in rewards) / len(rewards),
            "no_reference": no_reference, "seconds": round(time.perf_counter() - start, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="*", help="dataset names (default: all)")
    parser.add_argument("--size", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    from gym_llm.envs.reasoning_gym import dataset_names

    rows = []
    for name in args.datasets or dataset_names():
        row = measure(name, args.size, args.seed)
        rows.append(row)
        why = row.get("error") or (f"{row['no_reference']} of {args.size} tasks have no reference answer"
                                   if row.get("no_reference") else "")
        print(f"{name:28s} {row.get('full_marks', 0):6.0%}  {why}", flush=True)
    full = [r for r in rows if r.get("full_marks") == 1.0]
    print(f"\n{len(full)} of {len(rows)} datasets give 1.0 to every reference answer")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
