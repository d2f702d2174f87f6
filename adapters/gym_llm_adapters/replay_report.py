"""What a replay found (:func:`gym_llm_adapters.replay.replay`): per episode, exact or the first step that differs.

A :class:`Mismatch` is the first step of an episode where anything differs, with every field that differs at that step
(:class:`Difference`: the recorded and the replayed value around the first differing position) and a hint at the
likely cause. A :class:`ReplayReport` holds one :class:`EpisodeReplay` per episode and prints as a summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Difference", "EpisodeReplay", "Mismatch", "ReplayReport", "array_difference", "scalar_difference",
           "text_difference"]


@dataclass(frozen=True, slots=True)
class Difference:
    """One field that differs.

    Attributes:
        field: ``"observation"`` (the prompt ids, or the prompt text in text mode), ``"prompt_ids"`` (text mode: the
            same text encodes differently), ``"reward"``, ``"terminated"``, ``"truncated"``, ``"task"`` (the task id
            is not in the env's source), ``"reset"`` (the env raised starting the task), ``"action"`` (the env
            refused the recorded action), ``"step"`` (the env raised), ``"token_ids"`` / ``"policy_mask"`` /
            ``"logprobs"`` / ``"prompt_length"`` / ``"token_exact"`` / ``"turn_tokens"`` (the episode's sequence,
            rebuilt from the replayed observations), or ``"info.KEY"`` (a step info value, listed beside another
            difference at the same step).
        recorded / replayed: the values (JSON-able; for sequences, a window around the first differing position).
        where: for sequences, the first differing position and both lengths; else ``""``.
    """

    field: str
    recorded: Any
    replayed: Any
    where: str = ""

    def __str__(self) -> str:
        at = f" at {self.where}" if self.where else ""
        return f"{self.field} differs{at}: recorded {self.recorded!r}, replayed {self.replayed!r}"

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "recorded": self.recorded, "replayed": self.replayed, "where": self.where}


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The first step of an episode where the replay differs from the record.

    Attributes:
        step: 0-based index of the step (its ``turn`` is ``step + 1``); observation differences belong to the step that
            conditioned on that observation, the episode's final sequence to its last step.
        differences: every field that differs at that step, the one that decides the hint first.
        hint: the likely cause (changed scorer, changed data, changed tokenizer, ...) and notes on the versions.
    """

    step: int
    differences: tuple[Difference, ...]
    hint: str

    @property
    def field(self) -> str:
        """The first differing field."""
        return self.differences[0].field

    def __str__(self) -> str:
        return f"step {self.step}: " + "; ".join(map(str, self.differences)) + f" — {self.hint}"

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "field": self.field, "differences": [d.to_dict() for d in self.differences],
                "hint": self.hint}


@dataclass(frozen=True, slots=True)
class EpisodeReplay:
    """One episode's replay.

    Attributes:
        index: the episode's number in the file (0-based, in the order episodes end there).
        env_id / spec_id / task_id / group_id / round / env_index: from the record.
        steps: recorded steps; ``replayed_steps``: steps fed to the env before the replay stopped.
        complete: False for a steps-mode episode whose last steps are not in the file (its recorded steps are replayed).
        mismatch: the first differing step, or None.
        skipped: why the episode could not be replayed at all ("" when it was).
    """

    index: int
    env_id: str
    spec_id: str
    task_id: int
    group_id: int
    round: int
    env_index: int
    steps: int
    replayed_steps: int = 0
    complete: bool = True
    mismatch: Mismatch | None = None
    skipped: str = ""

    @property
    def status(self) -> str:
        """``"exact"``, ``"differs"`` or ``"skipped"``."""
        return "skipped" if self.skipped else "differs" if self.mismatch is not None else "exact"

    def __str__(self) -> str:
        name = (f"episode {self.index} ({self.env_id or '?'}, task {self.task_id}, group {self.group_id}, "
                f"round {self.round})")
        if self.skipped:
            return f"{name}: not replayed: {self.skipped}"
        if self.mismatch is not None:
            return f"{name}: {self.mismatch}"
        return f"{name}: exact ({self.steps} steps{'' if self.complete else ', the rest not in the file'})"

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "env_id": self.env_id, "spec_id": self.spec_id, "task_id": self.task_id,
                "group_id": self.group_id, "round": self.round, "env_index": self.env_index, "steps": self.steps,
                "replayed_steps": self.replayed_steps, "complete": self.complete, "status": self.status,
                "mismatch": None if self.mismatch is None else self.mismatch.to_dict(), "skipped": self.skipped}


@dataclass(frozen=True)
class ReplayReport:
    """Every episode's replay, and the versions involved.

    Attributes:
        path: the rollout file.
        episodes: one :class:`EpisodeReplay` per episode, in file order.
        installed: the ``gym_llm`` and ``gymnasium`` versions that replayed.
        specs: spec id -> its env id and the versions that recorded it.
        unchecked_scores: reward-stage source -> how many recorded scores it gave (``Trajectory.scores``: an LLM judge,
            a group judge, a reward model). Not re-checked: a model's judgement is not bit-reproducible and re-running
            it needs its endpoint or weights; the env's own rewards are re-checked as always.
    """

    path: str
    episodes: tuple[EpisodeReplay, ...]
    installed: dict[str, str] = field(default_factory=dict)
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    unchecked_scores: dict[str, int] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(e.status == status for e in self.episodes)

    @property
    def exact(self) -> bool:
        """True when every episode was replayed and reproduced exactly."""
        return bool(self.episodes) and all(e.status == "exact" for e in self.episodes)

    @property
    def mismatches(self) -> list[EpisodeReplay]:
        return [e for e in self.episodes if e.status != "exact"]

    def summary(self, max_listed: int = 20) -> str:
        """Counts, then the first ``max_listed`` episodes that differ or were skipped, one line each."""
        steps = sum(e.replayed_steps for e in self.episodes)
        lines = [f"{self.path}: replayed {len(self.episodes)} episodes ({steps} steps): {self.count('exact')} exact, "
                 f"{self.count('differs')} differ, {self.count('skipped')} not replayed"]
        if self.unchecked_scores:
            listed = ", ".join(f"{n} from {source}" for source, n in sorted(self.unchecked_scores.items()))
            lines.append(f"  reward-stage scores not re-checked ({listed}): a judge's or reward model's score is a "
                         "model's output, not bit-reproducible, and re-running it needs its endpoint or weights; the "
                         "env's own rewards were re-checked")
        bad = self.mismatches
        lines += [f"  {e}" for e in bad[:max_listed]]
        if len(bad) > max_listed:
            lines.append(f"  ... and {len(bad) - max_listed} more (--json lists them all)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "exact": self.exact, "episodes": len(self.episodes),
                "counts": {s: self.count(s) for s in ("exact", "differs", "skipped")}, "installed": self.installed,
                "specs": self.specs, "unchecked_scores": self.unchecked_scores,
                "results": [e.to_dict() for e in self.episodes]}


# ------------------------------------------------------------------------------------------------ comparisons
def _bits(array: np.ndarray) -> np.ndarray:
    """Floats as their bit patterns (so -0.0 != 0.0 and NaN == the same NaN): "exact" means bit-exact."""
    return array.view(f"u{array.itemsize}") if array.dtype.kind == "f" else array


def array_difference(name: str, recorded: Any, replayed: Any) -> Difference | None:
    """None when both are the same 1-D array bit for bit (dtype included), else a :class:`Difference` with a window
    around the first differing position.

    >>> array_difference("token_ids", np.array([1, 2, 3]), np.array([1, 2, 3])) is None
    True
    >>> print(array_difference("token_ids", np.array([1, 2, 3]), np.array([1, 5, 3, 4])))
    token_ids differs at position 1 (lengths 3 and 4): recorded [1, 2, 3], replayed [1, 5, 3, 4]
    """
    a, b = np.asarray(recorded), np.asarray(replayed)
    if a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes():
        return None
    n = min(len(a), len(b))
    if a.dtype.kind == b.dtype.kind and a.dtype.itemsize == b.dtype.itemsize:
        unequal = np.flatnonzero(_bits(a[:n]) != _bits(b[:n]))
    else:
        unequal = np.flatnonzero(a[:n] != b[:n])
    i = int(unequal[0]) if len(unequal) else n
    where = f"position {i} (lengths {len(a)} and {len(b)})"
    if a.dtype != b.dtype:
        where += f", dtypes {a.dtype} and {b.dtype}"
    low = max(0, i - 4)
    return Difference(name, a[low:i + 6].tolist(), b[low:i + 6].tolist(), where)


def text_difference(name: str, recorded: str, replayed: str) -> Difference | None:
    """None for equal strings, else a :class:`Difference` around the first differing character.

    >>> print(text_difference("observation", "What is 2 + 2?", "What is 2 + 3?"))
    observation differs at character 12 (lengths 14 and 14): recorded 'What is 2 + 2?', replayed 'What is 2 + 3?'
    """
    if recorded == replayed:
        return None
    i = next((k for k, (x, y) in enumerate(zip(recorded, replayed)) if x != y), min(len(recorded), len(replayed)))
    low = max(0, i - 40)
    return Difference(name, recorded[low:i + 40], replayed[low:i + 40],
                      f"character {i} (lengths {len(recorded)} and {len(replayed)})")


def scalar_difference(name: str, recorded: Any, replayed: Any) -> Difference | None:
    """None when equal (floats: bit for bit), else a :class:`Difference`.

    >>> scalar_difference("reward", 1.0, 1.0) is None, str(scalar_difference("reward", 1.0, 0.0))
    (True, 'reward differs: recorded 1.0, replayed 0.0')
    """
    recorded = recorded.item() if isinstance(recorded, np.generic) else recorded
    replayed = replayed.item() if isinstance(replayed, np.generic) else replayed
    if isinstance(recorded, float) or isinstance(replayed, float):
        try:
            same = np.float64(recorded).tobytes() == np.float64(replayed).tobytes()
        except (TypeError, ValueError):
            same = False
    else:
        same = type(recorded) is type(replayed) and recorded == replayed
    return None if same else Difference(name, _plain(recorded), _plain(replayed))


def _plain(value: Any) -> Any:
    """A JSON-able copy of a value shown in a report."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if value is None or isinstance(value, (bool, int, float, str, list)):
        return value
    return repr(value)
