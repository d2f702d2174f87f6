"""Wait for a file descriptor with ``poll(2)``, which takes any descriptor number.

``select.select`` refuses descriptors >= ``FD_SETSIZE`` (1024) with ``ValueError: filedescriptor out of range``,
and a trainer reaches that many easily: an in-process vLLM engine, a Ray client, and a vector env of 64 sub-envs
each holding sandboxed REPLs (``LLMCode-v0`` holds two per sub-env, training and evaluation envs both). Every wait on
a pipe or socket in the package goes through :func:`wait_fd`.

>>> import os
>>> r, w = os.pipe()
>>> wait_fd(r, timeout_s=0.0), wait_fd(w, write=True, timeout_s=0.0)
(False, True)
>>> os.close(r); os.close(w)
"""

from __future__ import annotations

import select

__all__ = ["wait_fd"]


def wait_fd(fd: int, *, write: bool = False, timeout_s: float | None = None) -> bool:
    """True once ``fd`` is readable (``write=True``: writable) or has hung up or failed, False after ``timeout_s``
    seconds (``None``: no limit). A closed or hung-up descriptor counts as ready, so the read or write that follows
    reports it."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(None if timeout_s is None else max(0, int(timeout_s * 1000 + 0.999))))
