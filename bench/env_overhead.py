"""Per-sample env overhead: gym-llm's native vector envs vs TorchRL's ChatEnv, same work, same run.

The work per sample is one env step in text mode with a precomputed assistant response and no model:
append the reply to the conversation, (GSM8K) extract and check the answer, end the episode, and start
the next one (render the next prompt). Both sides are measured in this process, interleaved, as CPU
time per sample (``time.process_time``: robust to other load on the machine) and wall time.

    python bench/env_overhead.py                 # B = 8 and 64, both envs, TorchRL if installed
    python bench/env_overhead.py --steps 200 --batch-sizes 64

Needs the ``bench`` extra for the TorchRL baseline (``torchrl==0.14.1``, ``tensordict==0.14.3``) and
GSM8K's test split (``--data-files``, default ``$GYM_LLM_DATA/gsm8k/test.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Callable

import gymnasium as gym

import gym_llm  # noqa: F401
from gym_llm_adapters.engines import cpu_paths  # noqa: E402

RESPONSE = "Let me think step by step. 3 + 4 = 7, and 7 * 2 = 14.\nSo the answer is 14.\n#### {answer}"


def _default_data() -> str:
    for root in (os.environ.get("GYM_LLM_DATA"), Path(__file__).resolve().parents[1].parent / "shared" / "data",
                 "/work/shared/data"):
        if root and (Path(root) / "gsm8k" / "test.jsonl").is_file():
            return str(Path(root) / "gsm8k" / "test.jsonl")
    raise SystemExit("GSM8K test.jsonl not found: pass --data-files or set GYM_LLM_DATA.")


def measure(step: Callable[[], None], batch_size: int, steps: int, warmup: int = 10) -> tuple[float, float]:
    """(CPU µs/sample, wall µs/sample) of ``steps`` calls of ``step``."""
    for _ in range(warmup):
        step()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(steps):
        step()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / (steps * batch_size) * 1e6, wall / (steps * batch_size) * 1e6


def ours(env_id: str, batch_size: int, data_files: str) -> Callable[[], None]:
    if env_id == "LLMGSM8K-v0":
        kwargs = {"data_files": data_files}
    else:  # single-turn chat on the GSM8K questions, as in the TorchRL baseline
        kwargs = {"prompts": [json.loads(line)["question"] for line in Path(data_files).read_text().splitlines()]}
    envs = gym.make_vec(env_id, num_envs=batch_size, **kwargs)
    envs.reset(seed=0)
    actions = tuple(RESPONSE.format(answer=i) for i in range(batch_size))
    return lambda: envs.step(actions)


def torchrl_baseline(env_id: str, batch_size: int, data_files: str, mode: str) -> Callable[[], None] | None:
    """TorchRL doing the same work (see ``bench/torchrl_chat.py``); ``None`` if TorchRL is not installed."""
    try:
        from torchrl_chat import make_torchrl_step  # bench/ is on sys.path when run as a script
    except ImportError as e:
        print(f"TorchRL baseline unavailable ({e}); pip install 'gym-llm[bench]'")
        return None
    return make_torchrl_step(env_id, batch_size, data_files, RESPONSE, input_mode=mode)


# (gym-llm env, TorchRL env, TorchRL input mode): GSM8KEnv only grades correctly in history mode.
PAIRS = (("LLMGSM8K-v0", "GSM8KEnv", "history"), ("LLMChat-v0", "ChatEnv", "text"), ("LLMChat-v0", "ChatEnv", "history"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--steps", type=int, default=100, help="timed vector steps per measurement")
    parser.add_argument("--data-files", default=None)
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the record here (bench/results/env_overhead.json; see "
                             "scripts/render_benchmarks.py)")
    args = parser.parse_args()
    print(f"machine: {cpu_paths.describe()}")  # every number below is this machine's
    data_files = args.data_files or _default_data()
    rows = []
    print(f"{'gym-llm env':<13}{'TorchRL env (mode)':<22}{'B':>4}{'gym-llm µs':>12}{'TorchRL µs':>12}{'ratio':>8}")
    for env_id, baseline_name, mode in PAIRS:
        for batch_size in args.batch_sizes:
            steps = max(args.steps, 1600 // batch_size)
            cpu_ours, wall_ours = measure(ours(env_id, batch_size, data_files), batch_size, steps)
            baseline = torchrl_baseline(env_id, batch_size, data_files, mode)
            cpu_theirs = wall_theirs = float("nan")
            if baseline is not None:
                cpu_theirs, wall_theirs = measure(baseline, batch_size, max(5, steps // 10), warmup=3)
            ratio = cpu_theirs / cpu_ours
            rows.append({"env": env_id, "baseline": f"{baseline_name} ({mode})", "batch_size": batch_size,
                         "ours_cpu_us": cpu_ours, "ours_wall_us": wall_ours, "torchrl_cpu_us": cpu_theirs,
                         "torchrl_wall_us": wall_theirs, "ratio": ratio})
            print(f"{env_id:<13}{baseline_name + ' (' + mode + ')':<22}{batch_size:>4}{cpu_ours:>12.1f}"
                  f"{cpu_theirs:>12.1f}{ratio:>7.1f}x")
    if args.json:
        from _common import bench_record, write_record

        write_record(args.json, bench_record("env_overhead.py", title="Env overhead per sample", order=10,
                                             rows=[table_row(row) for row in rows], figures=rows))


def table_row(row: dict) -> dict:
    """One measurement as a row of the benchmark document; B=64's GSM8K and Chat (text) rows are headlines."""
    headline = row["batch_size"] == 64 and row["baseline"] != "ChatEnv (history)"
    name, mode = row["baseline"].rstrip(")").split(" (")
    return {"what": f"env overhead per sample, `{row['env']}`, B={row['batch_size']}",
            "ours": f"{row['ours_cpu_us']:.1f} µs CPU",
            "baseline": f"TorchRL `{name}` ({mode}) {row['torchrl_cpu_us']:.0f} µs",
            "ratio": f"**{row['ratio']:.0f}x**", "target": "≥ 50x" if row["batch_size"] == 64 else "",
            **({"headline": True, "headline_ratio": f"**{row['ratio']:.0f}x** faster than TorchRL's `{name}` ({mode})"}
               if headline else {})}


if __name__ == "__main__":
    main()
