"""``gym-llm replay FILE``: replay a rollout file through fresh envs and check that it reproduces exactly.

Every episode runs again in a fresh env made from the env spec the file recorded (env id, constructor arguments,
versions), on the recorded task, fed the recorded completions; every observation, policy mask, reward and episode end
must be the same, bit for bit. An episode that differs stops at its first differing step, and the report says what
differs there and why it likely does (a changed scorer, changed data, a changed tokenizer, another package version).
Exit status: 0 when every episode reproduced exactly, 1 when some differ or could not be replayed, 2 for a user
error (no such file, no env spec in it, a file that sets what a file may not set on its own).

A file is not trusted by default: recorded arguments that name code to import (a reward function), switch a sandbox
off or loosen it, or widen what an env reaches (network, host folders) are refused, naming each one; --trust-file
replays such a file as it is (only a file you trust as you would its author's code), and --env-arg gives your own
value instead (docs/replay.md, "Files from elsewhere").

    gym-llm replay runs/eval/smollm2.jsonl
    gym-llm replay runs/arithmetic/rollouts.jsonl --limit 1000 --json > replay.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gym_llm_adapters.cli._common import _env_arg, positive_int
from gym_llm_adapters.cli.errors import UsageError

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("replay", help="replay a rollout file through fresh envs; check it reproduces "
                                                  "exactly", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", metavar="FILE", help="a rollout file written by the collector (.jsonl, or a .parquet "
                                                     "folder): `gym-llm eval --out`, `gym-llm train`'s rollouts.jsonl")
    parser.add_argument("--limit", type=positive_int, default=None, help="replay only the first N episodes")
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON (every episode)")
    parser.add_argument("--env-arg", dest="env_args", action="append", type=_env_arg, default=[], metavar="KEY=VALUE",
                        help="replace a recorded env argument, for every env in the file (repeatable), e.g. "
                             "--env-arg data_files=elsewhere/test.jsonl; VALUE is JSON when it parses, else a string")
    parser.add_argument("--tokenizer", metavar="M", default=None,
                        help="a folder with tokenizer files, or an embedded model name (tiny, tiny-qwen2, smollm2), "
                             "whose tokenizer replaces the recorded one (default: loaded from the recorded folder)")
    parser.add_argument("--trust-file", action="store_true",
                        help="make the envs from every recorded argument as it is: import the functions the file "
                             "names, take its sandbox, network and path settings. Only for a file you trust as you "
                             "would its author's code (default: such arguments are refused, each named)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gym_llm_adapters.replay import ReplayError, UntrustedFileError, count_episodes, replay

    path = Path(args.file)
    if not path.exists():
        raise UsageError(f"{path}: no such rollout file; give a .jsonl file or a .parquet folder written by the "
                         "collector (e.g. `gym-llm eval ... --out rollouts.jsonl`)")
    if path.is_dir() and not any(path.glob("part-*.parquet")):
        raise UsageError(f"{path} is a folder without Parquet parts (part-*.parquet); give a rollout file")
    tokenizer = _tokenizer(args.tokenizer) if args.tokenizer else None
    bar = None
    if not args.no_progress:
        from tqdm.auto import tqdm

        total = count_episodes(path)
        bar = tqdm(total=min(total, args.limit) if total and args.limit else total or args.limit, desc="replay",
                   unit="ep", dynamic_ncols=True)
    try:
        report = replay(path, limit=args.limit, env_kwargs=dict(args.env_args), tokenizer=tokenizer,
                        on_episode=(lambda result: bar.update(1)) if bar is not None else None,
                        trust_file=args.trust_file)
    except (ReplayError, UntrustedFileError) as e:
        raise UsageError(str(e)) from e
    finally:
        if bar is not None:
            bar.close()
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.summary())
    return 0 if report.exact else 1


def _tokenizer(spec: str):
    """The tokenizer of ``--tokenizer``: an embedded model's, or a folder's."""
    from gym_llm_adapters.models.resolve import EMBEDDED_MODELS, resolve_model

    folder = Path(resolve_model(spec)) if spec in EMBEDDED_MODELS else Path(spec).expanduser()
    if not folder.is_dir():
        raise UsageError(f"--tokenizer {spec}: not a folder, nor an embedded model ({', '.join(EMBEDDED_MODELS)})")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    except Exception as e:
        raise UsageError(f"--tokenizer {spec}: cannot read a tokenizer from {folder} ({type(e).__name__}: {e})") from e
