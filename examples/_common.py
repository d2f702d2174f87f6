"""Shared by the TRL examples: arguments as a dataclass with presets such as ``--tiny``, and the end-of-run report."""

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
