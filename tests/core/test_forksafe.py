"""Forked children never inherit a held lock (gym_llm.core.forksafe).

A fork copies the calling thread only; a lock another thread held at that moment stays held in the child forever. The
package's process-wide locks must be :class:`~gym_llm.core.forksafe.ForkSafeLock`\\ s, which every child gets back
released.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import threading

import gym_llm
from gym_llm.core.forksafe import ForkSafeLock

_PLAIN_LOCKS = (type(threading.Lock()), type(threading.RLock()))


def _child_acquires(locks: list) -> str:
    """Fork; in the child, try each lock without blocking; return what the child reported."""
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - reports through the pipe
        try:
            os.write(write_fd, "".join("1" if lock.acquire(False) else "0" for lock in locks).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    report = os.read(read_fd, 1024).decode()
    os.close(read_fd)
    os.waitpid(child, 0)
    return report


def _held_by_another_thread(locks: list):
    """A thread that holds ``locks`` until the returned event is set."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in locks:
            lock.acquire()
        held.set()
        done.wait()
        for lock in locks:
            lock.release()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(5)
    return done, thread


def test_a_lock_held_by_another_thread_is_free_in_a_forked_child():
    fork_safe, plain = ForkSafeLock(), threading.Lock()
    done, thread = _held_by_another_thread([fork_safe, plain])
    try:
        report = _child_acquires([fork_safe, plain])
    finally:
        done.set()
        thread.join()
    assert report == "10"  # the plain lock is what the package must not use: it stays held in the child
    assert not fork_safe.locked() and fork_safe.acquire(False)  # the parent's own lock works as before
    fork_safe.release()


def _package_modules() -> list:
    modules = []
    for info in pkgutil.walk_packages(gym_llm.__path__, "gym_llm."):
        try:
            modules.append(importlib.import_module(info.name))
        except ImportError:  # an optional extra (skyrl, verifiers, openenv) that is not installed
            continue
    return modules


def test_no_module_or_class_level_lock_in_the_package_is_a_plain_lock():
    """Every process-wide lock (module globals, class attributes) is fork-safe; a plain one is named here."""
    plain, fork_safe = [], 0
    for module in _package_modules():
        for name, value in vars(module).items():
            holders = [(name, value)]
            if isinstance(value, type) and value.__module__ == module.__name__:
                holders += [(f"{name}.{attr}", v) for attr, v in vars(value).items()]
            for where, obj in holders:
                if isinstance(obj, _PLAIN_LOCKS):
                    plain.append(f"{module.__name__}.{where}")
                fork_safe += isinstance(obj, ForkSafeLock)
    assert not plain, f"plain threading locks a forked child could inherit held (use ForkSafeLock): {plain}"
    assert fork_safe >= 8  # the scan saw the package's locks (cgroups, probe, pools, ...)
