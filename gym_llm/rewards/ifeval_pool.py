"""Parallel IFEval scoring: a process pool, because the checkers are pure Python.

The official checkers (regexes, NLTK tokenisation, ``langdetect``) hold the GIL, so scoring in
threads does not run in parallel (measured in ``bench/ifeval.py``). :class:`IFEvalScorer` runs
:func:`gym_llm.rewards.ifeval.evaluate` either inline (``num_workers=0``) or in a pool of worker
processes; its :meth:`IFEvalScorer.evaluate` is thread-safe, so the vector env's ``respond`` threads
each hand one sub-env's reply to a free process and wait for it.

Workers are started with ``spawn`` (never ``fork``: the vector env has threads running, and forking a
threaded process can deadlock), lazily on first use, and each runs :func:`~gym_llm.rewards.ifeval.prepare`
once (~1-2 s: imports, punkt_tab, seeded ``langdetect``).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Iterable, Mapping, Sequence

from gym_llm.rewards.ifeval import IFEvalResult, evaluate, prepare

__all__ = ["IFEvalScorer"]

logger = logging.getLogger(__name__)

ScoreItem = tuple[str, Sequence[str], Sequence[Mapping[str, Any] | None], "str | None"]
"""``(response, instruction_id_list, kwargs, prompt)``."""


def _init_worker() -> None:
    prepare()


def _evaluate_item(item: ScoreItem) -> IFEvalResult:
    response, ids, kwargs, prompt = item
    return evaluate(response, ids, kwargs, prompt=prompt)


class IFEvalScorer:
    """Scores replies with :func:`~gym_llm.rewards.ifeval.evaluate`, inline or in worker processes.

    Args:
        num_workers: worker processes; 0 scores in the calling thread.
        mp_context: the multiprocessing start method for the workers (default ``"spawn"``).

    Example:
        >>> scorer = IFEvalScorer(num_workers=0)
        >>> scorer.evaluate("no commas here", ["punctuation:no_comma"], [{}]).strict
        (True,)
    """

    def __init__(self, num_workers: int = 0, *, mp_context: str = "spawn"):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0 (0 scores inline), got {num_workers!r}.")
        if mp_context not in multiprocessing.get_all_start_methods():
            raise ValueError(
                f"mp_context must be one of {multiprocessing.get_all_start_methods()}, got {mp_context!r}."
            )
        self.num_workers = num_workers
        self.mp_context = mp_context
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _get_pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("This IFEvalScorer is closed; make a new one (or a new env).")
            if self._pool is None:
                logger.info("Starting %d IFEval scoring processes (%s)", self.num_workers, self.mp_context)
                self._pool = ProcessPoolExecutor(
                    self.num_workers,
                    mp_context=multiprocessing.get_context(self.mp_context),
                    initializer=_init_worker,
                )
            return self._pool

    def evaluate(
        self,
        response: str,
        instruction_id_list: Sequence[str],
        kwargs: Sequence[Mapping[str, Any] | None] | None,
        prompt: str | None = None,
    ) -> IFEvalResult:
        """Strict and loose results of one reply (thread-safe; blocks until scored)."""
        if self.num_workers == 0:
            return evaluate(response, instruction_id_list, kwargs, prompt=prompt)
        item = (response, list(instruction_id_list), list(kwargs) if kwargs is not None else None, prompt)
        return self._get_pool().submit(_evaluate_item, item).result()

    def evaluate_many(self, items: Iterable[ScoreItem]) -> list[IFEvalResult]:
        """Results of many ``(response, instruction_id_list, kwargs, prompt)`` items, in order."""
        items = list(items)
        if self.num_workers == 0 or len(items) < 2:
            return [_evaluate_item(item) for item in items]
        chunk = max(1, len(items) // (4 * self.num_workers))
        return list(self._get_pool().map(_evaluate_item, items, chunksize=chunk))

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "IFEvalScorer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
