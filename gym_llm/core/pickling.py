"""Pickling envs by configuration: an env pickles as *how it was made* (its class and constructor arguments), and
unpickles by being made again.

An env's live parts — the episode in progress, a sandbox, a browser, thread pools, locks, closures its builder made —
cannot travel between processes and should not: a copy made again from the same arguments is the same env, with
fresh live parts (a new sandbox on the next reset). So ``pickle.dumps(env)`` works for every gym_llm env and vector env
(and for Gymnasium's wrappers around them), which is what ``AsyncVectorEnv(context="spawn")``, ``multiprocessing``
and Ray need. What does not pickle is the user's own arguments when they cannot (a lambda as ``reward_fn``): the error
then names the argument and the fix.

:class:`ConstructorPickle` records the arguments of the most derived ``__init__`` of each subclass; ``env.spec`` and
``render_mode`` travel too. The episode in progress does not: an unpickled env needs ``reset()`` like a new one.
"""

from __future__ import annotations

import functools
import pickle
from typing import Any

__all__ = ["ConstructorPickle", "rebuild"]


def rebuild(cls: type, args: tuple, kwargs: dict[str, Any]) -> Any:
    """Make ``cls(*args, **kwargs)`` again (what unpickling an env does)."""
    return cls(*args, **kwargs)


class ConstructorPickle:
    """Mix-in: instances pickle as ``rebuild(type(self), args, kwargs)`` of their construction (module docstring)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_records_arguments", False):
            return

        @functools.wraps(init)
        def recording(self: Any, *args: Any, **kw: Any) -> None:
            if "_constructor" not in self.__dict__:  # the outermost (most derived) __init__ records
                self.__dict__["_constructor"] = (type(self), args, dict(kw))
            init(self, *args, **kw)

        recording._records_arguments = True  # type: ignore[attr-defined]
        cls.__init__ = recording  # type: ignore[method-assign]

    def __reduce__(self) -> tuple:
        recorded = self.__dict__.get("_constructor")
        if recorded is None or recorded[0] is not type(self):
            raise TypeError(f"{type(self).__name__} was not made through its constructor; it cannot be pickled.")
        cls, args, kwargs = recorded
        for name, value in [*enumerate(args), *kwargs.items()]:
            try:
                pickle.dumps(value)
            except Exception as e:
                raise TypeError(
                    f"{cls.__name__} pickles as its constructor arguments, and argument {name!r} "
                    f"({type(value).__name__}) cannot be pickled: {e}. Pass an importable function or object instead "
                    "(a module-level def, not a lambda or closure), or make the env inside the worker process."
                ) from e
        state = {"spec": getattr(self, "spec", None)}
        return rebuild, (cls, args, kwargs), state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state.get("spec") is not None:
            self.spec = state["spec"]
