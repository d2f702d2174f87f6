"""What the GSM8K grading deadline costs: env step time with it, and the deadline's own overhead where it applies.

Grading runs math-verify in a worker process killed past its deadline (``gym_llm.rewards.deadline``), so one
pathological answer cannot hang a step. This measures, in one run on the same answers:

1. ``LLMGSM8K-v0`` (native vector env, B=64, text mode) stepping GSM8K test problems with real worked solutions as
   replies (each task's own solution, its final line rewritten into the ``####``, ``\\boxed{}`` and "The answer is"
   styles): CPU time per sample, and how many grades took the deadline (worker) path. Under the one-answer rule a
   numeric reference never reaches math-verify, so on GSM8K that count is 0 and the deadline costs nothing.
2. Where the deadline does apply (symbolic references, other datasets): math-verify through the deadline worker vs
   the same math-verify call in-process with no deadline, per call, on equivalent answers; the difference is the
   deadline's cost, reported as a fraction of the call and of a GSM8K env step.
3. A user-supplied shaping hook (``reward_fn``, a length penalty): every env runs it in a deadline worker process by
   default; wall time per sample of the same GSM8K vector steps with the hook isolated (default) vs called in the
   env's thread (``reward_timeout_s=None``, no deadline).

    python bench/grading.py                     # 1,319 test problems (GSM8K test split)
    python bench/grading.py --steps 100

Reads GSM8K's test split (``--data-files``, default ``$GYM_LLM_DATA/gsm8k/test.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import gymnasium as gym

import gym_llm  # noqa: F401
from gym_llm.rewards import gsm8k

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_overhead import _default_data  # noqa: E402  (the same GSM8K test split)


STYLES = ("#### {n}", "\\boxed{{{n}}}", "The answer is {n}.")


def replies(rows: list[dict]) -> list[str]:
    """Each task's own worked solution, its ``#### N`` line in one of three styles (cycled)."""
    out = []
    for k, row in enumerate(rows):
        work, _, answer = row["answer"].rpartition("####")
        out.append(work.rstrip() + "\n" + STYLES[k % len(STYLES)].format(n=answer.strip()))
    return out


def env_step_cost(data_files: str, rows: list[dict], batch: int, steps: int) -> tuple[float, int, int]:
    """CPU seconds per sample of vector steps, grades that reached math-verify, grades in all."""
    calls = {"n": 0}
    real = gsm8k._math_verify_equal

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    gsm8k._math_verify_equal = counting
    envs = gym.make_vec("LLMGSM8K-v0", num_envs=batch, vectorization_mode="vector_entry_point", data_files=data_files,
                        task_order="sequential", task_assignment="partition")
    texts = replies(rows)
    try:
        _, info = envs.reset(seed=0)
        correct = graded = 0
        start = time.process_time()
        for _ in range(steps):
            actions = tuple(texts[int(t)] for t in info["task_id"])
            _, rewards, _, _, info = envs.step(actions)
            correct += int(rewards.sum())
            graded += batch
        cpu = time.process_time() - start
    finally:
        envs.close()
        gsm8k._math_verify_equal = real
    assert correct == graded, f"every reference solution should be graded correct; {correct}/{graded}"
    return cpu / graded, calls["n"], graded


SYMBOLIC = [(r"\frac{x^2}{x}", "x"), ("2*x + x", "3*x"), (r"\sqrt{x^2}", "|x|"), ("(x+1)^2", "x^2 + 2*x + 1"),
            (r"\frac{a}{2} + \frac{a}{2}", "a"), ("y*y", "y^2")]


def deadline_overhead(repeats: int) -> tuple[float, float]:
    """Seconds per math-verify check in-process (no deadline) and through the deadline worker."""
    from math_verify import parse, verify

    def direct(pred: str, ref: str) -> bool:
        return bool(verify(parse(f"${ref}$"), parse(f"${pred}$")))

    for pred, ref in SYMBOLIC:  # warm both paths (imports, a worker started); both give the same verdicts
        assert direct(pred, ref) == gsm8k._math_verify_equal(pred, ref), (pred, ref)
    times = {"direct": 0.0, "deadline": 0.0}
    for _ in range(repeats):
        for name, fn in (("direct", direct), ("deadline", gsm8k._math_verify_equal)):
            start = time.perf_counter()
            for pred, ref in SYMBOLIC:
                fn(pred, ref)
            times[name] += time.perf_counter() - start
    n = repeats * len(SYMBOLIC)
    return times["direct"] / n, times["deadline"] / n


def length_penalty(task, messages) -> float:
    """A typical shaping hook: -0.001 per character of the reply."""
    return -0.001 * len(messages[-1].content)


def hook_overhead(data_files: str, rows: list[dict], batch: int, steps: int) -> tuple[float, float]:
    """Wall seconds per sample of GSM8K vector steps with ``length_penalty`` isolated (default) and inline."""
    texts = replies(rows)
    out = {}
    for name, timeout in (("inline", None), ("isolated", 30.0), ("inline", None), ("isolated", 30.0)):
        envs = gym.make_vec("LLMGSM8K-v0", num_envs=batch, vectorization_mode="vector_entry_point",
                            data_files=data_files, task_order="sequential", task_assignment="partition",
                            reward_fn=length_penalty, reward_timeout_s=timeout)
        try:
            _, info = envs.reset(seed=0)
            envs.step(tuple(texts[int(t)] for t in info["task_id"]))  # warm: the worker starts outside the timing
            _, info = envs.reset(seed=0)
            start = time.perf_counter()
            for _ in range(steps):
                _, _, _, _, info = envs.step(tuple(texts[int(t)] for t in info["task_id"]))
            out[name] = min(out.get(name, float("inf")), (time.perf_counter() - start) / (steps * batch))
        finally:
            envs.close()
    return out["isolated"], out["inline"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-files", default=None)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=None, help="vector steps (default: one pass over the tasks)")
    parser.add_argument("--repeats", type=int, default=20, help="rounds of the math-verify comparison")
    parser.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                        help="write the record to PATH (bench/results/grading.json; see scripts/render_benchmarks.py); "
                             "alone, print the raw figures as JSON instead of the report")
    args = parser.parse_args()
    data = args.data_files or _default_data()
    rows = [json.loads(line) for line in Path(data).read_text().splitlines() if line.strip()]
    steps = args.steps or len(rows) // args.batch
    per_sample, worker_calls, graded = env_step_cost(data, rows, args.batch, steps)
    direct, deadline = deadline_overhead(args.repeats)
    overhead = deadline - direct
    isolated, inline = hook_overhead(data, rows, args.batch, steps)
    result = {
        "env_step_cpu_us_per_sample": per_sample * 1e6, "grades": graded, "grades_on_deadline_path": worker_calls,
        "deadline_cost_fraction_of_gsm8k_step": worker_calls / graded * overhead / per_sample,
        "math_verify_in_process_ms": direct * 1e3, "math_verify_with_deadline_ms": deadline * 1e3,
        "deadline_overhead_ms_per_check": overhead * 1e3, "deadline_overhead_fraction_of_check": overhead / direct,
        "hook_inline_us_per_sample": inline * 1e6, "hook_isolated_us_per_sample": isolated * 1e6,
    }
    if args.json == "-":
        print(json.dumps(result))
        return
    from gym_llm_adapters.engines import cpu_paths

    print(f"machine: {cpu_paths.describe()}")  # every number below is this machine's
    print(f"LLMGSM8K-v0, B={args.batch}, {graded} real worked solutions ({' / '.join(s.split('{')[0] or s for s in STYLES)} styles):")
    print(f"  env step {per_sample * 1e6:.1f} us CPU per sample; grades that took the deadline path: {worker_calls} "
          f"of {graded} -> the deadline costs {result['deadline_cost_fraction_of_gsm8k_step']:.1%} of the step "
          "(target < 5%)")
    print(f"math-verify on symbolic answers, {len(SYMBOLIC)} x {args.repeats}: in-process {direct * 1e3:.2f} ms, "
          f"under the deadline {deadline * 1e3:.2f} ms per check -> overhead {overhead * 1e3:+.3f} ms "
          f"({result['deadline_overhead_fraction_of_check']:+.1%} of a check)")
    print(f"a user shaping hook (reward_fn) on the same steps, wall time per sample: in the env's thread "
          f"{inline * 1e6:.0f} us, in its deadline worker (the default) {isolated * 1e6:.0f} us -> "
          f"{(isolated - inline) * 1e6:+.0f} us per call ({isolated / inline:.2f}x the step)")
    if args.json:
        from _common import bench_record, write_record

        rows = [{"what": f"GSM8K grading deadline, B={args.batch}, {graded:,} real solutions",
                 "ours": f"env step {per_sample * 1e6:.1f} µs CPU per sample; {worker_calls} grades took the "
                         "deadline path",
                 "ratio": f"**{result['deadline_cost_fraction_of_gsm8k_step']:.0%} of the step**", "target": "< 5%"},
                {"what": "a user `reward_fn` in its deadline worker (the default), same steps",
                 "ours": f"{isolated * 1e6:.0f} µs wall per sample",
                 "baseline": f"the hook in the env's thread (`reward_timeout_s=None`) {inline * 1e6:.0f} µs",
                 "ratio": f"**{(isolated - inline) * 1e6:+.0f} µs per call**"}]
        write_record(args.json, bench_record("grading.py", title="Grading deadlines", order=80, rows=rows,
                                             figures=result))


if __name__ == "__main__":
    main()
