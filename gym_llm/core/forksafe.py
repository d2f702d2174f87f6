"""Locks that a forked child gets back released.

``os.fork()`` copies a process with one thread: the caller. A ``threading.Lock`` that another thread held at that
moment stays held in the child forever, and the child's first ``with lock:`` hangs. Forks are common here: an
``AsyncVectorEnv`` worker, a ``multiprocessing`` fork pool, a test that forks. The package's process-wide locks
(a sandbox pool's cgroup directory, a grader's worker pool, a one-time probe) guard state that the child makes
again for itself (it never shares the parent's sandboxes or workers), so the child needs them free, not copied.

:class:`ForkSafeLock` is a ``threading.Lock`` that every forked child gets back **new and released**
(``os.register_at_fork``). Use it for every lock whose holder may be another thread while someone forks; a test
(``tests/core/test_forksafe.py``) fails on any module- or class-level plain lock left in the package.

>>> lock = ForkSafeLock()
>>> with lock:
...     lock.locked()
True
>>> lock.locked()
False
"""

from __future__ import annotations

import os
import threading
import weakref

__all__ = ["ForkSafeLock"]

_LIVE: "weakref.WeakSet[ForkSafeLock]" = weakref.WeakSet()


class ForkSafeLock:
    """A drop-in ``threading.Lock`` (``acquire``, ``release``, ``locked``, ``with``) renewed in a forked child."""

    __slots__ = ("_lock", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _LIVE.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def __repr__(self) -> str:
        return f"<ForkSafeLock {'locked' if self.locked() else 'unlocked'}>"


def _renew_in_child() -> None:
    for lock in list(_LIVE):  # the child has one thread: nobody holds any of them here
        lock._lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_in_child)
