"""``gym-llm view RUN_DIR``: one self-contained HTML report of a training run (see :mod:`gym_llm_adapters.report`)."""

from __future__ import annotations

import argparse

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "view", help="write an HTML report of a run: curves, held-out answers before/after, episodes",
        description="Write one self-contained HTML page (no network needed) about a `gym-llm train --out` folder: "
                    "the curves, the first and last evaluation's held-out answers side by side, and a table of "
                    "training episodes filterable by reward, with each episode's tokens coloured by policy mask.")
    parser.add_argument("run_dir", help="the --out folder of `gym-llm train`")
    parser.add_argument("--out", default=None, help="where to write the page (default RUN_DIR/report.html)")
    parser.add_argument("--max-episodes", type=int, default=2000,
                        help="training episodes in the table, spread evenly over the run (default 2000)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gym_llm_adapters.cli.errors import UsageError
    from gym_llm_adapters.report import write_report

    if args.max_episodes < 0:
        raise UsageError(f"--max-episodes must be >= 0; got {args.max_episodes}.")
    try:
        path = write_report(args.run_dir, args.out, max_episodes=args.max_episodes)
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    print(f"wrote {path} (open it in a browser; it needs no network)")
    return 0
