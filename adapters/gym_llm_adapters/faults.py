"""What the collectors do when part of a rollout fails: one mechanism for the local :class:`Collector` (a failing
env shard) and the :class:`~gym_llm_adapters.ray.RayCollector` (a failing env worker).

* :class:`RestartBudget` — **recover, up to a limit, then refuse.** A unit (a shard's vector env, a Ray env worker)
  that failed after its envs were stepped is restarted from a fresh reset: its in-flight episodes are dropped and so
  are finished episodes of its groups that can no longer complete (both counted in the stats), one warning names the
  cause (:func:`root_cause`), and the unit gets fresh group ids. Past ``max_restarts`` for one unit the budget
  refuses: it raises :class:`CollectorBrokenError` naming the cause and the fix (the collector raises it again on
  every later call). A ``KeyboardInterrupt`` (or any ``BaseException`` that is not an ``Exception``) is never recovered from.
* :class:`HeldBatch` — **a batch is kept until it is scored and on disk.** A reward stage that raises (a judge server
  down, a user's stage with a bug) leaves the batch held, unscored: the next call scores it again before collecting
  anything new. A failed write (``ENOSPC``, Ctrl-C) leaves nothing of the batch in the file (the writer cuts back to
  where it began) and the batch stays held, scored; the next call writes and returns that same batch.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

__all__ = ["CollectorBrokenError", "RestartBudget", "HeldBatch", "root_cause"]

logger = logging.getLogger(__name__)


class CollectorBrokenError(RuntimeError):
    """A collector stopped after a failure it does not recover from (the message says the cause and the fix)."""


def root_cause(exc: BaseException, limit: int = 600) -> str:
    """What actually went wrong, for a log line: the innermost exception a wrapper carries (Ray wraps a worker's
    exception in a ``RayTaskError`` whose text starts with a long ``ray::Actor.method() (pid=..., ip=...)`` header),
    as ``Type: message``, its last line if the message is a traceback."""
    root = exc
    while isinstance(getattr(root, "cause", None), BaseException) and root.cause is not root:
        root = root.cause
    text = str(root).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and root is exc:  # a wrapped traceback: its last line names the error
        text = lines[-1].strip()
    name = type(root).__name__
    text = text if text.startswith(name) else f"{name}: {text}"
    notes = [str(n) for n in getattr(root, "__notes__", ()) or ()]
    if notes:  # where it happened (gym_llm's vector envs note which sub-env, task and group raised)
        text += " [" + "; ".join(notes) + "]"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class RestartBudget:
    """Restarts allowed per unit, the drop counters, and the refusal (module docstring).

    Args:
        max_restarts: restarts allowed per unit before the budget refuses (0: refuse at the first failure).
        unit: what a unit is called in messages (``"env shard"``, ``"env worker"``).
        option: the constructor option that sets ``max_restarts`` (named in the refusal's fix).
        stats: the collector's stats; ``episodes_dropped`` / ``episodes_orphaned`` / ``restarts`` are added to.
    """

    def __init__(self, max_restarts: int, *, unit: str, option: str, stats: Any):
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"{option} must be an int >= 0, got {max_restarts!r}.")
        self.max_restarts, self.unit, self.option, self.stats = max_restarts, unit, option, stats
        self.restarts: dict[int, int] = {}

    def failed(self, index: int, cause: BaseException, *, dropped: int, orphaned: int,
               restart: Callable[[], None]) -> None:
        """Unit ``index`` failed with ``cause``; ``dropped`` in-flight and ``orphaned`` finished episodes are lost.

        Counts them, then calls ``restart()`` and logs one warning — or, past the limit, raises the refusal (from
        ``cause``; the collector keeps it and raises it again on every later call). A ``BaseException`` that is not an ``Exception`` (Ctrl-C) is re-raised as it is.
        """
        self.stats.episodes_dropped += dropped
        self.stats.episodes_orphaned += orphaned
        if not isinstance(cause, Exception):
            raise cause
        done = self.restarts.get(index, 0)
        if done >= self.max_restarts:
            raise CollectorBrokenError(
                f"{self.unit.capitalize()} {index} failed ({root_cause(cause)}) after {done} restart(s); "
                f"{self.option}={self.max_restarts}. Fix the env or its reward (the cause above; the full traceback "
                f"is chained), or allow more restarts with {self.option}=N, then make a new collector "
                "(or call reset() on a local Collector).") from cause
        self.restarts[index] = done + 1
        self.stats.restarts += 1
        restart()
        logger.warning("%s %d failed (%s); restarted it from a fresh reset (%d/%d). Dropped %d in-flight episode(s) and "
                       "%d finished episode(s) of groups that can no longer complete.", self.unit.capitalize(), index,
                       root_cause(cause), done + 1, self.max_restarts, dropped, orphaned)

    def reset(self) -> None:
        """Forget the restarts (a local collector's ``reset()``)."""
        self.restarts.clear()


class HeldBatch:
    """A batch held until the writer has it on disk (module docstring)."""

    def __init__(self) -> None:
        self.batch: list[Any] | None = None
        self.scored = False  # whether the held batch's reward stages ran (a write failed) or not (a stage raised)

    def score(self, batch: list[Any], stages: Callable[[list[Any]], None]) -> list[Any]:
        """Run ``stages(batch)`` unless ``batch`` is the held one and already scored; on failure the batch stays
        held, unscored, and the error propagates (with a note saying so)."""
        if batch is self.batch and self.scored:
            return batch
        self.batch, self.scored = batch, False
        try:
            stages(batch)
        except BaseException as e:
            e.add_note(f"The batch's {len(batch)} trajectories are kept, unscored: the collector's next next_batch() "
                       "scores them again before collecting anything new.")
            raise
        self.scored = True
        return batch

    def write(self, writer: Any, batch: list[Any]) -> list[Any]:
        """Write ``batch`` (if there is a writer) and return it; on failure the batch stays held and the error
        propagates."""
        if writer is not None:
            self.batch = batch
            writer.write(batch)
        self.batch, self.scored = None, False
        return batch

    def take(self) -> list[Any] | None:
        """The held batch, if a reward stage or a write failed (it goes first, as it was)."""
        return self.batch
