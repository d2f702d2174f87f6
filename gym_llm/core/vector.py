"""The native vector env: ``num_envs`` episodes stepped as one batch, with GRPO groups.

Groups: ``group_size=G`` splits the ``N`` sub-envs into ``N // G`` groups of consecutive indices
(sub-env ``i`` is in group ``i // G``). Every member of group ``g`` holds a copy of the group's task
stream, seeded like a scalar env reset with ``seed + g * G`` (the group leader's seed), so member ``i``
in round ``r`` gets task ``stream_g(r)`` whatever order the members' episodes finish in. With ``G = 1``
the vector env returns exactly what :class:`gymnasium.vector.SyncVectorEnv` over scalar envs returns
for the same seeds (same autoreset mode), apart from ``group_id``.

``task_assignment="partition"`` makes the groups share one stream instead (sub-env 0's) and split each
round between them: group ``g`` in round ``r`` gets ``stream(r * num_groups + g)``, so the groups of a
round hold *distinct* tasks and an epoch of the stream visits every task once (no parity with
``SyncVectorEnv`` then). Use it for evaluation over a dataset and for better data coverage in training.

Autoreset: ``SAME_STEP`` by default — a finished sub-env is reset inside the same ``step``, its
terminal observation and info are in ``info["final_obs"]``/``info["final_info"]`` (masks
``info["_final_obs"]``/``info["_final_info"]``) and the returned reward/terminated/truncated are the
terminal step's. Every batch is then all live episodes, which is what LLM batching wants.
``NEXT_STEP`` and ``DISABLED`` follow Gymnasium's semantics.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from operator import itemgetter
from typing import Any, Literal, Sequence

import numpy as np
from gymnasium.error import ResetNeeded
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from gym_llm.core.pickling import ConstructorPickle
from gym_llm.core.branching import BranchingMixin
from gym_llm.core.episode import EnvParts, Episode, resolve_reset_task
from gym_llm.core.spaces import UnicodeText
from gym_llm.core.tasks import TASK_SEED_BOUND, TaskStream

__all__ = ["LLMVectorEnv", "VECTOR_ARGUMENTS", "batch_infos"]

VECTOR_ARGUMENTS = ("num_envs", "group_size", "autoreset_mode", "task_assignment", "num_workers")
"""The arguments a derived vector env takes besides its env's own (see
:meth:`LLMEnv.__init_subclass__ <gym_llm.core.env.LLMEnv.__init_subclass__>`)."""


def batch_infos(infos: Sequence[dict[str, Any] | None], num_envs: int) -> dict[str, Any]:
    """Gymnasium's dict-of-arrays info from per-sub-env info dicts (``None`` = no info from that sub-env).

    Produces exactly what ``VectorEnv._add_info`` builds when called sub-env by sub-env (same dtypes,
    ``_key`` masks, nested dicts, object arrays for ``final_obs`` and non-numeric values) in one pass per
    key instead of one per key *and* sub-env — the difference is most of the vector env's per-sample cost.
    """
    columns = _common_columns(infos)
    if columns is not None:  # the common case: every sub-env reports the same keys, every mask is all True
        out: dict[str, Any] = {}
        all_true = _all_true(num_envs)
        for key, values in columns.items():
            out[key] = _batch_values(key, None, values, num_envs)
            out[f"_{key}"] = all_true.copy()
        return out
    keys: dict[str, None] = {}
    for info in infos:
        if info:
            keys.update(dict.fromkeys(info))
    out = {}
    for key in keys:
        where = [i for i, info in enumerate(infos) if info is not None and key in info]
        out[key] = _batch_values(key, where, [infos[i][key] for i in where], num_envs)
        mask = np.zeros(num_envs, dtype=np.bool_)
        mask[where] = True
        out[f"_{key}"] = mask
    return out


@lru_cache(maxsize=16)
def _all_true(num_envs: int) -> np.ndarray:
    """A read-only all-True mask of ``num_envs``, for :func:`batch_infos` to hand out copies of (a copy
    costs a third of ``np.ones``, and a step builds one mask per info key)."""
    mask = np.ones(num_envs, dtype=np.bool_)
    mask.setflags(write=False)
    return mask


def _common_columns(infos: Sequence[dict[str, Any] | None]) -> dict[str, list[Any]] | None:
    """Every key's values across the sub-envs, or None unless every sub-env reports the same keys.

    Same keys <=> same number of keys and every key of the first info found in all: checked by the
    lookups that read the values anyway, several times cheaper than comparing key sets info by info.
    """
    first = infos[0]
    if first is None or None in infos:
        return None
    size = len(first)
    if not all(map(size.__eq__, map(len, infos))):
        return None
    try:
        return {key: list(map(itemgetter(key), infos)) for key in first}
    except KeyError:
        return None


def _batch_values(key: str, where: list[int] | None, values: list[Any], num_envs: int) -> Any:
    """One info key's values (from the sub-envs ``where``; None = all) as Gymnasium's ``_add_info`` would
    store them (see :func:`batch_infos`)."""
    first = values[0]
    scalar = type(first) in (int, float, bool) or isinstance(first, np.number)
    if key == "final_obs" or not (scalar or isinstance(first, (dict, np.ndarray))):
        objects = np.fromiter(values, object, len(values))  # never unpacks a sequence value
        if where is None:
            return objects
        array = np.full(num_envs, None, dtype=object)
        array[where] = objects
        return array
    if isinstance(first, dict):
        nested: list[dict[str, Any] | None] = values if where is None else [None] * num_envs
        if where is not None:
            for i, value in zip(where, values):
                nested[i] = value
        return batch_infos(nested, num_envs)
    if scalar:
        if where is None:
            try:  # element by element, as _add_info writes them, in one call (positional args: faster)
                return np.fromiter(values, type(first), len(values))
            except (ValueError, TypeError):
                pass
        array = np.zeros(num_envs, dtype=type(first))
    else:
        array = np.zeros((num_envs, *first.shape), dtype=first.dtype)
    if array.dtype.kind != "O":
        try:
            array[slice(None) if where is None else where] = values
            return array
        except (ValueError, TypeError):  # mixed kinds under one key: assign one by one, as Gymnasium does
            pass
    for i, value in zip(range(num_envs) if where is None else where, values):
        array[i] = value
    return array


TaskAssignment = Literal["per_group", "partition"]



def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+); on 3.10 the note is appended to the message where possible."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    elif exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]} ({note})", *exc.args[1:])

class LLMVectorEnv(ConstructorPickle, BranchingMixin, VectorEnv):
    """Native vector env over an :class:`~gym_llm.core.episode.EnvParts`.

    Args:
        parts: the env's parts (shared by all sub-envs).
        num_envs: N, the number of sub-envs; a multiple of ``group_size``.
        group_size: G, sub-envs per GRPO group (all members of a group get the same task per round).
        autoreset_mode: a :class:`gymnasium.vector.AutoresetMode` or its string value.
        task_assignment: ``"per_group"`` (default; every group walks its own seeded stream, like scalar envs)
            or ``"partition"`` (groups split one shared stream: distinct tasks per round; see the module doc).
        num_workers: threads for the sub-envs' ``respond`` phase (tools, verifiers); 0 runs inline.
            Default: inline unless the env declares slow responses.
        render_mode: ``"ansi"`` or None.

    Observations: text envs give a ``tuple[str, ...]`` of length N; token envs a dict of ``(N, L)``
    arrays. ``info`` is Gymnasium's dict of arrays with ``_key`` masks, always with ``task_id``,
    ``group_id`` and ``round``.
    """

    SCALAR_BASE: type | None = None
    """:class:`~gym_llm.core.env.LLMEnv`, set by :mod:`gym_llm.core.env` (which imports this module, never the reverse):
    :meth:`fork` makes siblings of the subclass of it whose ``Vector`` this env's class is, else of it."""

    def __init__(
        self,
        parts: EnvParts,
        num_envs: int,
        *,
        group_size: int = 1,
        autoreset_mode: AutoresetMode | str = AutoresetMode.SAME_STEP,
        task_assignment: TaskAssignment = "per_group",
        num_workers: int | None = None,
        render_mode: str | None = None,
    ):
        if not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}.")
        if not isinstance(group_size, (int, np.integer)) or group_size < 1 or num_envs % group_size:
            raise ValueError(
                f"group_size must be an int >= 1 that divides num_envs={num_envs}, got {group_size!r}; "
                "num_envs = number of tasks per batch x group_size (e.g. num_envs=8, group_size=4)."
            )
        try:
            autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError as e:
            raise ValueError(
                f"autoreset_mode must be one of {[m.value for m in AutoresetMode]}, got {autoreset_mode!r}."
            ) from e
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be 'ansi' or None, got {render_mode!r}.")
        if task_assignment not in ("per_group", "partition"):
            raise ValueError(f"task_assignment must be 'per_group' or 'partition', got {task_assignment!r}.")
        self.parts = parts
        self.task_assignment = task_assignment
        self.num_envs = int(num_envs)
        self.group_size = int(group_size)
        self.num_groups = self.num_envs // self.group_size
        self.autoreset_mode = autoreset_mode
        self.render_mode = render_mode
        self.metadata = {"autoreset_mode": autoreset_mode, "render_modes": ["ansi"], "render_fps": 4}
        self.single_observation_space = parts.observation_space
        self.single_action_space = parts.action_space
        self.observation_space = batch_space(parts.observation_space, self.num_envs)
        self.action_space = batch_space(parts.action_space, self.num_envs)
        self._text_obs = isinstance(parts.observation_space, UnicodeText)
        self.episodes: list[Episode] = [parts.new_episode() for _ in range(self.num_envs)]
        self._rngs: list[np.random.Generator | None] = [None] * self.num_envs
        self._streams: list[TaskStream | None] = [None] * self.num_envs
        # Per-sub-env ints live in Python lists: the per-sample loop reads and bumps them, and a numpy
        # scalar read or write costs ~150 ns where a list's costs ~30.
        self._rounds: list[int] = [-1] * self.num_envs
        self._group_ids: list[int] = [i // self.group_size for i in range(self.num_envs)]
        self._done = np.ones(self.num_envs, dtype=bool)  # needs a reset before any step
        self._paused = np.zeros(self.num_envs, dtype=bool)  # left as they are by step() (BranchingMixin.pause)
        self._started = False
        self._last_obs: list[Any] = [None] * self.num_envs
        if num_workers is None and parts.respond_workers is not None:
            num_workers = self.num_envs if parts.respond_workers == "per_env" else int(parts.respond_workers)
        workers = (4 if parts.parallel_respond else 0) if num_workers is None else num_workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gym_llm_respond") if workers > 0 else None

    # ----------------------------------------------------------------------------------- reset
    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None):
        """Reset every sub-env (or those in ``options["reset_mask"]``).

        Options: ``reset_mask`` (bool array ``(N,)``); ``task_id`` (int) or ``task`` (a ``Task``) runs that
        task in every reset sub-env; ``task_ids`` (``N`` ints, or None entries to draw from the stream) runs
        task ``task_ids[i]`` in sub-env ``i`` — one task per sub-env, e.g. to serve a batch of prompts chosen
        elsewhere (the TRL rollout function does). Forced tasks override the group rule: members of a group
        run whatever task they are given.
        """
        options = dict(options) if options is not None else None
        mask = self._reset_mask(options)
        per_env = self._forced_task_ids(options)
        forced = resolve_reset_task(self.parts.tasks, options)
        if per_env is not None and forced is not None:
            raise ValueError("Pass options['task_ids'] (one task per sub-env) or options['task_id'/'task'] "
                             "(one task for all), not both.")
        seeds = self._seeds(seed)
        self._seed_streams(seeds, mask)
        observations: list[Any] = [None] * self.num_envs
        info_list: list[dict[str, Any] | None] = [None] * self.num_envs
        for i in np.flatnonzero(mask):
            task = forced if per_env is None or per_env[i] is None else self.parts.tasks[per_env[i]]
            observations[i], info_list[i] = self._start(i, task)
        self._done[mask] = False
        self._started = True
        if not mask.all():  # partial reset: the other sub-envs keep their current observation
            for i in np.flatnonzero(~mask):
                observations[i] = self._last_obs[i]
        self._last_obs = observations
        return self._batch(observations), batch_infos(info_list, self.num_envs)

    def _reset_mask(self, options: dict[str, Any] | None) -> np.ndarray:
        if options is None or "reset_mask" not in options:
            return np.ones(self.num_envs, dtype=bool)
        mask = options.pop("reset_mask")
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (self.num_envs,):
            raise ValueError(
                f"options['reset_mask'] must be a bool numpy array of shape ({self.num_envs},), got "
                f"{type(mask).__name__} {getattr(mask, 'dtype', '')} {getattr(mask, 'shape', '')}."
            )
        if not mask.any():
            raise ValueError("options['reset_mask'] selects no sub-env; set at least one entry to True.")
        if not self._started and not mask.all():
            raise ValueError("The first reset() must reset every sub-env; drop options['reset_mask'].")
        return mask

    def _forced_task_ids(self, options: dict[str, Any] | None) -> list[int | None] | None:
        """``options["task_ids"]`` (popped) checked: ``N`` entries, each a task index or None."""
        if options is None or "task_ids" not in options:
            return None
        ids = options.pop("task_ids")
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__") or len(ids) != self.num_envs:
            raise ValueError(
                f"options['task_ids'] must be a sequence of {self.num_envs} task indices (one per sub-env; None "
                f"draws from the stream), got {type(ids).__name__} of length {len(ids) if hasattr(ids, '__len__') else '?'}."
            )
        out: list[int | None] = []
        n = len(self.parts.tasks)
        for i, index in enumerate(ids):
            if index is None:
                out.append(None)
                continue
            if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
                raise TypeError(f"options['task_ids'][{i}] must be an int or None, got {type(index).__name__}.")
            if not 0 <= int(index) < n:
                raise ValueError(f"options['task_ids'][{i}] must be in [0, {n}), got {int(index)}.")
            out.append(int(index))
        return out

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset(seed=list) needs {self.num_envs} seeds (one per sub-env), got {len(seeds)}.")
        return seeds

    def _seed_streams(self, seeds: list[int | None], mask: np.ndarray) -> None:
        """Seed sub-env RNGs and give each group's members identical task streams (the leader's)."""
        task_seeds: dict[int, int] = {}
        for i in range(self.num_envs):
            if not mask[i]:
                continue
            if seeds[i] is not None or self._rngs[i] is None:
                self._rngs[i], _ = seeding.np_random(seeds[i])
                task_seeds[i] = int(self._rngs[i].integers(TASK_SEED_BOUND))
        n = len(self.parts.tasks)
        for i, task_seed in task_seeds.items():
            leader = 0 if self.task_assignment == "partition" else (i // self.group_size) * self.group_size
            seed_of_group = task_seeds.get(leader)
            if seed_of_group is None:  # the leader was not reseeded: follow its existing stream
                seed_of_group = self._streams[leader].seed if self._streams[leader] else task_seed
            self._streams[i] = TaskStream(n, seed_of_group, self.parts.task_order)
            self._rounds[i] = -1

    def _start(self, i: int, forced) -> tuple[Any, dict[str, Any]]:
        round_ = self._rounds[i] + 1
        self._rounds[i] = round_
        position = round_
        if self.task_assignment == "partition":  # groups split each round of the shared stream
            position = round_ * self.num_groups + self._group_ids[i]
        task = forced if forced is not None else self.parts.tasks[self._streams[i].task_index(position)]
        observation, info = self.episodes[i].start(task)
        info["task_id"] = task.task_id
        info["group_id"] = self._group_ids[i]
        info["round"] = round_
        return observation, info

    # ------------------------------------------------------------------------------------ step
    def step(self, actions: Any):
        if not self._started:
            raise ResetNeeded("step() was called before reset(); call envs.reset(seed=...) first.")
        per_env = self._split_actions(actions)
        live = ~self._done
        if self.autoreset_mode == AutoresetMode.DISABLED and not (live | self._paused).all():  # paused: left as is
            raise ResetNeeded(
                f"Sub-envs {np.flatnonzero(~live & ~self._paused).tolist()} have ended and autoreset is disabled; "
                "reset them with envs.reset(options={'reset_mask': mask}) (or pause them: envs.pause([...])).")
        live_ids = (live & ~self._paused).nonzero()[0].tolist()
        episodes = self.episodes
        checked: list[Any] = [None] * self.num_envs
        for i in live_ids:  # validate every action before any sub-env changes
            try:
                checked[i] = episodes[i].check_action(per_env[i])
            except (TypeError, ValueError) as e:
                raise type(e)(f"{self.where(i)}: {e}") from e
        responses: list[Any] = [None] * self.num_envs

        def respond(i: int) -> Any:
            try:
                return episodes[i].respond(checked[i])
            except Exception as e:  # a verifier or tool raised: say where (no sub-env has changed yet)
                add_note(e, f"raised while responding to {self.where(i)}; no sub-env changed")
                raise

        if self._pool is not None and len(live_ids) > 1:
            for i, response in zip(live_ids, self._pool.map(respond, live_ids)):
                responses[i] = response
        else:
            for i in live_ids:
                responses[i] = respond(i)
        return self._advance(checked, responses, live.tolist())

    def where(self, i: int) -> str:
        """``"sub-env i (task t, group g)"``: which sub-env an error is about."""
        try:
            task = self.episodes[i].task.task_id
        except AttributeError:
            task = "?"
        return f"sub-env {i} (task {task}, group {self._group_ids[i]})"

    def _advance(self, checked: list[Any], responses: list[Any], live: list[bool]):
        # Per-sample results go to Python lists, converted to arrays once: cheaper than numpy item writes.
        N = self.num_envs
        rewards, terminated, truncated = [0.0] * N, [False] * N, [False] * N
        observations: list[Any] = [None] * N
        info_list: list[dict[str, Any] | None] = [None] * N
        same_step = self.autoreset_mode == AutoresetMode.SAME_STEP
        group_ids, rounds = self._group_ids, self._rounds
        paused = self._paused.tolist()
        for i, episode in enumerate(self.episodes):
            if paused[i]:  # left as it is: the last observation again, reward 0, an empty info
                observations[i] = self._last_obs[i]
                continue
            if not live[i]:  # NEXT_STEP: this step resets the sub-env that ended last step
                observations[i], info_list[i] = self._start(i, None)
                self._done[i] = False
                continue
            t = episode.advance(checked[i], responses[i])
            info = t.info
            info["task_id"] = episode.task.task_id
            info["group_id"] = group_ids[i]
            info["round"] = rounds[i]
            rewards[i], terminated[i], truncated[i] = t.reward, t.terminated, t.truncated
            observations[i] = t.observation
            if t.terminated or t.truncated:
                if same_step:
                    observations[i], reset_info = self._start(i, None)
                    info = {"final_obs": t.observation, "final_info": info, **reset_info}
                else:
                    self._done[i] = True
            info_list[i] = info
        self._last_obs = observations
        # fromiter converts element by element, exactly as writing each item into an array would.
        return (self._batch(observations), np.fromiter(rewards, np.float64, N), np.fromiter(terminated, np.bool_, N),
                np.fromiter(truncated, np.bool_, N), batch_infos(info_list, N))

    def _scalar_constructor(self) -> tuple[type, tuple | None]:
        """The scalar env class whose native vector env this is, and the constructor record a fork of a sub-env
        pickles as (this env's arguments less the vector ones); ``(LLMEnv, None)`` when no class declares it."""
        def subclasses(cls: type):
            for sub in cls.__subclasses__():
                yield sub
                yield from subclasses(sub)

        base = LLMVectorEnv.SCALAR_BASE
        assert base is not None, "gym_llm.core.env sets LLMVectorEnv.SCALAR_BASE when it is imported"
        scalar = next((cls for cls in subclasses(base) if cls.__dict__.get("Vector") is type(self)), None)
        recorded = self.__dict__.get("_constructor")
        if scalar is None or recorded is None or recorded[0] is not type(self):
            return scalar or base, None
        kwargs = {key: value for key, value in recorded[2].items() if key not in VECTOR_ARGUMENTS}
        return scalar, (scalar, (), kwargs)

    def _split_actions(self, actions: Any) -> list[Any]:
        """Per-sub-env actions from a batch: a sequence of N actions, or a dict of (N, ...) arrays."""
        if isinstance(actions, dict):
            try:
                return [{k: v[i] for k, v in actions.items()} for i in range(self.num_envs)]
            except (IndexError, TypeError) as e:
                raise ValueError(
                    f"A dict of batched actions needs arrays with a leading dimension of {self.num_envs}: {e}"
                ) from e
        if isinstance(actions, str) or not hasattr(actions, "__len__"):
            raise TypeError(
                f"Vector step() expects {self.num_envs} actions (a tuple/list, one per sub-env), got "
                f"{type(actions).__name__}."
            )
        if len(actions) != self.num_envs:
            raise ValueError(f"Vector step() expects {self.num_envs} actions, got {len(actions)}.")
        return list(actions)

    def _batch(self, observations: list[Any]):
        if self._text_obs:
            return tuple(observations)
        return {key: np.stack([o[key] for o in observations]) for key in observations[0]}

    # ---------------------------------------------------------------------------------- others
    def render(self) -> tuple[str, ...] | None:
        if self.render_mode != "ansi":
            return None
        return tuple(episode.render() for episode in self.episodes)

    def __enter__(self) -> "LLMVectorEnv":
        """``with gym.make_vec(...) as envs:`` closes the env (its tools, sandboxes, pools) at the end, like a scalar
        Gymnasium env."""
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.close()
        return False

    def close_extras(self, **kwargs: Any) -> None:
        # getattr: a constructor that raised (bad arguments) leaves a half-built env that Gymnasium's __del__ closes
        for episode in getattr(self, "episodes", ()):
            episode.close()
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        users = self.__dict__.get("_parts_users")
        if users is not None:  # forks (fork()) share the parts: the last one closes them
            users[0] -= 1
        if getattr(self, "parts", None) is not None and (users is None or users[0] <= 0):
            self.parts.close()
