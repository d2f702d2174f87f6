"""Replay a rollout file through fresh envs and check that every episode reproduces exactly (docs/replay.md).

A rollout file written through the collector holds, besides its episodes, the recipe of every env that ran them
(:class:`~gym_llm_adapters.env_spec.RecordedEnvSpec`: env id, constructor arguments, versions). :func:`replay` makes
each env again with ``gym.make(env_id, **recorded_arguments)`` — a fresh scalar env — and, per episode, resets it on
the recorded task (``options={"task_id": ...}``: the task is all an episode's randomness) and feeds it the recorded
actions: the sampled ids in tokens mode, the sampled text (clipped as the collector clipped it) in text mode.

**What is compared, bit for bit**, at every step ``k`` of an episode, in this order:

1. the observation step ``k`` conditioned on: its token ids (tokens mode), or its text and then the ids the
   collector's tokenizer encodes it to (text mode);
2. after feeding the action: the reward (as float64 bits), ``terminated`` and ``truncated``; when one of them
   differs, the step's info values that differ are listed too;
3. after the last step of a trajectory record: the whole sequence rebuilt from the replayed observations with the
   collector's own :class:`~gym_llm_adapters.episodes.EpisodeBuilder` — ``token_ids``, ``policy_mask``, ``logprobs``
   placement, ``prompt_length``, ``token_exact``, ``turn_tokens`` — and, in tokens mode, the env's own
   ``info["policy_mask"]``.

The first step where anything differs ends that episode's replay: the report names the step, every differing field
with the recorded and replayed values, and the likely cause (a changed scorer when only the reward differs, changed
data when the opening observation differs, a changed tokenizer, a different package version). Step-mode files
(:class:`~gym_llm_adapters.types.StepRecord`\\ s) are grouped back into episodes and compared the same way, without
step 3.

**A file is not trusted by default.** Before an env is made, its recorded arguments are checked against the allow-list
of :mod:`gym_llm_adapters.trust`: a file that names code to import (a recorded reward function), switches a sandbox
off or loosens it, or widens what an env reaches is refused (:class:`~gym_llm_adapters.trust.UntrustedFileError`,
naming each argument, its value and the opt-in) unless the caller passes ``trust_file=True`` (CLI: ``--trust-file``).
Arguments given with ``env_kwargs=`` are the caller's own, and replace the recorded ones unchecked.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Mapping

import numpy as np

from gym_llm_adapters.env_spec import COLLECTOR_TOKENIZER, RecordedEnvSpec, decode_kwargs, tokenizer_fingerprint
from gym_llm_adapters.episodes import EpisodeBuilder, scalar_info
from gym_llm_adapters.replay_report import (Difference, EpisodeReplay, Mismatch, ReplayReport, array_difference,
                                            scalar_difference, text_difference)
from gym_llm_adapters.rollout_io import iter_rollouts
from gym_llm_adapters.trust import UntrustedFileError, check_env_arguments, refuse
from gym_llm_adapters.types import Completion, StepRecord, Trajectory

__all__ = ["ReplayError", "UntrustedFileError", "count_episodes", "replay"]

logger = logging.getLogger(__name__)

_LAYOUT_INFO = frozenset({"round", "group_id"})
"""Info keys that say where an episode ran in its vector env, not what happened in it: never compared."""

HOW_TO_RECORD = ("record one by collecting through the collector with a writer — Collector(envs, engine, sampling, "
                 "writer=RolloutWriter(path)), as `gym-llm eval --out` and `gym-llm train` do — from an env made with "
                 "gym.make_vec(env_id, ...); then replay that file")


class ReplayError(ValueError):
    """The file cannot be replayed at all (missing, no episodes, no env spec); the message says the fix."""


@dataclass
class _Episode:
    index: int
    steps: list[StepRecord]
    trajectory: Trajectory | None
    complete: bool = True


def replay(path: str | Path, *, limit: int | None = None, env_kwargs: Mapping[str, Any] | None = None,
           tokenizer: Any = None, format: Literal["jsonl", "parquet"] | None = None,
           on_episode: Callable[[EpisodeReplay], None] | None = None, trust_file: bool = False) -> ReplayReport:
    """Replay the episodes of a rollout file and compare them with the record (module docstring).

    Args:
        path: a rollout file written through the collector (``.jsonl``, or a ``.parquet`` folder).
        limit: replay only the first ``limit`` episodes.
        env_kwargs: constructor arguments that replace the recorded ones, for every env in the file: the arguments
            that could not be recorded (a lambda ``reward_fn``), a different data path, or your own values for
            arguments the file may not set (they are yours, so they are not checked).
        tokenizer: replaces every recorded tokenizer (the env's and the collector's); default: each is loaded again
            from the folder it was recorded from.
        format: ``"jsonl"`` or ``"parquet"``; default from ``path``.
        on_episode: called with each episode's result as it is ready (a progress bar).
        trust_file: make the envs from every recorded argument as it is, like the code that wrote the file: import
            the functions it names, and take sandbox, network and path settings from it. Only for a file you trust
            as you would its author's code. Default: such arguments are refused (module docstring).

    Returns:
        a :class:`~gym_llm_adapters.replay_report.ReplayReport`; ``report.exact`` is True when every episode
        reproduced exactly.

    Raises:
        ReplayError: no such file, no episodes in it, or no env spec for any of them (saying how to record one).
        UntrustedFileError: without ``trust_file``, an env spec sets what a file may not set on its own (each
            argument, its value, and how to opt in or give your own value); nothing of that env was imported or made.
    """
    path = Path(path)
    if not path.exists():
        raise ReplayError(f"{path}: no such rollout file; give a .jsonl file or a .parquet folder written by the "
                          "collector's RolloutWriter")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}.")
    specs: dict[str, RecordedEnvSpec] = {}
    envs: dict[str, _ReplayEnv] = {}
    loaded_tokenizers: dict[str, Any] = {}
    results: list[EpisodeReplay] = []
    unchecked: dict[str, int] = {}
    try:
        with contextlib.closing(_read_episodes(path, format, specs)) as episodes:
            for episode in episodes:
                if limit is not None and len(results) >= limit:
                    break
                spec = specs.get(episode.steps[0].spec_id)
                if spec is not None and spec.spec_id not in envs:
                    envs[spec.spec_id] = _ReplayEnv(spec, dict(env_kwargs or {}), tokenizer, loaded_tokenizers,
                                                    trusted=trust_file, path=path)
                result = _replay_episode(episode, envs.get(spec.spec_id) if spec is not None else None)
                for score in (episode.trajectory.scores if episode.trajectory is not None else ()):
                    unchecked[score["source"]] = unchecked.get(score["source"], 0) + 1
                results.append(result)
                if on_episode is not None:
                    on_episode(result)
    finally:
        for env in envs.values():
            env.close()
    if not results:
        raise ReplayError(f"{path} holds no complete record to replay (no trajectory or step records)")
    if not specs:
        raise ReplayError(f"{path} holds no env spec, so its episodes cannot be replayed (it was written before "
                          f"rollout files recorded their env, or by hand); {HOW_TO_RECORD}")
    import gymnasium

    import gym_llm

    return ReplayReport(str(path), tuple(results), unchecked_scores=unchecked,
                        installed={"gym_llm": gym_llm.__version__, "gymnasium": gymnasium.__version__},
                        specs={i: {"env_id": s.env_id, "gym_llm_version": s.gym_llm_version,
                                   "gymnasium_version": s.gymnasium_version, "mode": s.mode} for i, s in specs.items()})


def count_episodes(path: str | Path, *, format: Literal["jsonl", "parquet"] | None = None) -> int | None:
    """How many trajectory records ``path`` holds, counted without parsing them (for a progress bar's total); None for
    a file of step records (their episodes are only known once grouped)."""
    from gym_llm_adapters.rollout_io import _format_of

    path = Path(path)
    if _format_of(path, format) == "jsonl":
        with open(path, "rb") as f:
            trajectories = sum(line.startswith(b'{"kind":"trajectory"') for line in f)
        return trajectories or None
    import pyarrow.parquet as pq

    total = 0
    for part in sorted(path.glob("part-*.parquet")):
        kinds = pq.read_table(part, columns=["kind"]).column("kind").to_pylist()
        total += sum(k == "trajectory" for k in kinds)
    return total or None


# ------------------------------------------------------------------------------------------------ reading
def _read_episodes(path: Path, format: str | None, specs: dict[str, RecordedEnvSpec]) -> Iterator[_Episode]:
    """The file's episodes in the order they end there; step records are grouped per sub-env (a steps-mode file), and
    an episode the file holds only the start of comes last, marked incomplete. Specs are collected into ``specs``."""
    open_steps: dict[tuple[str, str, int], list[StepRecord]] = {}
    index = 0
    for item in iter_rollouts(path, format=format, specs=True):
        if isinstance(item, RecordedEnvSpec):
            specs.setdefault(item.spec_id, item)
        elif isinstance(item, Trajectory):
            if item.steps:
                yield _Episode(index, list(item.steps), item)
                index += 1
        else:
            key = (item.spec_id, item.env_id, item.env_index)
            steps = open_steps.get(key)
            if steps is not None and item.turn == 1:  # the sub-env restarted: its unfinished episode ends here
                yield _Episode(index, open_steps.pop(key), None, complete=False)
                index += 1
            open_steps.setdefault(key, []).append(item)
            if item.terminated or item.truncated:
                yield _Episode(index, open_steps.pop(key), None)
                index += 1
    for steps in open_steps.values():
        yield _Episode(index, steps, None, complete=False)
        index += 1


# ------------------------------------------------------------------------------------------------ the env
class _ReplayEnv:
    """A fresh scalar env made from a recorded spec, and how to read and feed it like the collector did."""

    def __init__(self, spec: RecordedEnvSpec, overrides: dict[str, Any], tokenizer: Any, loaded: dict[str, Any], *,
                 trusted: bool, path: Path):
        self.spec = spec
        self.trusted, self.path = trusted, path
        self.env: Any = None
        self.error = ""
        self.notes: list[str] = []
        self.tokenizer: Any = None  # the collector's (text mode: it encoded the observations)
        self._override, self._loaded = tokenizer, loaded
        try:
            self._build(overrides)
        except _CannotReplay as e:
            self.error = str(e)
        self._version_notes()

    def _build(self, overrides: dict[str, Any]) -> None:
        import gymnasium as gym

        import gym_llm  # noqa: F401  (registers the ids)

        spec = self.spec
        if not spec.env_id or spec.env_id not in gym.registry:
            raise _CannotReplay(spec.unreplayable.get("env") or f"env id {spec.env_id!r} is not registered here")
        recorded = {k: v for k, v in spec.env_kwargs.items() if k not in overrides}  # the file's, not the caller's
        if not self.trusted:
            refuse(check_env_arguments(spec.env_id, recorded),
                   source=f"rollout file {self.path}, env spec {spec.spec_id} ({spec.env_id})",
                   opt_in="if you trust this file as you would its author's code, replay it with --trust-file "
                          "(Python: replay(path, trust_file=True)); or give your own value of each argument with "
                          "--env-arg KEY=VALUE (env_kwargs={...})")
        if self._override is not None and "tokenizer" in spec.unreplayable:  # an in-memory tokenizer, given again
            overrides = {"tokenizer": self._override, **overrides}
        missing = {k: v for k, v in spec.unreplayable.items() if k not in overrides
                   and not (k == COLLECTOR_TOKENIZER and self._override is not None)}
        if missing:
            named = "; ".join(f"{k}: {v}" for k, v in missing.items())
            raise _CannotReplay(f"{spec.env_id} was made with arguments the file could not record ({named}); pass "
                                f"them to replay(env_kwargs={{...}})")
        kwargs = {**decode_kwargs(recorded, tokenizer=self._tokenizer, import_callables=self.trusted), **overrides}
        try:
            self.env = gym.make(spec.env_id, disable_env_checker=True, **kwargs)
        except Exception as e:  # a missing data file, a changed signature, a missing extra
            raise _CannotReplay(f"{spec.env_id} cannot be made from its recorded arguments ({type(e).__name__}: "
                                f"{e}); pass replacements with env_kwargs= (CLI: --env-arg)") from e
        logger.debug("replaying %s episodes in %s made from spec %s", spec.mode, spec.env_id, spec.spec_id)
        space = self.env.observation_space
        mode = "tokens" if hasattr(space, "spaces") and "input_ids" in space.spaces else "text"
        if mode != spec.mode:
            raise _CannotReplay(f"{spec.env_id} was recorded in {spec.mode} mode, but the env made from the record is "
                                f"in {mode} mode")
        if mode == "text":
            if spec.tokenizer is None and self._override is None:
                raise _CannotReplay("text-mode observations were encoded with the collector's tokenizer, which the "
                                    "file does not name; pass tokenizer= (CLI: --tokenizer)")
            self.tokenizer = self._tokenizer(spec.tokenizer) if spec.tokenizer is not None else self._override
        if spec.wrappers:
            self.notes.append(f"it was recorded through {', '.join(spec.wrappers)}, which the replay leaves out")

    def _tokenizer(self, payload: dict[str, Any]) -> Any:
        """A recorded tokenizer: the one given to the replay, or loaded again from its folder."""
        tokenizer = self._override
        name = payload.get("name_or_path", "")
        if tokenizer is None:
            tokenizer = self._loaded.get(name)
        if tokenizer is None:
            try:
                from transformers import AutoTokenizer
            except ImportError as e:
                raise _CannotReplay("loading the recorded tokenizer needs transformers: "
                                    "pip install 'gym-llm[hf]'") from e
            try:
                # a recorded folder is data: its tokenizer files are read, no code in it runs
                tokenizer = self._loaded[name] = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
            except Exception as e:
                raise _CannotReplay(f"the recorded tokenizer {name!r} cannot be loaded here ({type(e).__name__}: {e}); "
                                    "pass tokenizer= (CLI: --tokenizer FOLDER or an embedded model name)") from e
        now = tokenizer_fingerprint(tokenizer)
        if payload.get("fingerprint") is not None and now != payload["fingerprint"]:
            note = (f"the tokenizer encodes differently from the recorded one ({name}: fingerprint "
                    f"{payload.get('fingerprint')} recorded, {now} now)")
            if note not in self.notes:
                self.notes.append(note)
        return tokenizer

    def _version_notes(self) -> None:
        import gymnasium

        import gym_llm

        for package, recorded, installed in (("gym_llm", self.spec.gym_llm_version, gym_llm.__version__),
                                             ("gymnasium", self.spec.gymnasium_version, gymnasium.__version__)):
            if recorded != installed:
                self.notes.append(f"the package version differs: recorded with {package} {recorded}, replayed with "
                                  f"{installed}")

    def observe(self, observation: Any) -> tuple[np.ndarray, str | None]:
        """``(ids, text)`` of an observation as the collector read it (tokens mode: ``text`` is None)."""
        if self.spec.mode == "tokens":
            from gym_llm.core.spaces import unpack_tokens

            return unpack_tokens(observation).astype(np.int64, copy=False), None
        text = str(observation)
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int64), text

    def action(self, step: StepRecord) -> Any:
        """The action the collector fed for ``step``: its ids right-padded to the env's action length, or its text
        clipped to the recorded action length."""
        if self.spec.mode == "text":
            return step.completion_text[: self.spec.action_length]
        ids = np.asarray(step.completion_ids, dtype=np.int64)
        length = max(int(self.env.action_space["input_ids"].shape[0]), len(ids))  # too long: the env says so
        input_ids, attention = np.zeros(length, dtype=np.int64), np.zeros(length, dtype=np.int8)
        input_ids[: len(ids)], attention[: len(ids)] = ids, 1
        return {"input_ids": input_ids, "attention_mask": attention}

    def check_action(self, action: Any) -> None:
        """Raise as ``step`` would for an action the env refuses (gym_llm envs check it first and change nothing)."""
        episode = getattr(self.env.unwrapped, "episode", None)
        if episode is not None:
            episode.check_action(action)

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None


class _CannotReplay(Exception):
    pass


# ------------------------------------------------------------------------------------------------ one episode
def _replay_episode(episode: _Episode, renv: _ReplayEnv | None) -> EpisodeReplay:
    first = episode.steps[0]
    base = dict(index=episode.index, env_id=first.env_id, spec_id=first.spec_id, task_id=first.task_id,
                group_id=first.group_id, round=first.round, env_index=first.env_index, steps=len(episode.steps),
                complete=episode.complete)
    if renv is None:
        reason = ("its records name no env spec (written before rollout files recorded one)" if not first.spec_id
                  else f"its env spec {first.spec_id} is not in the file")
        return EpisodeReplay(**base, skipped=reason)
    if renv.error:
        return EpisodeReplay(**base, skipped=renv.error)
    if first.turn != 1:
        return EpisodeReplay(**base, skipped=f"its first {first.turn - 1} step(s) are not in the file")
    mismatch, replayed = _replay_steps(episode, renv)
    return EpisodeReplay(**base, replayed_steps=replayed, mismatch=mismatch)


def _replay_steps(episode: _Episode, renv: _ReplayEnv) -> tuple[Mismatch | None, int]:
    """Feed the recorded actions; the first step that differs (or None) and how many steps were fed."""
    env, steps = renv.env, episode.steps
    try:
        observation, info = env.reset(options={"task_id": int(steps[0].task_id)})
    except (ValueError, TypeError, IndexError) as e:  # the task id is not in the source any more
        return _mismatch(renv, 0, [Difference("task", int(steps[0].task_id), f"{type(e).__name__}: {e}")]), 0
    except Exception as e:  # a tool or server the episode starts with failed
        return _mismatch(renv, 0, [Difference("reset", "ran", f"{type(e).__name__}: {e}")]), 0
    builder: EpisodeBuilder | None = None
    for k, step in enumerate(steps):
        ids, text = renv.observe(observation)
        differences = _observation_differences(step, ids, text)
        if differences:
            return _mismatch(renv, k, differences), k
        if builder is None:
            builder = EpisodeBuilder(step.env_index, step.task_id, step.group_id, step.round, ids, step.env_id,
                                     step.spec_id)
            if episode.trajectory is not None:  # a tree rollout's shared turns are context (Trajectory.shared_turns)
                builder.shared_turns = int(episode.trajectory.shared_turns)
        else:
            builder.observe(ids)
        action = renv.action(step)
        try:
            renv.check_action(action)
        except (ValueError, TypeError) as e:
            return _mismatch(renv, k, [Difference("action", "accepted", f"{type(e).__name__}: {e}")]), k
        try:
            observation, reward, terminated, truncated, info = env.step(action)
        except Exception as e:  # the env (its scorer, a tool, its follow-ups) raised
            return _mismatch(renv, k, [Difference("step", "ran", f"{type(e).__name__}: {e}")]), k
        differences = [d for d in (scalar_difference("reward", float(step.reward), float(reward)),
                                   scalar_difference("terminated", bool(step.terminated), bool(terminated)),
                                   scalar_difference("truncated", bool(step.truncated), bool(truncated))) if d]
        if differences:
            mismatch = _mismatch(renv, k, differences + _info_differences(step.info, info))
            source = str(step.info.get("reward_source", ""))
            if source.startswith("judge:") and mismatch.hint.startswith("changed scorer"):
                mismatch = Mismatch(mismatch.step, mismatch.differences, (
                    f"the reward is an LLM judge's ({source}): a judge's score is a model's output, which its server "
                    "may change between runs (batching, version, sampling); replay re-asks the judge you pass as "
                    "reward_fn, and only a judge with a cache holding these conversations answers the same"))
            return mismatch, k + 1
        completion = Completion(prompt_ids=ids, token_ids=step.completion_ids, logprobs=step.logprobs,
                                text=step.completion_text, finish_reason=step.finish_reason, version=step.version)
        builder.add_step(completion, reward=float(reward), terminated=bool(terminated), truncated=bool(truncated),
                         info=info, prompt_text=text or "")
    if episode.trajectory is not None:
        differences = _sequence_differences(episode.trajectory, builder, renv, observation, info)
        if differences:
            return _mismatch(renv, len(steps) - 1, differences), len(steps)
    return None, len(steps)


def _observation_differences(step: StepRecord, ids: np.ndarray, text: str | None) -> list[Difference]:
    if text is None:
        difference = array_difference("observation", step.prompt_ids, ids)
        return [difference] if difference else []
    difference = text_difference("observation", step.prompt_text, text) or \
        array_difference("prompt_ids", step.prompt_ids, ids)
    return [difference] if difference else []


def _info_differences(recorded: Mapping[str, Any], info: Mapping[str, Any]) -> list[Difference]:
    replayed = scalar_info(info)
    out = []
    for key in sorted((set(recorded) | set(replayed)) - _LAYOUT_INFO):
        difference = scalar_difference(f"info.{key}", recorded.get(key), replayed.get(key))
        if difference:
            out.append(difference)
    return out


def _sequence_differences(trajectory: Trajectory, builder: EpisodeBuilder, renv: _ReplayEnv, observation: Any,
                          info: Mapping[str, Any]) -> list[Difference]:
    """The recorded trajectory against the one rebuilt from the replayed observations (module docstring, step 3)."""
    tokens = renv.spec.mode == "tokens"
    final_ids = renv.observe(observation)[0] if tokens else None
    try:
        rebuilt = builder.finish(final_ids, None)
    except RuntimeError as e:  # the final observation does not extend the sampled sequence
        return [Difference("token_ids", trajectory.token_ids[-16:].tolist(), str(e))]
    differences = [
        array_difference("token_ids", trajectory.token_ids, rebuilt.token_ids),
        array_difference("policy_mask", trajectory.policy_mask, rebuilt.policy_mask),
        array_difference("logprobs", trajectory.logprobs, rebuilt.logprobs),
        scalar_difference("prompt_length", int(trajectory.prompt_length), int(rebuilt.prompt_length)),
        scalar_difference("token_exact", bool(trajectory.token_exact), bool(rebuilt.token_exact)),
    ]
    if trajectory.turn_tokens is not None:
        differences.append(array_difference("turn_tokens", np.asarray(trajectory.turn_tokens, dtype=np.int64),
                                            np.asarray(rebuilt.turn_tokens, dtype=np.int64)))
    env_mask = info.get("policy_mask") if tokens else None
    if env_mask is not None and rebuilt.token_exact:  # the env's own view of which tokens the policy sampled
        theirs = np.asarray(env_mask)[: len(rebuilt.token_ids)].astype(np.int8)
        if builder.shared_turns and len(theirs) == len(rebuilt.token_ids):  # the env saw them sampled; we train none
            theirs[builder.shared_positions()] = 0
        difference = array_difference("policy_mask", trajectory.policy_mask, theirs)
        if difference is not None:
            differences.append(Difference(difference.field, difference.recorded, difference.replayed,
                                          f"{difference.where}, in the env's info['policy_mask']"))
    return [d for d in differences if d is not None]


# ------------------------------------------------------------------------------------------------ hints
def _mismatch(renv: _ReplayEnv, step: int, differences: list[Difference]) -> Mismatch:
    return Mismatch(step, tuple(differences), _hint(step, [d.field for d in differences], renv.notes))


def _hint(step: int, fields: list[str], notes: list[str]) -> str:
    """The likely cause of a mismatch whose differing fields are ``fields`` (the deciding one first)."""
    first, own = fields[0], [f for f in fields if not f.startswith("info.")]
    if first == "task":
        hint = "changed data: the recorded task id is not in the env's task source any more"
    elif first == "observation" and step == 0:
        hint = ("changed data or prompt: the task's opening observation differs (the task source or data file, the "
                "system prompt or prompt template, the chat template or the tokenizer changed)")
    elif first == "observation":
        hint = (f"the env's turn after step {step - 1} differs (changed follow-ups, tool or browser output, the chat "
                "template or the tokenizer)")
    elif first == "prompt_ids":
        hint = "the observation text is the same but encodes to other ids: the collector's tokenizer changed"
    elif own == ["reward"]:
        hint = "changed scorer: the same observation and action now earn a different reward"
    elif "reward" in own:
        hint = "changed scorer or episode rules: the reward and how the episode ends both differ"
    elif first in ("terminated", "truncated"):
        hint = "changed episode end: the same actions end the episode differently (turn or length limits, the scorer)"
    elif first == "action":
        hint = "the env refuses the recorded action: its action space changed (max_action_tokens/chars, vocabulary)"
    elif first == "step":
        hint = "the env raised on the recorded action (its scorer, tool or follow-ups changed, or broke)"
    elif first == "reset":
        hint = "the env raised when starting the recorded task (a tool, sandbox or server it starts with failed)"
    else:
        hint = ("the episode's token sequence differs when rebuilt from the replayed observations (changed "
                "truncation, max_seq_len, or how the env marks sampled tokens)")
    return hint + "".join(f"; note: {n}" for n in notes)
