"""Engines as Ray actors: the actor body, a client with the Engine protocol, and a group with versions and restarts.

* :class:`EngineActor` holds one engine (built from an :class:`~gym_llm_adapters.ray.specs.EngineSpec` inside the
  actor, e.g. an in-process vLLM on a GPU node) and serves ``generate`` / ``logprobs`` / ``load_weights``.
* :class:`RemoteEngine` is the :class:`~gym_llm_adapters.engines.Engine` protocol over one actor handle: env
  workers drive their local collector with it. A dead actor raises :class:`EngineUnavailableError`, any other
  engine failure :class:`EngineCallError`.
* :class:`EngineGroup` (driver side) starts ``E`` actors and is itself an Engine: ``generate`` splits the prompts
  over the actors, ``load_weights`` broadcasts one object-store copy of the weights (see
  :mod:`gym_llm_adapters.ray.weights`) and bumps the common ``version``. It restarts a dead actor up to
  ``max_restarts`` times, at the group's version and with the weights pushed so far, so a restart never
  changes what the policy samples; past that it raises :class:`EngineDiedError`.

LoRA: ``load_adapter`` ships the adapter's bytes (:class:`~gym_llm_adapters.ray.weights.PackedAdapter`, one object-store
copy), each actor writes them to a folder of its own and loads that into its engine (built with ``lora_rank=R`` in the
:class:`~gym_llm_adapters.ray.specs.EngineSpec`), so actors on other machines need no shared file system. A restarted
actor starts serving the latest adapter (and then takes the weight updates kept for restarts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from gym_llm_adapters.engines.base import SamplingConfig
from gym_llm_adapters.ray.specs import (EngineCallError, EngineDiedError, EngineSpec, EngineUnavailableError,
                                        require_ray)
from gym_llm_adapters.ray.weights import PackedAdapter, PackedWeights
from gym_llm_adapters.types import Completion

if TYPE_CHECKING:
    from gym_llm_adapters.lora import Adapter

__all__ = ["EngineActor", "RemoteEngine", "EngineGroup"]

logger = logging.getLogger(__name__)


class EngineActor:
    """The body of an engine actor (wrapped with ``ray.remote`` by :class:`EngineGroup`).

    Calls that touch the model run one at a time unless the spec says the engine is thread-safe; ``version``
    and ``info`` answer at once even while a long ``generate`` runs (the actor has a few threads).
    """

    def __init__(self, spec: EngineSpec, version: int = 0, adapter: PackedAdapter | None = None):
        self._adapter_root = Path(tempfile.mkdtemp(prefix="gym_llm_actor_adapters_"))  # this actor's adapter folders
        try:
            initial = None if adapter is None else adapter.unpack(self._adapter_root, version=version)
            self.engine = spec.build(version=version, adapter=initial)
        except BaseException:
            shutil.rmtree(self._adapter_root, ignore_errors=True)
            raise
        self._lock = contextlib.nullcontext() if spec.thread_safe else threading.Lock()
        self._adapter_lock = threading.Lock()  # pushes one at a time, also for thread-safe engines

    def info(self) -> dict[str, Any]:
        import ray

        adapter = getattr(self.engine, "adapter", None)
        return {"version": int(self.engine.version), "engine": type(self.engine).__name__, "pid": os.getpid(),
                "node_ip": ray.util.get_node_ip_address(), "adapter": None if adapter is None else adapter.name}

    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def version(self) -> int:
        return int(self.engine.version)

    def generate(self, prompts: Sequence[Any], sampling: SamplingConfig) -> list[Completion]:
        prompts = [_writable(p) for p in prompts]
        with self._lock:
            return self.engine.generate(prompts, sampling)

    def logprobs(self, sequences: Sequence[Any]) -> list[np.ndarray]:
        sequences = [_writable(s) for s in sequences]
        with self._lock:
            return self.engine.logprobs(sequences)

    def load_weights(self, *updates: PackedWeights) -> int:
        """Load each update in order (object-store refs passed as arguments arrive resolved); the new version."""
        with self._lock:
            version = int(self.engine.version)
            for update in updates:
                version = int(self.engine.load_weights(update.items()))
            return version

    def serves_adapters(self) -> bool:
        return bool(getattr(self.engine, "serves_adapters", False))

    def adapter(self) -> "Adapter | None":
        return getattr(self.engine, "adapter", None)

    def load_adapter(self, packed: PackedAdapter) -> int:
        """Write the adapter's files to a folder of this actor's and load it; the new version. The folders of the
        served adapter and the one before it stay (an engine may read its adapter again); older ones go."""
        load = getattr(self.engine, "load_adapter", None)
        if load is None or not self.serves_adapters():
            raise ValueError(f"The {type(self.engine).__name__} in this actor does not serve LoRA adapters; build it "
                             "with LoRA on: EngineSpec(kind, ..., lora_rank=R).")
        with self._adapter_lock, self._lock:
            adapter = packed.unpack(self._adapter_root)
            try:
                version = int(load(adapter))
            except BaseException:
                shutil.rmtree(adapter.path, ignore_errors=True)
                raise
            folders = sorted(self._adapter_root.iterdir(), key=lambda p: p.stat().st_mtime)
            for old in folders[:-2]:
                shutil.rmtree(old, ignore_errors=True)
            return version

    def close(self) -> None:
        with self._lock:
            close = getattr(self.engine, "close", None)
            if close is not None:
                close()
        shutil.rmtree(self._adapter_root, ignore_errors=True)


def _writable(x: Any) -> Any:
    """Arrays from the object store are read-only views; torch warns on them, so prompts (small) are copied."""
    return np.array(x) if isinstance(x, np.ndarray) and not x.flags.writeable else x


def _call_error(index: int, method: str, error: BaseException) -> EngineCallError:
    """An :class:`EngineCallError` for a Ray task error (the engine's own exception is its ``cause``)."""
    cause = error.cause if getattr(error, "cause", None) is not None else error
    return EngineCallError(f"engine actor {index} failed in {method}: {type(cause).__name__}: {cause}")


def _actor_id(handle: Any) -> str:
    return handle._actor_id.hex()


class RemoteEngine:
    """The Engine protocol over one engine actor (what env workers hand to their local collector).

    Args:
        handle: the engine actor's handle (``EngineGroup.handle(i)``).
        index: the actor's index in its group (reported in errors, so the group restarts the right one).
        tokenizer: the engine's tokenizer; fetched from the actor on first use when not given.
    """

    def __init__(self, handle: Any, *, index: int = 0, tokenizer: Any = None):
        self.handle, self.index, self._tokenizer = handle, int(index), tokenizer

    def bind(self, handle: Any, index: int) -> None:
        """Point the client at a (restarted) actor."""
        self.handle, self.index = handle, int(index)

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None and self.handle is not None:
            self._tokenizer = self._call("tokenizer")
        return self._tokenizer

    @property
    def version(self) -> int:
        return int(self._call("version"))

    def generate(self, prompts: Sequence[Any], sampling: SamplingConfig) -> list[Completion]:
        return self._call("generate", list(prompts), sampling)

    def logprobs(self, sequences: Sequence[Any]) -> list[np.ndarray]:
        return self._call("logprobs", list(sequences))

    def load_weights(self, weights: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> int:
        return int(self._call("load_weights", PackedWeights.pack(weights)))

    @property
    def serves_adapters(self) -> bool:
        return bool(self._call("serves_adapters"))

    @property
    def adapter(self) -> "Adapter | None":
        """The actor's adapter (its ``path`` is the actor's own folder)."""
        return self._call("adapter")

    def load_adapter(self, adapter: "Adapter") -> int:
        """Ship ``adapter``'s files to the actor and load it there; the new version."""
        return int(self._call("load_adapter", PackedAdapter.pack(adapter)))

    def close(self) -> None:
        """Nothing to release: the group owns the actor."""

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        try:
            return ray.get(getattr(self.handle, method).remote(*args))
        except ray.exceptions.RayActorError as e:
            raise EngineUnavailableError(self.index, _actor_id(self.handle), f"{type(e).__name__}: {e}") from None
        except ray.exceptions.RayTaskError as e:
            raise _call_error(self.index, method, e) from None


@dataclasses.dataclass
class _Slot:
    actor: Any
    restarts: int = 0


class EngineGroup:
    """``num_engines`` engine actors with one policy version (the Engine protocol over all of them).

    Args:
        spec: how each actor builds its engine.
        num_engines: actors to start (e.g. one per GPU).
        actor_options: Ray actor options for each engine actor, e.g. ``{"num_gpus": 1}`` to place it on a GPU
            (``num_cpus``, ``resources``, ``scheduling_strategy``, ``runtime_env``, ... as in ``ray.remote``).
        max_concurrency: threads per actor (>= 2 lets ``version``/``info`` answer during a ``generate``;
            model calls still run one at a time unless ``spec.thread_safe``).
        max_restarts: how often each actor may be restarted after it died (0: a death raises
            :class:`EngineDiedError`). A restarted actor starts at the group's version with every weight update
            pushed so far, so its samples equal the dead one's. The default, 1, is also
            :class:`~gym_llm_adapters.ray.RayCollector`'s ``max_engine_restarts``: a restart loses nothing but a
            model load, so one death (a preempted node, a transient fault) is absorbed; a second death of the same
            actor usually has a cause that would repeat (out of memory, a bad kernel) and raises instead of
            looping through model loads.
        keep_weights: keep the pushed weights in the object store so that restarts can restore them (one copy
            of the latest full state dict, plus later partial updates, and the latest LoRA adapter). False saves
            that memory; a death after a push then raises :class:`EngineDiedError`.
        version: the engines' initial version (when resuming a run; default 0, or ``adapter.version``).
        adapter: a LoRA adapter every actor serves from the start (a resumed LoRA run), at ``adapter.version``.
        start_timeout_s: how long to wait for the actors to start (placement + model load).
    """

    def __init__(self, spec: EngineSpec, num_engines: int = 1, *, actor_options: Mapping[str, Any] | None = None,
                 max_concurrency: int = 4, max_restarts: int = 1, keep_weights: bool = True, version: int | None = None,
                 start_timeout_s: float = 600.0, adapter: "Adapter | None" = None):
        ray = require_ray()
        if not isinstance(spec, EngineSpec):
            raise TypeError(f"spec must be an EngineSpec, got {type(spec).__name__}.")
        if adapter is not None:
            if version is not None and version != adapter.version:
                raise ValueError(f"EngineGroup version={version} disagrees with the adapter's version "
                                 f"{adapter.version}; engines that start with an adapter are at its version.")
            version = adapter.version
        version = 0 if version is None else version
        for name, value, low in (("num_engines", num_engines, 1), ("max_concurrency", max_concurrency, 1),
                                 ("max_restarts", max_restarts, 0), ("version", version, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"EngineGroup {name} must be an int >= {low}, got {value!r}.")
        self.spec, self.max_restarts, self.keep_weights = spec, max_restarts, keep_weights
        self.start_timeout_s = float(start_timeout_s)
        self._options = {"max_concurrency": max_concurrency, **dict(actor_options or {})}
        self._remote_cls = ray.remote(EngineActor)
        self._version = version
        self._updates: list[Any] = []  # object refs of the PackedWeights pushed since the last full update
        self._update_names: set[str] = set()
        self._weights_lost = False
        self._adapter = adapter  # the latest adapter pushed (driver-side path), and its bytes in the object store
        self._adapter_ref = None if adapter is None else ray.put(PackedAdapter.pack(adapter))
        self._serves_adapters: bool | None = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()
        self._slots = [_Slot(self._start_actor(version)) for _ in range(num_engines)]
        self._wait_ready(list(range(num_engines)))

    # ------------------------------------------------------------------------------ actors
    def _start_actor(self, version: int) -> Any:
        """A new actor at ``version``, serving the latest adapter (relabelled to ``version``) when there is one."""
        return self._remote_cls.options(**self._options).remote(self.spec, version, self._adapter_ref)

    def _wait_ready(self, indices: list[int]) -> list[dict[str, Any]]:
        import ray

        refs = [self._slots[i].actor.info.remote() for i in indices]
        try:
            infos = ray.get(refs, timeout=self.start_timeout_s)
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"An engine actor failed to start with {self.spec!r}: {e}") from None
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"Engine actors did not start within {self.start_timeout_s:.0f} s. Requested per actor: "
                f"{ {k: v for k, v in self._options.items() if k != 'max_concurrency'} }; free in the cluster: "
                f"{ray.available_resources()}. Lower num_engines / the actor options or add nodes."
            ) from None
        for info in infos:
            logger.info("engine actor ready: %s", info)
        return infos

    @property
    def num_engines(self) -> int:
        return len(self._slots)

    def handle(self, index: int) -> Any:
        """The current actor handle of engine ``index`` (changes when the actor is restarted)."""
        return self._slots[index].actor

    @property
    def handles(self) -> list[Any]:
        return [s.actor for s in self._slots]

    @property
    def restarts(self) -> list[int]:
        """Restarts per engine so far."""
        return [s.restarts for s in self._slots]

    def client(self, index: int = 0) -> RemoteEngine:
        """A :class:`RemoteEngine` on engine ``index`` (its handle is fixed: after a restart get a new one)."""
        return RemoteEngine(self.handle(index), index=index, tokenizer=self.tokenizer)

    def restart(self, index: int, *, dead_actor_id: str | None = None, cause: BaseException | None = None) -> Any:
        """Replace engine ``index`` (if it is still the actor ``dead_actor_id``) and return the live handle.

        The new actor resumes at the group's version with the weights pushed so far. Several workers may report
        the same death: only the first report restarts it.
        """
        import ray

        with self._lock:
            slot = self._slots[index]
            if dead_actor_id is not None and _actor_id(slot.actor) != dead_actor_id:
                return slot.actor  # already replaced
            with contextlib.suppress(Exception):
                ray.kill(slot.actor, no_restart=True)
            if slot.restarts >= self.max_restarts:
                raise EngineDiedError(
                    f"Engine actor {index} died ({cause}) and was restarted {slot.restarts} time(s), the most "
                    f"max_restarts={self.max_restarts} allows. Check the actor's log (out of memory? a crashed "
                    "kernel?) and raise max_restarts (RayCollector's max_engine_restarts) to tolerate more deaths."
                )
            if self._weights_lost:
                raise EngineDiedError(
                    f"Engine actor {index} died ({cause}) after a weight push, and keep_weights=False left nothing to "
                    "restore its weights from. Use keep_weights=True to make engine restarts possible."
                )
            slot.restarts += 1
            updates = list(self._updates)
            slot.actor = actor = self._start_actor(self._version - len(updates))
            logger.warning("Engine actor %d died (%s); restarting it (%d/%d) at version %d.", index, cause,
                           slot.restarts, self.max_restarts, self._version)
        # (it started serving the latest adapter; the weight updates kept since the last full one follow)
        if updates:  # before any other call can reach the new actor's model
            ray.get(actor.load_weights.remote(*updates), timeout=self.start_timeout_s)
        self._wait_ready([index])
        return actor

    # ---------------------------------------------------------------------------- protocol
    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = self._with_restarts(0, "tokenizer")
        return self._tokenizer

    @property
    def version(self) -> int:
        """The group's policy version: the initial version + the number of :meth:`load_weights` calls."""
        return self._version

    def versions(self) -> list[int]:
        """Every actor's own version (all equal to :attr:`version` unless an actor was changed elsewhere)."""
        return [int(self._with_restarts(i, "version")) for i in range(self.num_engines)]

    def generate(self, prompts: Sequence[Any], sampling: SamplingConfig) -> list[Completion]:
        """Split ``prompts`` into ``E`` contiguous chunks, one per actor, run concurrently, prompt-major output.

        A seeded call gives chunk ``c`` (starting at prompt ``i_c``) ``seed + i_c * n``: vLLM engines then seed
        every prompt as a single call over all prompts would.
        """
        prompts = list(prompts)
        E = min(self.num_engines, max(1, len(prompts)))
        bounds = np.linspace(0, len(prompts), E + 1).astype(int)
        calls = []
        for c in range(E):
            lo, hi = int(bounds[c]), int(bounds[c + 1])
            seed = None if sampling.seed is None else sampling.seed + lo * sampling.n
            calls.append((c, "generate", (prompts[lo:hi], dataclasses.replace(sampling, seed=seed))))
        return [c for part in self._run(calls) for c in part]

    def logprobs(self, sequences: Sequence[Any]) -> list[np.ndarray]:
        """Teacher-forced log-probs, the sequences split over the actors like :meth:`generate`."""
        sequences = list(sequences)
        E = min(self.num_engines, max(1, len(sequences)))
        bounds = np.linspace(0, len(sequences), E + 1).astype(int)
        calls = [(c, "logprobs", (sequences[int(bounds[c]):int(bounds[c + 1])],)) for c in range(E)]
        return [x for part in self._run(calls) for x in part]

    def load_weights(self, weights: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> int:
        """Broadcast ``weights`` to every actor (one object-store copy) and return the new common version.

        Raises ``RuntimeError`` if an actor's version disagrees afterwards (it was updated behind the group's back).
        """
        import ray

        packed = weights if isinstance(weights, PackedWeights) else PackedWeights.pack(weights)
        ref = ray.put(packed)
        with self._lock:
            saved = (list(self._updates), set(self._update_names), self._weights_lost, self._version)
            if set(packed.names) >= self._update_names:  # a full update: earlier ones are not needed for restarts
                self._updates, self._update_names = [], set()
            if self.keep_weights:
                self._updates.append(ref)
                self._update_names |= set(packed.names)
            else:
                self._weights_lost = True
            self._version += 1
        try:
            versions = self._run([(i, "load_weights", (ref,)) for i in range(self.num_engines)], restored=True)
        except EngineCallError:  # refused by the engines (e.g. unknown names): the group stays as it was
            self._updates, self._update_names, self._weights_lost, self._version = saved
            if len(set(self.versions())) != 1:
                raise RuntimeError("A weight push failed on some engine actors only; their versions now disagree: "
                                   f"{self.versions()}.") from None
            raise
        if any(v != self._version for v in versions):
            raise RuntimeError(f"The engine actors' versions disagree after the weight push: {versions} "
                               f"(the group is at {self._version}).")
        return self._version

    # ------------------------------------------------------------------------------ adapters
    @property
    def serves_adapters(self) -> bool:
        """Whether the actors' engines serve LoRA adapters (asked once: every actor builds the same spec)."""
        if self._serves_adapters is None:
            self._serves_adapters = bool(self._with_restarts(0, "serves_adapters"))
        return self._serves_adapters

    @property
    def adapter(self) -> "Adapter | None":
        """The latest adapter pushed to the actors (``None``: the base model)."""
        return self._adapter

    def load_adapter(self, adapter: "Adapter") -> int:
        """Ship ``adapter``'s files to every actor (one object-store copy) and load it; the new common version.

        A refusal (any actor's) raises :class:`EngineCallError` with the group as it was; ``RuntimeError`` if the
        actors' versions disagree afterwards."""
        import ray

        if adapter.version != self._version + 1:
            raise ValueError(f"The adapter {adapter.name!r} is for version {adapter.version}; the engine group is at "
                             f"{self._version}, so its next adapter is for {self._version + 1}.")
        ref = ray.put(PackedAdapter.pack(adapter))
        with self._lock:
            saved = (self._adapter, self._adapter_ref, self._weights_lost, self._version)
            self._adapter = adapter
            if self.keep_weights:
                self._adapter_ref = ref
            else:
                self._weights_lost = True
            self._version += 1
        try:
            versions = self._run([(i, "load_adapter", (ref,)) for i in range(self.num_engines)], restored=True)
        except EngineCallError:  # refused by the engines: the group stays as it was
            self._adapter, self._adapter_ref, self._weights_lost, self._version = saved
            if len(set(self.versions())) != 1:
                raise RuntimeError("An adapter push failed on some engine actors only; their versions now disagree: "
                                   f"{self.versions()}.") from None
            raise
        if any(v != self._version for v in versions):
            raise RuntimeError(f"The engine actors' versions disagree after the adapter push: {versions} "
                               f"(the group is at {self._version}).")
        return self._version

    def _run(self, calls: list[tuple[int, str, tuple]], restored: bool = False) -> list[Any]:
        """Run ``(engine, method, args)`` calls concurrently; a dead actor is restarted and its call retried.

        ``restored``: a restarted actor already holds the effect of this call (weight pushes), so its result is
        the group's version instead of a retry.
        """
        import ray

        handles = [self.handle(i) for i, _, _ in calls]
        refs = [getattr(h, method).remote(*args) for h, (_, method, args) in zip(handles, calls)]
        out, failure = [], None
        for (i, method, args), handle, ref in zip(calls, handles, refs):
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayActorError as e:
                self.restart(i, dead_actor_id=_actor_id(handle), cause=e)
                out.append(self._version if restored else self._with_restarts(i, method, *args))
            except ray.exceptions.RayTaskError as e:  # wait for the other calls before raising
                failure = failure or _call_error(i, method, e)
                out.append(None)
        if failure is not None:
            raise failure
        return out

    def _with_restarts(self, index: int, method: str, *args: Any) -> Any:
        import ray

        while True:
            handle = self.handle(index)
            try:
                return ray.get(getattr(handle, method).remote(*args))
            except ray.exceptions.RayActorError as e:
                self.restart(index, dead_actor_id=_actor_id(handle), cause=e)
            except ray.exceptions.RayTaskError as e:
                raise _call_error(index, method, e) from None

    # ------------------------------------------------------------------------------- misc
    def close(self, timeout_s: float = 30.0) -> None:
        """Close the engines and end the actors."""
        import ray

        refs = [s.actor.close.remote() for s in self._slots]
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for s in self._slots:
            with contextlib.suppress(Exception):
                ray.kill(s.actor, no_restart=True)
        self._updates = []

    def __enter__(self) -> "EngineGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EngineGroup({self.spec!r}, num_engines={self.num_engines}, version={self._version})"
