"""``gym-llm eval ENV --model M``: roll a model out on an env and summarise how it does.

One episode per task, on the first ``--n`` tasks of the env's source (``--shuffle``: a seeded random
sample), greedy by default. Prints the mean reward, pass rate and tokens/s; writes the episodes to
``--out`` (JSONL or Parquet, token-exact, readable with ``gym_llm_adapters.rollout_io.read_rollouts``), a
summary JSON beside it, and a PNG histogram of the rewards.

``--samples-per-task n`` samples each task n times (sampling needs ``--temperature`` > 0) and reports pass@k for
k <= n with the unbiased estimator of Chen et al. 2021 (:func:`pass_at_k`), per task and averaged over tasks.

    gym-llm eval LLMGSM8K-v0 --model smollm2 --data-files ../shared/data/gsm8k/test.jsonl --n 20
    gym-llm eval LLMCode-v0 --model smollm2 --n 164 --samples-per-task 10 --temperature 0.8
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Iterable, Sequence

from gym_llm_adapters.cli._common import (
    add_env_options,
    add_model_options,
    check_env,
    check_model,
    check_paths,
    dtype_for,
    engine_kind,
    env_kwargs_from,
    fit_seq_len,
    non_negative_float,
    positive_int,
    probability,
    probe_env,
)
from gym_llm_adapters.cli.errors import UsageError

__all__ = ["pass_at_k", "pass_at_k_table", "register", "run"]

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a model on an env (rollouts, summary, reward histogram)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_env_options(parser)
    add_model_options(parser)
    group = parser.add_argument_group("evaluation")
    group.add_argument("--n", type=positive_int, default=64, help="episodes (tasks) to run (default: 64)")
    group.add_argument("--shuffle", action="store_true", help="a seeded random sample of tasks, not the first n")
    group.add_argument("--samples-per-task", type=positive_int, default=1, metavar="N",
                       help="episodes per task (needs --temperature > 0 when > 1); reports pass@k for k <= N with the "
                            "unbiased estimator, per task and overall (default: 1)")
    group.add_argument("--seed", type=int, default=0, help="seeds the task sample and sampling (default: 0)")
    group.add_argument("--temperature", type=non_negative_float, default=0.0, help="0 = greedy (default: 0)")
    group.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling mass (default: 1 = off)")
    group.add_argument("--max-new-tokens", type=positive_int, default=512,
                       help="tokens per assistant turn (default: 512)")
    group.add_argument("--max-seq-len", type=positive_int, default=None,
                       help="longest episode in tokens (default: 4096, or less if the model takes less)")
    group.add_argument("--batch", type=positive_int, default=64, help="episodes generated as one batch (default: 64)")
    group.add_argument("--pass-threshold", type=float, default=1.0,
                       help="an episode passes when its reward is >= this (default: 1.0)")
    group.add_argument("--out", type=Path, default=None, metavar="ROLLOUTS",
                       help="write the episodes here (.jsonl, or a .parquet folder) and a .summary.json beside it; "
                            "an existing file is refused unless --overwrite or --append")
    mode = group.add_mutually_exclusive_group()
    mode.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    mode.add_argument("--append", action="store_true",
                      help="add to an existing --out (group ids continue after the ones already there)")
    group.add_argument("--plot", type=Path, default=None, metavar="PNG",
                       help="the reward histogram (default: beside --out, else ./eval_rewards.png)")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import gym_llm  # noqa: F401

    # every input is checked before a model is loaded or an engine started (or torch imported: a bad --model fails
    # in seconds)
    check_env(args.env, "eval")
    kwargs = env_kwargs_from(args)
    check_paths(kwargs)
    samples = args.samples_per_task
    if samples > 1 and args.temperature == 0:
        raise UsageError(f"--samples-per-task {samples} with --temperature 0: greedy samples of a task are all the "
                         "same; pass --temperature (e.g. 0.8) to sample")
    group_offset = _check_out(args)
    model_dir, tokenizer, longest = check_model(args.model)
    args.max_seq_len = fit_seq_len(args.max_seq_len, longest, default=4096, max_new_tokens=args.max_new_tokens)
    probe_env(args.env, kwargs, mode="tokens", tokenizer=tokenizer, max_seq_len=args.max_seq_len,
              max_action_tokens=args.max_new_tokens)
    from gym_llm_adapters.cli._output import log_to
    from gym_llm_adapters.engines import SamplingConfig
    from gym_llm_adapters.rollout_io import RolloutWriter
    from gym_llm_adapters.training.evaluation import Evaluator
    from gym_llm_adapters.training.metrics import plot_reward_histogram
    from gym_llm_adapters.training.setup import build_engine, resolve_device

    # the dependencies' messages (not with -v): beside --out, else a temporary file
    log_to(None if args.out is None else args.out.with_name(args.out.stem + ".log"), append=args.append,
           command="eval")
    device = resolve_device(args.device)
    kind = engine_kind(args)
    engine = build_engine(kind, model_dir, device=device, dtype=dtype_for(args, device), seed=args.seed,
                          max_model_len=args.max_seq_len, vllm_kwargs=dict(args.vllm_args))
    sampling = SamplingConfig(max_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
    writer = None
    if args.out is not None:
        if args.overwrite:
            _remove(args.out)
        writer = _OffsetWriter(RolloutWriter(args.out), group_offset)
    evaluator = None
    try:
        task_ids = "shuffle" if args.shuffle else "first"
        if samples > 1:  # each of the n tasks, samples times in a row
            task_ids = [task for task in _chosen_tasks(args.env, kwargs, args.n, args.shuffle, args.seed)
                        for _ in range(samples)]
        episodes = args.n * samples
        evaluator = Evaluator(args.env, kwargs, engine, episodes=episodes, sampling=sampling, seed=args.seed,
                              max_seq_len=args.max_seq_len, max_new_tokens=args.max_new_tokens,
                              num_envs=min(args.batch, episodes), task_ids=task_ids, progress=not args.no_progress)
        from tqdm.contrib.logging import logging_redirect_tqdm

        with logging_redirect_tqdm():  # logs print above the progress bar
            trajectories, summary = evaluator.run(pass_threshold=args.pass_threshold, writer=writer)
    finally:
        if evaluator is not None:
            evaluator.close()
        if writer is not None:
            writer.close()
        engine.close()
    print(f"{args.env} with {args.model} ({kind}): {summary}")
    extra: dict = {}
    if samples > 1:
        per_task, overall = pass_at_k_table([(t.task_id, t.reward >= args.pass_threshold) for t in trajectories],
                                            _ks(samples))
        print(f"{len(per_task)} tasks x {samples} samples: " + ", ".join(f"{k} {v:.3f}" for k, v in overall.items()))
        extra = {"samples_per_task": samples, "pass_at_k": overall, "per_task": per_task}
    if args.out is not None:
        summary_path = args.out.with_name(args.out.stem + ".summary.json")
        summary_path.write_text(json.dumps({"env": args.env, "model": args.model, "engine": kind,
                                            "env_kwargs": kwargs, **summary.__dict__, **extra}, indent=1, default=str))
        print(f"episodes: {args.out}  summary: {summary_path}")
    plot = args.plot or (args.out.with_name(args.out.stem + ".rewards.png") if args.out else Path("eval_rewards.png"))
    try:
        plot_reward_histogram([t.reward for t in trajectories], plot,
                              title=f"{args.env}, {args.model}: mean reward {summary.reward_mean:.3f}, "
                                    f"pass rate {summary.pass_rate:.0%}")
        print(f"reward histogram: {plot}")
    except ImportError as e:
        logger.warning("no histogram: %s", e)
    return 0


def _check_out(args: argparse.Namespace) -> int:
    """Refuse an existing ``--out`` unless ``--overwrite`` / ``--append``; with ``--append``, the group id offset that
    keeps this run's groups apart from the ones already in the file."""
    out = args.out
    if out is None:
        if args.overwrite or args.append:
            raise UsageError("--overwrite / --append need --out")
        return 0
    exists = out.exists() and (out.is_file() or any(out.iterdir()))
    if exists and not (args.overwrite or args.append):
        raise UsageError(f"--out {out} already exists; pass --overwrite to replace it, --append to add this run to it, "
                         "or choose another --out")
    if out.exists() and out.is_dir() and out.suffix != ".parquet" and not any(out.glob("part-*.parquet")) \
            and any(out.iterdir()):
        raise UsageError(f"--out {out} is a folder that holds no rollouts; give a .jsonl file or a .parquet folder")
    if args.append and exists:
        from gym_llm_adapters.rollout_io import iter_rollouts

        return 1 + max((int(r.group_id) for r in iter_rollouts(out)), default=-1)
    return 0


def _remove(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    for extra in (path.with_name(path.stem + ".summary.json"), path.with_name(path.stem + ".rewards.png")):
        extra.unlink(missing_ok=True)


class _OffsetWriter:
    """A rollout writer that shifts group ids by ``offset`` first (an appended run's groups stay distinct)."""

    def __init__(self, writer, offset: int):
        self.writer, self.offset = writer, offset

    def write(self, records) -> None:
        if self.offset:
            for record in records:
                record.group_id += self.offset
                for step in getattr(record, "steps", ()):
                    step.group_id += self.offset
        self.writer.write(records)

    def close(self) -> None:
        self.writer.close()


def _chosen_tasks(env_id: str, kwargs: dict, n: int, shuffle: bool, seed: int) -> list[int]:
    """The ``n`` task indices the evaluation runs, as :class:`Evaluator` picks them (the first ones, or a seeded
    permutation), cycling when the source holds fewer."""
    import gymnasium as gym
    import numpy as np

    env = gym.make(env_id, **kwargs)
    try:
        num_tasks = len(env.unwrapped.parts.tasks)
    finally:
        env.close()
    order = np.random.default_rng(seed).permutation(num_tasks) if shuffle else np.arange(num_tasks)
    return [int(order[i % num_tasks]) for i in range(n)]


def _ks(samples: int) -> list[int]:
    """The k reported for ``samples`` samples per task: 1, the usual 2, 5, 10, 20, 50, 100 up to it, and itself."""
    return sorted({1, samples} | {k for k in (2, 5, 10, 20, 50, 100) if k <= samples})


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` passed (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code", eq. 1): ``1 - C(n - c, k) / C(n, k)``, the chance that k samples drawn without
    replacement from the n hold at least one pass. Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` (no huge
    binomials, no cancellation).

    >>> pass_at_k(10, 0, 1), pass_at_k(10, 10, 5), round(pass_at_k(10, 3, 1), 6), pass_at_k(5, 4, 2)
    (0.0, 1.0, 0.3, 1.0)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}.")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def pass_at_k_table(samples: Iterable[tuple[int, bool]], ks: Sequence[int]) -> tuple[list[dict], dict[str, float]]:
    """Per task (``{"task_id", "samples", "passed", "pass@k"...}``, k up to that task's samples) and overall (each
    ``pass@k`` averaged over the tasks with at least k samples) from ``(task_id, passed)`` pairs."""
    counts: dict[int, list[int]] = {}
    for task_id, passed in samples:
        n_c = counts.setdefault(int(task_id), [0, 0])
        n_c[0] += 1
        n_c[1] += bool(passed)
    per_task = [{"task_id": task_id, "samples": n, "passed": c,
                 **{f"pass@{k}": pass_at_k(n, c, k) for k in ks if k <= n}} for task_id, (n, c) in counts.items()]
    overall = {}
    for k in ks:
        values = [row[f"pass@{k}"] for row in per_task if f"pass@{k}" in row]
        if values:
            overall[f"pass@{k}"] = sum(values) / len(values)
    return per_task, overall
