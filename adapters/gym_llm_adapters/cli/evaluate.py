"""``gym-llm eval ENV --model M``: roll a model out on an env and summarise how it does.

One episode per task, on the first ``--n`` tasks of the env's source (``--shuffle``: a seeded random
sample), greedy by default. Prints the mean reward, pass rate and tokens/s; writes the episodes to
``--out`` (JSONL or Parquet, token-exact, readable with ``gym_llm_adapters.rollout_io.read_rollouts``), a
summary JSON beside it, and a PNG histogram of the rewards.

    gym-llm eval LLMGSM8K-v0 --model smollm2 --data-files ../shared/data/gsm8k/test.jsonl --n 20
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from gym_llm_adapters.cli._common import add_env_options, add_model_options, dtype_for, engine_kind, env_kwargs_from

__all__ = ["register", "run"]

logger = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a model on an env (rollouts, summary, reward histogram)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_env_options(parser)
    add_model_options(parser)
    group = parser.add_argument_group("evaluation")
    group.add_argument("--n", type=int, default=64, help="episodes (tasks) to run (default: 64)")
    group.add_argument("--shuffle", action="store_true", help="a seeded random sample of tasks, not the first n")
    group.add_argument("--seed", type=int, default=0, help="seeds the task sample and sampling (default: 0)")
    group.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: 0)")
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--max-new-tokens", type=int, default=512, help="tokens per assistant turn (default: 512)")
    group.add_argument("--max-seq-len", type=int, default=4096, help="longest episode in tokens (default: 4096)")
    group.add_argument("--batch", type=int, default=64, help="episodes generated as one batch (default: 64)")
    group.add_argument("--pass-threshold", type=float, default=1.0,
                       help="an episode passes when its reward is >= this (default: 1.0)")
    group.add_argument("--out", type=Path, default=None, metavar="ROLLOUTS",
                       help="write the episodes here (.jsonl, or a .parquet folder) and a .summary.json beside it")
    group.add_argument("--plot", type=Path, default=None, metavar="PNG",
                       help="the reward histogram (default: beside --out, else ./eval_rewards.png)")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import gym_llm  # noqa: F401
    from gym_llm_adapters.engines import SamplingConfig
    from gym_llm_adapters.models.resolve import resolve_model
    from gym_llm_adapters.rollout_io import RolloutWriter
    from gym_llm_adapters.training.evaluation import Evaluator
    from gym_llm_adapters.training.metrics import plot_reward_histogram
    from gym_llm_adapters.training.setup import build_engine, resolve_device

    if args.n < 1:
        raise SystemExit(f"--n must be >= 1, got {args.n}")
    device = resolve_device(args.device)
    model_dir = resolve_model(args.model)
    kind = engine_kind(args)
    engine = build_engine(kind, model_dir, device=device, dtype=dtype_for(args, device), seed=args.seed,
                          max_model_len=args.max_seq_len, vllm_kwargs=dict(args.vllm_args))
    sampling = SamplingConfig(max_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p)
    writer = RolloutWriter(args.out) if args.out is not None else None
    evaluator = None
    try:
        kwargs = env_kwargs_from(args)
        evaluator = Evaluator(args.env, kwargs, engine, episodes=args.n, sampling=sampling, seed=args.seed,
                              max_seq_len=args.max_seq_len, max_new_tokens=args.max_new_tokens,
                              num_envs=min(args.batch, args.n), task_ids="shuffle" if args.shuffle else "first",
                              progress=not args.no_progress)
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
    if args.out is not None:
        summary_path = args.out.with_name(args.out.stem + ".summary.json")
        summary_path.write_text(json.dumps({"env": args.env, "model": args.model, "engine": kind,
                                            "env_kwargs": kwargs, **summary.__dict__}, indent=1, default=str))
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
