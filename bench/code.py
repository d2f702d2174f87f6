"""LLMCode-v0 grading throughput: all 164 canonical HumanEval solutions through the native vector env, and how that
compares with generating the replies at the SmolLM2 shape.

Grading: ``gym.make_vec("LLMCode-v0", num_envs=B)``; each round resets the B sub-envs onto the next B problems
(``options={"task_ids": ...}``) and steps them with the canonical solutions (each sub-env's program in a sandbox of
its own, the tests in another, B gradings in parallel threads). Every one must score 1.0. Reported per repeat and as
the median of ``--repeats``: problems/s, tests/s (the test statements the grader counts: 1,181 per pass over
HumanEval, a loop of asserts counting once), the grading latency per problem (p50, p95).

Generation (``--generate``): SmolLM2-135M-Instruct on in-process vLLM (CPU here) samples a reply for each of the same
164 prompts (rendered by the env in tokens mode with SmolLM2's chat template), ``--max-tokens`` tokens each
(``ignore_eos``: a fixed length), ``--gen-batch`` prompts per call. The ratio grading time / generation time says
whether grading can be the bottleneck of a rollout. Without ``--generate``, ``--tokens-per-s`` (a throughput measured
elsewhere) gives the estimate.

    python bench/code.py                              # grading only, B=8
    python bench/code.py --num-envs 16 --generate     # and SmolLM2 generation on vLLM
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "adapters")]

import gymnasium as gym  # noqa: E402

import gym_llm  # noqa: E402,F401


def grade_all(envs, solutions: list[str], num_envs: int) -> tuple[float, int, list[float]]:
    """One pass over every problem: ``(wall_s, tests graded, per-problem grading seconds)``."""
    tests, latencies = 0, []
    start = time.perf_counter()
    for first in range(0, len(solutions), num_envs):
        ids = [min(k, len(solutions) - 1) for k in range(first, first + num_envs)]
        envs.reset(seed=0, options={"task_ids": ids})
        _, rewards, terminated, _, info = envs.step(tuple(solutions[k] for k in ids))
        final = info["final_info"]
        real = len(set(ids))  # the last round repeats the last problem to fill its sub-envs
        if not (terminated.all() and (rewards == 1.0).all()):
            bad = [(ids[i], final["first_failure"][i]) for i in range(num_envs) if rewards[i] != 1.0]
            raise SystemExit(f"a canonical solution failed: {bad}")
        tests += int(sum(final["num_tests"][:real]))
        latencies += [float(x) for x in final["grading_s"][:real]]
    return time.perf_counter() - start, tests, latencies


def measure_generation(args, prompts) -> tuple[float, int]:
    """SmolLM2 on vLLM: ``(wall_s, tokens)`` to sample one ``--max-tokens`` reply per prompt."""
    from gym_llm_adapters.engines import SamplingConfig, VLLMEngine
    from gym_llm_adapters.models.smollm2 import smollm2_model_dir

    engine = VLLMEngine(smollm2_model_dir(dtype="bfloat16"), dtype="bfloat16", enforce_eager=True,
                        kv_cache_memory_bytes=1 << 30)
    try:
        sampling = SamplingConfig(max_tokens=args.max_tokens, temperature=1.0, ignore_eos=True, seed=0)
        engine.generate(prompts[:args.gen_batch], sampling)  # warm-up
        tokens, start = 0, time.perf_counter()
        for first in range(0, len(prompts), args.gen_batch):
            tokens += sum(len(c.token_ids) for c in engine.generate(prompts[first:first + args.gen_batch], sampling))
        return time.perf_counter() - start, tokens
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-envs", type=int, default=8, help="sub-envs graded at once (default 8)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--generate", action="store_true", help="measure SmolLM2 generation on vLLM too")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per generated reply (default 256)")
    parser.add_argument("--gen-batch", type=int, default=64, help="prompts per vLLM call (default 64)")
    parser.add_argument("--tokens-per-s", type=float, default=None,
                        help="without --generate: a generation throughput measured elsewhere, for the ratio")
    parser.add_argument("--json", type=Path, default=None,
                        help="write the record here (bench/results/code.json; see scripts/render_benchmarks.py)")
    args = parser.parse_args()

    envs = gym.make_vec("LLMCode-v0", num_envs=args.num_envs, vectorization_mode="vector_entry_point")
    solutions = [task.data["solution"] for task in envs.unwrapped.parts.tasks]
    grade_all(envs, solutions[:args.num_envs], args.num_envs)  # warm-up: the pools start
    runs = []
    for repeat in range(args.repeats):
        wall, tests, latencies = grade_all(envs, solutions, args.num_envs)
        latencies.sort()
        runs.append((wall, tests, latencies))
        print(f"repeat {repeat}: {len(solutions)} problems in {wall:.2f} s = {len(solutions) / wall:.1f} problems/s, "
              f"{tests / wall:.0f} tests/s ({tests} tests); grading p50 {latencies[len(latencies) // 2] * 1e3:.0f} ms, "
              f"p95 {latencies[int(0.95 * len(latencies))] * 1e3:.0f} ms", flush=True)
    envs.close()
    wall = statistics.median(r[0] for r in runs)
    tests = runs[0][1]
    result = {"num_envs": args.num_envs, "problems": len(solutions), "tests": tests, "grading_wall_s": wall,
              "problems_per_s": len(solutions) / wall, "tests_per_s": tests / wall,
              "grading_p50_ms": statistics.median(r[2][len(r[2]) // 2] for r in runs) * 1e3,
              "grading_p95_ms": statistics.median(r[2][int(0.95 * len(r[2]))] for r in runs) * 1e3,
              "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0]}
    print(f"median: {result['problems_per_s']:.1f} problems/s, {result['tests_per_s']:.0f} tests/s")
    generation_s = tokens_per_s = None
    if args.generate:
        from transformers import AutoTokenizer

        from gym_llm_adapters.models.smollm2 import smollm2_model_dir

        tokenizer = AutoTokenizer.from_pretrained(smollm2_model_dir(dtype="bfloat16"))
        probe = gym.make("LLMCode-v0", mode="tokens", tokenizer=tokenizer, max_seq_len=2048, max_action_tokens=512)
        prompts = []
        for k in range(len(solutions)):
            obs, _ = probe.reset(options={"task_id": k})
            prompts.append(obs["input_ids"][obs["attention_mask"].astype(bool)].tolist())
        probe.close()
        generation_s, tokens = measure_generation(args, prompts)
        tokens_per_s = tokens / generation_s
        print(f"SmolLM2 on vLLM: {len(prompts)} replies x {args.max_tokens} tokens in {generation_s:.1f} s "
              f"= {tokens_per_s:.0f} tokens/s (batch {args.gen_batch})")
    elif args.tokens_per_s:
        tokens_per_s = args.tokens_per_s
        generation_s = len(solutions) * args.max_tokens / tokens_per_s
    if generation_s is not None:
        result.update(generation_s=generation_s, generation_tokens_per_s=tokens_per_s, max_tokens=args.max_tokens,
                      grading_over_generation=wall / generation_s)
        print(f"grading / generation = {wall:.2f} s / {generation_s:.1f} s = {wall / generation_s:.3f}")
    if args.json is not None:
        from _common import bench_record, write_record

        row = {"what": f"`LLMCode-v0` grading: the {len(solutions)} canonical HumanEval solutions through the native "
                       f"vector env, B={args.num_envs} (each program in a sandbox, its tests in another)",
               "ours": f"**{result['problems_per_s']:.0f} problems/s, {result['tests_per_s']:.0f} tests/s**, p50 "
                       f"{result['grading_p50_ms']:.0f} ms per problem"}
        if generation_s is not None:
            how = "SmolLM2-135M on vLLM generating" if args.generate else "at --tokens-per-s, generating"
            row.update(baseline=f"{how} the {len(solutions)} replies, {args.max_tokens} tokens each: "
                                f"{generation_s:.0f} s ({tokens_per_s:.0f} tok/s)",
                       ratio=f"grading / generation **{wall / generation_s:.3f}**")
        write_record(args.json, bench_record("code.py", title="`LLMCode-v0` grading against generation", order=130,
                                             rows=[row], figures=result))


if __name__ == "__main__":
    main()
