"""KV-cache block size on vLLM-CPU: the package's 32 tokens (``cpu_paths.CPU_BLOCK_SIZE``) against vLLM's own 128.

One fresh process per (model, block size) — an engine with nothing cached — runs the same ``vllm.LLM.generate``
calls through the package's engine set-up (``training.setup.build_engine``: eager, a 256 MiB KV cache, one thread
per process like the trainer and the suite), each on prompts no earlier call used:

* ``short BxT``: B chat prompts of ~70 tokens (GSM8K's instruction, then a different sum each), T new tokens each
  (``ignore_eos``: every sequence decodes all T);
* ``long 8x64``: 8 prompts of ~500 tokens of words, 64 new tokens each.

Printed: seconds per call for each block size and the ratio (128's time / 32's: above 1 means 32 is faster), for the
tiny test model and SmolLM2-135M (a real shape: 30 layers, hidden 576). ``GYM_LLM_CPU_ISA=avx2`` (with torch's
switches, see ``cpu_paths.torch_env``) measures the AVX2 path.

Run: ``python bench/cpu_block_size.py [--models tiny,smollm2] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALLS = (("short 32x48", "short", 32, 48), ("short 128x24", "short", 128, 24), ("long 8x64", "long", 8, 64))


def _child(model: str, block_size: int, repeats: int) -> dict[str, float]:
    """Runs in its own process: seconds of each call (the best of ``repeats``, fresh prompts every time)."""
    import random
    import time

    from vllm import SamplingParams

    from gym_llm_adapters.models.resolve import resolve_model
    from gym_llm_adapters.training.setup import build_engine

    engine = build_engine("vllm", resolve_model(model), device="cpu", dtype="float32", max_model_len=1024,
                          vllm_kwargs={"block_size": block_size})
    tokenizer = engine.tokenizer
    rng = random.Random(0)
    words = "the a of and to in is was for on with as by at from that this it be are".split()

    def prompt(kind: str) -> str:
        if kind == "long":
            return " ".join(rng.choice(words) for _ in range(500))
        question = (f"Solve the problem step by step. At the end, write the final answer on its own line as "
                    f"'#### <number>'.\n\nWhat is {rng.randint(10, 99)} + {rng.randint(10, 99)}?")
        if tokenizer.chat_template:
            return tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                 add_generation_prompt=True)
        return question

    engine.llm.generate(["warm up"], SamplingParams(max_tokens=4), use_tqdm=False)
    out = {}
    for name, kind, batch, new_tokens in CALLS:
        best = float("inf")
        for _ in range(repeats):
            prompts = [prompt(kind) for _ in range(batch)]
            params = SamplingParams(max_tokens=new_tokens, temperature=1.0, ignore_eos=True)
            start = time.perf_counter()
            engine.llm.generate(prompts, params, use_tqdm=False)
            best = min(best, time.perf_counter() - start)
        out[name] = best
    engine.close()
    return out


def measure(model: str, block_size: int, repeats: int) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "adapters"), os.environ.get("PYTHONPATH", "")])}
    code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import cpu_block_size as b; "
            f"print('RESULT', json.dumps(b._child({model!r}, {block_size}, {repeats})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{model} block_size={block_size} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    parser.add_argument("--repeats", type=int, default=2, help="calls per shape (the best is kept)")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the record here (bench/results/cpu_block_size.json; see "
                             "scripts/render_benchmarks.py)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "adapters"))
    from gym_llm_adapters.engines import cpu_paths

    print(f"CPU: {cpu_paths.cpu_model()}; paths: {cpu_paths.describe()}")
    print(f"{'model':8} {'call':13} {'block 128 (s)':>13} {'block 32 (s)':>12} {'ratio':>6}")
    figures, rows = {}, []
    for model in args.models.split(","):
        default, ours = measure(model, 128, args.repeats), measure(model, cpu_paths.CPU_BLOCK_SIZE, args.repeats)
        for name, *_ in CALLS:
            print(f"{model:8} {name:13} {default[name]:13.2f} {ours[name]:12.2f} {default[name] / ours[name]:5.2f}x")
        figures[model] = {"block_128_s": default, f"block_{cpu_paths.CPU_BLOCK_SIZE}_s": ours}
        rows.append({"what": f"{model}: KV-cache blocks of {cpu_paths.CPU_BLOCK_SIZE} tokens vs vLLM's 128, `generate` "
                             f"on fresh prompts ({' / '.join(name for name, *_ in CALLS)})",
                     "ours": " / ".join(f"{ours[name]:.2f} s" for name, *_ in CALLS),
                     "baseline": "block 128, same run: " + " / ".join(f"{default[name]:.2f} s" for name, *_ in CALLS),
                     "ratio": " / ".join(f"**{default[name] / ours[name]:.2f}x**" for name, *_ in CALLS)})
    if args.json:
        from _common import bench_record, write_record

        write_record(args.json, bench_record("cpu_block_size.py", title="vLLM-CPU KV-cache block size", order=70,
                                             rows=rows, figures=figures))


if __name__ == "__main__":
    main()
