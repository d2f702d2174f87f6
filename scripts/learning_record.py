"""Build the benchmark record of a ``gym-llm train`` run from its folder, for docs/benchmarks.md.

Run: ``python scripts/learning_record.py RUN_DIR --config CONFIG --json bench/results/learning_<name>.json``
(then ``python scripts/render_benchmarks.py``).

Reads RUN_DIR/metrics.jsonl (the held-out evaluations: the first, the last and the best; the GRPO steps' median
time and its phases) and RUN_DIR/train.log (the wall time, from its first to its last timestamp, and the date), and
adds the machine (``lscpu`` via ``cpu_paths.describe()``), the GPU, torch and the checkout's commit. The command is
the config's ``gym-llm train`` line (``--command`` overrides it). The record's schema is in
scripts/render_benchmarks.py; its ``source`` is ``run``: every figure comes from the run's own files.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TIMESTAMP = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),\d+ ")
PHASES = ("rollout", "reference", "policy", "optimizer", "sync")


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"{path} not found: RUN_DIR must be a `gym-llm train --out` folder")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wall_time(run_dir: Path) -> tuple[float | None, str | None]:
    """Seconds from RUN_DIR/train.log's first timestamp (the engine's start; train.log is the run's log of its
    dependencies' messages) to metrics.jsonl's last write (the final evaluation), and that first timestamp."""
    log = run_dir / "train.log"
    if not log.is_file():
        return None, None
    stamps = [m.group(1) for line in log.read_text(errors="replace").splitlines() if (m := TIMESTAMP.match(line))]
    if not stamps:
        return None, None
    start = datetime.datetime.strptime(stamps[0], "%Y-%m-%d %H:%M:%S")
    end = datetime.datetime.fromtimestamp((run_dir / "metrics.jsonl").stat().st_mtime)
    return max(0.0, (end - start).total_seconds()), stamps[0]


def interval(pass_rate: float, n: float) -> float:
    """Half-width of the 95% normal interval of a pass rate from n episodes, in points."""
    return 100 * 1.96 * math.sqrt(pass_rate * (1 - pass_rate) / n) if n else math.nan


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {round(seconds % 60)} s" if seconds >= 60 else f"{seconds:.0f} s"


def config_command(config: Path) -> str:
    """The config's own ``gym-llm train`` line (its header comment), else ``gym-llm train grpo --config CONFIG``."""
    for line in config.read_text().splitlines():
        text = line.lstrip("# ").strip()
        if text.startswith("gym-llm train"):
            return text
    return f"gym-llm train grpo --config {config}"


def machine() -> tuple[str, str, str]:
    """``(cpu, gpu, torch)`` of this machine (the run's, when the record is built where it ran)."""
    sys.path.insert(0, str(ROOT / "adapters"))
    import torch

    from gym_llm_adapters.engines import cpu_paths

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return cpu_paths.describe(), gpu, torch.__version__


def commit() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "?"

    return git("rev-parse", "--short", "HEAD") + ("+uncommitted" if git("status", "--porcelain") else "")


def eval_rows(metrics: list[dict[str, Any]], headline: bool) -> list[dict[str, Any]]:
    evals = [row for row in metrics if "eval/pass_rate" in row]
    if not evals:
        raise SystemExit("metrics.jsonl has no evaluation (eval/pass_rate): was the run stopped before its first?")
    first, last = evals[0], evals[-1]
    best = max(evals, key=lambda row: row["eval/pass_rate"])

    def rate(row: dict[str, Any]) -> str:
        p, n = row["eval/pass_rate"], row.get("eval/episodes", 0)
        return f"{100 * p:.1f}% ± {interval(p, n):.1f} (step {row['step']}, n = {n:.0f})"

    start, end = 100 * first["eval/pass_rate"], 100 * last["eval/pass_rate"]
    on_the_way = ", ".join(f"{100 * row['eval/pass_rate']:.1f}" for row in evals[1:-1])
    row = {"what": "held-out pass rate (greedy; ± the 95% interval)", "ours": f"**{rate(last)}** at the end",
           "baseline": rate(first), "ratio": f"{start:.1f}% → {end:.1f}%",
           "other": (f"on the way: {on_the_way}%; " if on_the_way else "") + f"best {rate(best)}; mean reward "
                    f"{first['eval/reward_mean']:.3f} → {last['eval/reward_mean']:.3f}"}
    if headline:
        row.update(headline=True, headline_ratio=f"held-out pass rate {start:.1f}% → **{end:.1f}%** "
                                                 f"(n = {last['eval/episodes']:.0f})")
    return [row]


def step_row(metrics: list[dict[str, Any]]) -> dict[str, Any] | None:
    steps = [row for row in metrics if "train/step_s" in row]
    if not steps:
        return None

    def median(key: str) -> float:
        values = [row[key] for row in steps if key in row]
        return statistics.median(values) if values else math.nan

    phases = ", ".join(f"{phase} {median(f'time/{phase}_s'):.2f} s" for phase in PHASES
                       if any(f"time/{phase}_s" in row for row in steps))
    return {"what": f"a training step (median of {len(steps)})", "ours": f"{median('train/step_s'):.2f} s",
            "other": phases}


def build_record(run_dir: Path, config: Path, *, title: str | None = None, command: str | None = None,
                 order: int = 100, headline: bool = False) -> dict[str, Any]:
    """The record of the run in ``run_dir`` (trained with ``config``), in scripts/render_benchmarks.py's schema."""
    metrics = read_metrics(run_dir)
    wall_s, started = wall_time(run_dir)
    cpu, gpu, torch_version = machine()
    rows = eval_rows(metrics, headline)
    if (step := step_row(metrics)) is not None:
        rows.append(step)
    if wall_s is not None:
        rows.append({"what": "wall time (from the engine's start, in train.log, to the final evaluation; the "
                             "evaluations included, the imports not)",
                     "ours": minutes(wall_s)})
    date = started or datetime.datetime.fromtimestamp((run_dir / "metrics.jsonl").stat().st_mtime).isoformat(
        timespec="seconds")
    if headline:
        rows[0]["headline_what"] = title or f"`{config.name}`"
    return {"schema": 1, "kind": "learning", "order": order, "title": title or f"`{config.name}`",
            "command": command or config_command(config), "machine": cpu, "gpu": gpu, "torch": torch_version,
            "commit": commit(), "date": date, "source": "run", "rows": rows,
            "columns": [["what", "what"], ["ours", "result"], ["baseline", "at the first evaluation"],
                        ["ratio", "first → last"], ["other", "notes"]],
            "figures": {"evals": [row for row in metrics if "eval/pass_rate" in row], "wall_s": wall_s,
                        "run_dir": str(run_dir), "config": str(config)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a `gym-llm train --out` folder")
    parser.add_argument("--config", type=Path, required=True, help="the TOML config the run was trained with")
    parser.add_argument("--json", type=Path, required=True, help="the record to write (bench/results/learning_*.json)")
    parser.add_argument("--title", default=None, help="the heading (default: the config's file name)")
    parser.add_argument("--command", default=None, help="what was run (default: the config's `gym-llm train` line)")
    parser.add_argument("--order", type=int, default=100, help="place among the learning runs")
    parser.add_argument("--headline", action="store_true", help="put the final evaluation in the README's table")
    args = parser.parse_args(argv)
    record = build_record(args.run_dir, args.config, title=args.title, command=args.command, order=args.order,
                          headline=args.headline)
    # bench/_common.py loaded by its path under its own name: a module called _common (examples/ has one too) may
    # already be imported in this process
    import importlib.util

    spec = importlib.util.spec_from_file_location("gym_llm_bench_common", ROOT / "bench" / "_common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    common.write_record(args.json, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
