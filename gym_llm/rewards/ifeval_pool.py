"""IFEval scoring in worker processes, under a hard deadline, optionally in parallel.

The official checkers (regexes, NLTK tokenisation, ``langdetect``) are pure Python: they hold the GIL, so threads do
not score in parallel (measured in ``bench/ifeval.py``), and nothing bounds how long one reply takes (a regex that
backtracks on an adversarial reply would hang the step). So :class:`IFEvalScorer` sends every reply to a worker
process of a :class:`~gym_llm.rewards.deadline.WorkerPool`: past ``timeout_s`` the worker is killed and the call raises
:class:`~gym_llm.rewards.deadline.DeadlineExceeded` (the env grades the reply 0 with ``info["reward_error"]``); up to
``max(1, num_workers)`` replies are scored at once (the vector env's ``respond`` threads each hand one sub-env's reply
to a free worker). Workers are plain subprocesses (never ``fork``: the vector env has threads running), started on
first use and shared by every scorer of the process; each runs :func:`~gym_llm.rewards.ifeval.prepare` once when it
starts (~1-2 s), outside any deadline. The hand-off costs ~40 µs per reply (a reply takes ~1.6 ms to score).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Mapping, Sequence

from gym_llm.core.forksafe import ForkSafeLock
from gym_llm.rewards.ifeval import IFEvalResult, evaluate

__all__ = ["IFEvalScorer", "IFEVAL_TIMEOUT_S"]

logger = logging.getLogger(__name__)

IFEVAL_TIMEOUT_S = 10.0
"""Deadline of scoring one reply (seconds); the checkers take milliseconds."""

ScoreItem = tuple[str, Sequence[str], Sequence[Mapping[str, Any] | None], "str | None"]
"""``(response, instruction_id_list, kwargs, prompt)``."""


_POOL: Any = None
_POOL_LOCK = ForkSafeLock()


def _shared_pool() -> Any:
    """The process's IFEval deadline workers (started on first use, each running ``prepare()`` once): every scorer
    and env shares them, so a new env does not pay a worker start. Concurrent callers each get a worker."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from gym_llm.rewards.deadline import WorkerPool

            _POOL = WorkerPool(preload=("gym_llm.rewards._ifeval_worker",))
        return _POOL


def _evaluate_item(item: ScoreItem) -> IFEvalResult:
    response, ids, kwargs, prompt = item
    return evaluate(response, ids, kwargs, prompt=prompt)


class IFEvalScorer:
    """Scores replies with :func:`~gym_llm.rewards.ifeval.evaluate` in deadline workers (module docstring).

    Args:
        num_workers: replies scored at once (each in a worker process of its own); 0 or 1: one at a time.
        timeout_s: the deadline of one reply (default :data:`IFEVAL_TIMEOUT_S`); past it
            :class:`~gym_llm.rewards.deadline.DeadlineExceeded`.

    Example:
        >>> scorer = IFEvalScorer(num_workers=0)
        >>> scorer.evaluate("no commas here", ["punctuation:no_comma"], [{}]).strict
        (True,)
        >>> scorer.close()
    """

    def __init__(self, num_workers: int = 0, *, timeout_s: float | None = None):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0 (0: one reply at a time), got {num_workers!r}.")
        timeout_s = IFEVAL_TIMEOUT_S if timeout_s is None else timeout_s
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}.")
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self._slots = threading.BoundedSemaphore(max(1, num_workers))
        self._lock = threading.Lock()
        self._closed = False

    def _get_pool(self) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError("This IFEvalScorer is closed; make a new one (or a new env).")
            return _shared_pool()

    def evaluate(
        self,
        response: str,
        instruction_id_list: Sequence[str],
        kwargs: Sequence[Mapping[str, Any] | None] | None,
        prompt: str | None = None,
    ) -> IFEvalResult:
        """Strict and loose results of one reply (thread-safe; blocks until scored or past the deadline)."""
        item = (response, list(instruction_id_list), list(kwargs) if kwargs is not None else None, prompt)
        pool = self._get_pool()
        with self._slots:
            return pool.call("gym_llm.rewards.ifeval_pool:_evaluate_item", item, timeout_s=self.timeout_s)

    def evaluate_many(self, items: Iterable[ScoreItem]) -> list[IFEvalResult]:
        """Results of many ``(response, instruction_id_list, kwargs, prompt)`` items, in order."""
        items = list(items)
        if self.num_workers <= 1 or len(items) < 2:
            return [self.evaluate(*item) for item in items]
        with ThreadPoolExecutor(self.num_workers) as threads:
            return list(threads.map(lambda item: self.evaluate(*item), items))

    def close(self) -> None:
        """Stop using the workers (idempotent). They are shared by every scorer of the process and stay warm for the
        next env; they exit with the process."""
        with self._lock:
            self._closed = True

    def __enter__(self) -> "IFEvalScorer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
