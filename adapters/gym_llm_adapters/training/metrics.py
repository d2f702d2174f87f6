"""Metrics of a training run: a durable ``metrics.jsonl``, optional TensorBoard, user loggers, and plots.

Every row is ``{"step": int, "<namespace>/<name>": float, ...}`` — namespaces ``train/``, ``sft/``,
``eval/``, ``collector/``. ``metrics.jsonl`` is appended and flushed per row; on resume the rows after the
checkpoint's step are dropped, so the file always matches the checkpoint it continues from.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = ["MetricsLogger", "plot_training_curves", "plot_reward_histogram", "MetricsCallback"]

logger = logging.getLogger(__name__)

MetricsCallback = Callable[[int, Mapping[str, float]], None]
"""A user logger: called with ``(step, metrics)`` for every logged row (e.g. a wandb ``log`` wrapper)."""


class MetricsLogger:
    """Appends metric rows to ``out_dir/metrics.jsonl`` and forwards them to TensorBoard and callbacks.

    Args:
        out_dir: the run folder.
        tensorboard: write TensorBoard event files to ``out_dir/tensorboard`` (needs the ``plot`` extra).
        callbacks: more loggers, each ``callback(step, metrics)``.
        resume_step: continuing a run: keep only the existing rows with ``step <= resume_step``; None
            starts a fresh file.
    """

    def __init__(self, out_dir: str | os.PathLike, *, tensorboard: bool = False,
                 callbacks: Iterable[MetricsCallback] = (), resume_step: int | None = None):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        if resume_step is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a crash
                    continue
                if row.get("step", math.inf) <= resume_step:
                    self.rows.append(row)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.rows), encoding="utf-8")
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        self.callbacks = list(callbacks)
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:  # tensorboard is not installed
                raise ImportError("tensorboard=True needs the tensorboard package: pip install 'gym-llm[plot]'.") from e
            self._tb = SummaryWriter(str(Path(out_dir) / "tensorboard"), purge_step=resume_step)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at ``step`` (values are cast to float; non-finite values are kept as null)."""
        row: dict[str, Any] = {"step": int(step)}
        for key, value in metrics.items():
            value = float(value)
            row[key] = value if math.isfinite(value) else None
        self.rows.append(row)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in row.items():
                if key != "step" and value is not None:
                    self._tb.add_scalar(key, value, int(step))
        for callback in self.callbacks:
            callback(int(step), dict(metrics))

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one metric over the rows that have it."""
        points = [(r["step"], r[key]) for r in self.rows if r.get(key) is not None]
        return [p[0] for p in points], [p[1] for p in points]

    def close(self) -> None:
        if not self._file.closed:
            os.fsync(self._file.fileno())
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("plots need matplotlib: pip install 'gym-llm[plot]'.") from e
    matplotlib.use("Agg")  # files only; never opens a window
    import matplotlib.pyplot as plt

    return plt


def plot_training_curves(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike, *, title: str = "",
                         phase_boundary: int | None = None) -> Path:
    """Reward (train and eval), KL, loss and rollout throughput curves of a run as one PNG with four panels.

    Args:
        rows: metric rows (``MetricsLogger.rows``).
        path: the PNG to write (its folder must exist).
        title: the figure title.
        phase_boundary: the step where SFT warm-up ended and RL began (drawn as a dashed line).
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(19, 4.2))

    def draw(ax, key: str, label: str, **style: Any) -> None:
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label, **style)

    draw(axes[0], "train/reward_mean", "train reward (sampled)", alpha=0.6)
    draw(axes[0], "eval/reward_mean", "eval reward", marker="o", linewidth=2)
    draw(axes[0], "eval/pass_rate", "eval pass rate", marker="s", linestyle="--")
    axes[0].set_title("reward")
    draw(axes[1], "train/kl", "KL(policy || reference), per token")
    axes[1].set_title("KL to the reference")
    draw(axes[2], "sft/loss", "SFT loss (NLL per token)")
    draw(axes[2], "train/loss", "GRPO loss")
    axes[2].set_title("loss")
    draw(axes[3], "collector/tokens_per_s", "rollout tokens/s (generated, over the run so far)")
    axes[3].set_title("throughput")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if phase_boundary:
            ax.axvline(phase_boundary, color="gray", linestyle=":", linewidth=1)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if phase_boundary:
        axes[0].text(phase_boundary, axes[0].get_ylim()[1], " RL starts", va="top", fontsize=8, color="gray")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_reward_histogram(rewards: Sequence[float], path: str | os.PathLike, *, title: str = "") -> Path:
    """A histogram of episode rewards as a PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    values = [float(r) for r in rewards]
    distinct = sorted(set(values))
    bins: Any = [v - 0.5 for v in range(int(min(values)), int(max(values)) + 2)] if distinct and all(
        float(v).is_integer() for v in distinct) and len(distinct) <= 20 else 20
    ax.hist(values, bins=bins, edgecolor="black")
    ax.set_xlabel("episode reward")
    ax.set_ylabel("episodes")
    ax.set_title(title or f"{len(values)} episodes, mean {sum(values) / max(len(values), 1):.3f}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
