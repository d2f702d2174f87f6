"""Where a training run's metrics also go: ``--report-to tensorboard trackio wandb`` (TRL's ``report_to`` names).

``metrics.jsonl`` is always written; these are extra sinks, each a :data:`~gym_llm_adapters.training.metrics.
MetricsCallback` (``callback(step, metrics)``) with a ``close()``:

* ``tensorboard``: event files in ``OUT/tensorboard`` (the ``plot`` extra; the same as ``--tensorboard``).
* ``trackio``: Hugging Face's local-first tracker (``pip install trackio``): project ``$TRACKIO_PROJECT`` (default
  ``gym-llm``), run named after ``OUT``, the run's settings as its config; stored under ``$TRACKIO_DIR`` (default
  ``~/.cache/huggingface/trackio``), shown by ``trackio show``. A resumed run continues the same trackio run.
* ``wandb``: Weights & Biases (``pip install wandb``): project ``$WANDB_PROJECT`` (default ``gym-llm``), run named after
  ``OUT``, files in ``OUT/wandb``; the run id is kept in ``OUT/wandb_run_id`` so ``--resume`` continues the same W&B
  run. Without network or an API key, set ``WANDB_MODE=offline`` (and ``wandb sync OUT/wandb/offline-run-*`` later).

A missing package is reported before the model loads, with the ``pip install`` that fixes it.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from pathlib import Path
from typing import Any, Mapping

__all__ = ["REPORTERS", "check_reporters", "make_reporters"]

#: name -> (import name, pip install hint)
REPORTERS = {
    "tensorboard": ("tensorboard", "pip install 'gym-llm[plot]'"),
    "trackio": ("trackio", "pip install 'gym-llm[report]' (or pip install trackio)"),
    "wandb": ("wandb", "pip install 'gym-llm[report]' (or pip install wandb)"),
}


def check_reporters(report_to: tuple[str, ...] | list[str]) -> None:
    """Raise ``ValueError`` for an unknown name and ``ImportError`` (saying the fix) for a package not installed."""
    for name in report_to:
        if name not in REPORTERS:
            raise ValueError(f"report_to: unknown {name!r}; expected any of {', '.join(REPORTERS)} (or none).")
        module, hint = REPORTERS[name]
        if importlib.util.find_spec(module) is None:
            raise ImportError(f"report_to={name!r} needs the {module} package, which is not installed: {hint}.")


class _Trackio:
    def __init__(self, out_dir: Path, config: Mapping[str, Any], resume: bool):
        import trackio

        self._trackio = trackio
        self._run = trackio.init(project=os.environ.get("TRACKIO_PROJECT", "gym-llm"), name=out_dir.resolve().name,
                                 config=dict(config), resume="allow" if resume else "never", embed=False,
                                 auto_log_cpu=False, auto_log_gpu=False)

    def __call__(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class _Wandb:
    def __init__(self, out_dir: Path, config: Mapping[str, Any], resume: bool):
        import wandb

        id_file = out_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if resume and id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id + "\n")
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "gym-llm"), name=out_dir.resolve().name,
                               id=run_id, resume="allow", dir=str(out_dir), config=dict(config),
                               settings=wandb.Settings(console="off", x_disable_stats=True))

    def __call__(self, step: int, metrics: Mapping[str, float]) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


def make_reporters(report_to: tuple[str, ...] | list[str], out_dir: str | os.PathLike, config: Mapping[str, Any],
                   *, resume: bool = False) -> list[Any]:
    """The trackio / wandb sinks named in ``report_to`` (TensorBoard is :class:`MetricsLogger`'s own)."""
    check_reporters(report_to)
    out_dir = Path(out_dir)
    kinds = {"trackio": _Trackio, "wandb": _Wandb}
    return [kinds[name](out_dir, config, resume) for name in report_to if name in kinds]
