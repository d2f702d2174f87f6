"""IFEval scoring throughput: prompts/s scored serially vs in parallel across a vector env's sub-envs.

    python bench/ifeval.py [--data PATH] [--num-envs 16] [--workers N] [--prompts 541] [--repeat 3]

Replies: for row i, the text of the next four IFEval prompts joined as paragraphs (~150-300 words of
real English with markdown, quotes and numbers), so every checker — including language detection and
Punkt sentence splitting — does real work. Each mode scores the same replies; results are checked to
be identical across modes.

Modes:
* ``evaluate`` — :func:`gym_llm.rewards.ifeval.evaluate` in a plain loop (no env): the baseline;
* ``vector serial`` — ``LLMIFEvalVectorEnv(scoring_workers=0)``: one reply after another;
* ``vector threads`` — ``scoring_workers=0, num_workers=N`` threads: shows the GIL (checkers are pure Python);
* ``vector processes`` — ``scoring_workers=N`` processes (the parallel path).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from gym_llm.envs.ifeval import LLMIFEvalVectorEnv  # noqa: E402
from gym_llm.rewards.ifeval import evaluate, prepare  # noqa: E402
from gym_llm_adapters.engines import cpu_paths  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "ifeval" / "input_data.jsonl"


def replies(rows: list[dict]) -> list[str]:
    n = len(rows)
    return ["\n\n".join(rows[(i + k) % n]["prompt"] for k in range(1, 5)) for i in range(n)]


def bench_evaluate(rows: list[dict], texts: list[str], task_ids: list[int]) -> tuple[float, dict]:
    """Score the replies of ``task_ids`` (the vector env's sequence) in a plain loop."""
    rewards = {}
    start = time.perf_counter()
    for t in task_ids:
        row = rows[t]
        rewards[t] = evaluate(texts[t], row["instruction_id_list"], row["kwargs"], prompt=row["prompt"]).strict_fraction
    return len(task_ids) / (time.perf_counter() - start), rewards


def bench_vector(data: Path, texts: list[str], num_prompts: int, num_envs: int, **kwargs) -> tuple[float, dict, list]:
    envs = LLMIFEvalVectorEnv(num_envs, data_files=str(data), task_order="sequential", **kwargs)
    try:
        _, info = envs.reset(seed=0)
        warm = tuple(texts[t] for t in info["task_id"])  # start worker processes before timing
        _, _, _, _, info = envs.step(warm)
        rewards: dict[int, float] = {}
        sequence: list[int] = []
        start = time.perf_counter()
        while len(sequence) < num_prompts:
            task_ids = info["task_id"]
            _, reward, _, _, info = envs.step(tuple(texts[t] for t in task_ids))
            rewards.update(zip(task_ids.tolist(), reward.tolist()))
            sequence += task_ids.tolist()
        return len(sequence) / (time.perf_counter() - start), rewards, sequence
    finally:
        envs.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="IFEval input_data.jsonl")
    parser.add_argument("--num-envs", type=int, default=16, help="sub-envs of the vector env")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="threads / processes")
    parser.add_argument("--prompts", type=int, default=541, help="prompts scored per mode")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode (round-robin); the best is reported")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the record here (bench/results/ifeval.json; see scripts/render_benchmarks.py)")
    args = parser.parse_args()
    print(f"machine: {cpu_paths.describe()}")  # every number below is this machine's
    load_before = os.getloadavg()
    logging.disable(logging.ERROR)  # the checkers log an error for every reply langdetect cannot read
    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    texts = replies(rows)
    prepare()
    bench_evaluate(rows, texts, list(range(50)))  # warm up: regex caches, langdetect profiles, punkt
    modes = {"serial": dict(scoring_workers=0), "threads": dict(scoring_workers=0, num_workers=args.workers),
             "processes": dict(scoring_workers=args.workers)}
    runs: dict[str, list] = {name: [] for name in (*modes, "evaluate")}
    for _ in range(args.repeat):  # round-robin, so that every mode samples the same background load
        for name, kwargs in modes.items():
            runs[name].append(bench_vector(args.data, texts, args.prompts, args.num_envs, **kwargs))
        runs["evaluate"].append(bench_evaluate(rows, texts, runs["serial"][-1][2]))
    best = {name: max(r, key=lambda run: run[0]) for name, r in runs.items()}  # other load only slows a run
    (serial, serial_rewards, _), (threads, _, _) = best["serial"], best["threads"]
    (procs, proc_rewards, _), (base, base_rewards) = best["processes"], best["evaluate"]
    print(f"IFEval scoring, {args.prompts} prompts per mode, num_envs={args.num_envs}, "
          f"workers={args.workers}, cpus={os.cpu_count()}, mean strict reward {np.mean(list(base_rewards.values())):.3f}")
    print(f"load average before/after: {load_before} / {os.getloadavg()} (other processes slow every mode)")
    print(f"{'mode':<34}{'prompts/s':>10}{'vs serial':>11}")
    for name, rate in [("evaluate() loop (no env)", base), ("vector env, serial", serial),
                       (f"vector env, {args.workers} threads", threads),
                       (f"vector env, {args.workers} processes", procs)]:
        print(f"{name:<34}{rate:>10.1f}{rate / serial:>10.2f}x")
    print(f"parallel/serial ratio: {procs / serial:.2f}x (processes), {threads / serial:.2f}x (threads)")
    if args.json:
        from _common import bench_record, write_record

        row = {"what": f"IFEval scoring, {args.prompts} prompts",
               "ours": f"{args.workers} processes {procs:.0f} prompts/s",
               "baseline": f"serial {serial:.0f} prompts/s", "ratio": f"**{procs / serial:.2f}x**",
               "other": f"{args.workers} threads {threads:.0f} prompts/s ({threads / serial:.2f}x); `evaluate()` loop, "
                        f"no env, {base:.0f} prompts/s"}
        figures = {"prompts_per_s": {"serial": serial, "threads": threads, "processes": procs, "evaluate": base},
                   "prompts": args.prompts, "num_envs": args.num_envs, "workers": args.workers}
        write_record(args.json, bench_record("ifeval.py", title="IFEval scoring", order=100, rows=[row],
                                             figures=figures))


if __name__ == "__main__":
    main()
