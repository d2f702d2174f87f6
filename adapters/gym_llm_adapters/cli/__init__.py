"""The ``gym-llm`` command: ``list``, ``play``, ``eval``, ``train``, ``export``, ``view``, ``replay`` and ``serve``
(see ``gym-llm --help``).

Each subcommand lives in its own module with ``register(subparsers)``, which adds its parser and sets
``func`` (called with the parsed namespace; returns the exit status).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

__all__ = ["main", "build_parser", "parse_args"]

_SUBCOMMANDS = ("list_envs", "play", "evaluate", "train", "export", "view", "replay", "serve")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gym-llm",
        description="Gymnasium environments for LLM post-training: list, play, evaluate and train.",
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, and the dependencies' messages (vLLM, torch, transformers warnings) on "
                             "the terminal too; without it they go to the run's log file")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a user error too")
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(f"gym_llm_adapters.cli.{name}")
        except ModuleNotFoundError as exc:  # a subcommand not written yet, or an extra not installed
            if exc.name and exc.name.startswith("gym_llm_adapters.cli"):
                continue
            raise
        module.register(sub)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line; a ``--config`` file's values become defaults that the command line overrides."""
    parser = build_parser()
    args = parser.parse_args(argv)
    typed, from_config = args, {}
    if getattr(args, "config", None):
        from gym_llm_adapters.cli._common import load_config_defaults

        sub = parser._subparsers._group_actions[0].choices[args.command]
        from_config = load_config_defaults(sub, args.config)
        sub.set_defaults(**from_config)
        args = parser.parse_args(argv)
    args.typed, args.from_config = typed, from_config  # what came from where: a config is checked (cli/train.py)
    args.print_help = parser.print_help
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the command: 0 on success, 2 for a user error (one or two lines on stderr saying the fix; ``--debug``
    adds the traceback), 1 for an internal error (its traceback and where to report it), 130 on Ctrl-C."""
    from gym_llm_adapters.cli.errors import REPORT_URL, UsageError

    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    command = next((a for a in argv if not a.startswith("-")), "")
    try:
        return _main(argv)
    except UsageError as e:
        if debug:
            import traceback

            traceback.print_exc()
        print(f"gym-llm {command}: error: {e}".replace("gym-llm : ", "gym-llm: "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gym-llm {command}: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception:
        import traceback

        traceback.print_exc()
        print(f"gym-llm {command}: internal error (a bug, not your input). Please report it at {REPORT_URL} "
              "with the command line and the traceback above.", file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    from gym_llm_adapters.cli._output import quiet_dependencies

    args = parse_args(argv)  # (imports no dependency)
    # train and eval send the dependencies' noise to their log file (see _output.py); set before any dependency is
    # imported, as some of its switches are read then
    with quiet_dependencies(args.verbose or args.command not in ("train", "eval")):
        level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # vLLM logs every request batch and weight reload at INFO; keep its warnings unless -v (set before vLLM loads,
        # and put back afterwards: main may run inside a test's process, whose later subprocesses inherit it)
        saved_level = os.environ.get("VLLM_LOGGING_LEVEL")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if args.verbose else "WARNING")
        try:
            for noisy in ("httpx", "transformers"):
                logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
            if getattr(args, "func", None) is None:
                args.print_help()
                return 2
            return int(args.func(args) or 0)
        finally:
            if saved_level is None:
                os.environ.pop("VLLM_LOGGING_LEVEL", None)
            else:
                os.environ["VLLM_LOGGING_LEVEL"] = saved_level


if __name__ == "__main__":
    sys.exit(main())
