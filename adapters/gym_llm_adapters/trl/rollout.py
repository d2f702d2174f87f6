"""A ``rollout_func`` for TRL's ``GRPOTrainer`` that runs gym_llm envs (multi-turn, tools) token-exactly.

``GRPOTrainer(..., rollout_func=EnvRolloutFunc("LLMPythonTool-v0", data_files=...), reward_funcs=env_reward)``.

The contract (TRL 1.16, ``GRPOTrainer._generate``): TRL calls ``rollout_func(prompts, trainer)`` with the prompts
of this process's generation batch — each prompt repeated ``num_generations`` times, consecutively — and
expects a dict of per-completion lists in the same order: ``prompt_ids``, ``completion_ids`` and ``logprobs``,
optionally ``env_mask`` (1 on tokens the policy sampled, 0 on tokens it did not: env/tool output; TRL
multiplies it into the loss mask and counts only masked-in tokens as completion length), plus any other field,
which TRL merges into each example and hands to the reward functions as a keyword argument.

What a call does:

1. maps each prompt back to the env task it came from (the prompts of
   :func:`~gym_llm_adapters.trl.dataset.env_dataset`, or rows whose last message is a task's question);
2. resets a native vector env of ``len(prompts)`` sub-envs (tokens mode, the trainer's tokenizer) with
   ``options={"task_ids": [...]}`` — sub-env ``i`` runs prompt ``i``'s task;
3. runs one episode per sub-env with :meth:`Collector.run_episodes <gym_llm_adapters.collector.Collector.run_episodes>`,
   sampling with the trainer's generation (:func:`~gym_llm_adapters.trl.generation.trainer_engine`);
4. returns, per episode (``S`` tokens, ``P`` of them the opening prompt):

| field | value |
|---|---|
| ``prompt_ids`` | ``token_ids[:P]``, the env's opening prompt |
| ``completion_ids`` | ``token_ids[P:]``: sampled turns and the env's tokens between them (tool results, closings) |
| ``logprobs`` | engine log-probs aligned with ``completion_ids``; 0.0 on env tokens (TRL masks them out) |
| ``env_mask`` | ``policy_mask[P:]``: 1 on sampled tokens, 0 on env tokens |
| ``env_reward`` | the episode's return (sum of the env's step rewards); None when it could not be computed (a judge's failure: ``Trajectory.reward_failed``); score with :func:`~gym_llm_adapters.trl.rewards.env_reward` |
| ``num_turns`` | assistant turns taken |

``prompt_ids + completion_ids`` is exactly the env's final token sequence (the collector checks it).
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Sequence

from gym_llm_adapters.collector import Collector
from gym_llm_adapters.engines.base import SamplingConfig
from gym_llm_adapters.rollout_io import RolloutWriter
from gym_llm_adapters.trl.dataset import chat_common, prompt_messages
from gym_llm_adapters.trl.generation import sampling_from_trainer, trainer_engine, trainer_tokenizer
from gym_llm_adapters.types import Trajectory

__all__ = ["EnvRolloutFunc", "PromptIndex", "trl_fields"]

logger = logging.getLogger(__name__)

_RESERVED = ("mode", "tokenizer", "vocab_size", "max_action_tokens", "max_seq_len", "num_envs", "group_size",
             "vectorization_mode", "autoreset_mode", "record_messages")
_DEFAULT_MAX_SEQ_LEN = 8192


def _prompt_key(prompt: Any) -> tuple[tuple[str, str], ...] | str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence) and all(isinstance(m, dict) and "role" in m for m in prompt):
        if not all(isinstance(m.get("content"), str) for m in prompt):
            raise TypeError("EnvRolloutFunc supports text-only prompts; this prompt has non-text (multimodal) content.")
        return tuple((m["role"], m["content"]) for m in prompt)
    raise TypeError(f"A prompt must be a str or a list of {{'role', 'content'}} messages, got {type(prompt).__name__}.")


class PromptIndex:
    """Maps TRL prompts back to env task ids.

    A conversational prompt matches a task whose opening conversation (the env's system prompt, then the task's
    messages) it equals; otherwise — and for plain-text prompts — its last message's text must equal one task's
    question (:attr:`Task.prompt <gym_llm.core.tasks.Task.prompt>`). Tasks with identical prompts map to the
    first of them.
    """

    def __init__(self, chat: Any, tasks: Sequence[Any]):
        self._by_messages: dict[Any, int] = {}
        self._by_question: dict[str, int] = {}
        duplicates = 0
        for task in tasks:
            key = _prompt_key(prompt_messages(chat, task))
            if key in self._by_messages:
                duplicates += 1
                continue
            self._by_messages[key] = int(task.task_id)
            self._by_question.setdefault(task.prompt, int(task.task_id))
        if duplicates:
            logger.warning("%d tasks repeat another task's prompt; such prompts run the first of those tasks.", duplicates)

    def __len__(self) -> int:
        return len(self._by_messages)

    def task_id(self, prompt: Any) -> int:
        """The task id of one prompt; ``ValueError`` when no task has it."""
        key = _prompt_key(prompt)
        found = self._by_messages.get(key) if not isinstance(key, str) else None
        if found is None:
            question = key if isinstance(key, str) else (key[-1][1] if key else "")
            found = self._by_question.get(question)
        if found is None:
            raise ValueError(
                f"This prompt is not one of the env's {len(self)} tasks: {prompt!r:.200}. EnvRolloutFunc runs the env's "
                "own tasks: build the train dataset with gym_llm_adapters.trl.env_dataset(env_id, **env_kwargs) using "
                "the same env arguments (data_files=, source=, system_prompt=, ...) as the rollout function."
            )
        return found


def trl_fields(trajectories: Sequence[Trajectory]) -> dict[str, list[Any]]:
    """The fields TRL's ``rollout_func`` contract asks for, one entry per trajectory (see the module docstring)."""
    out: dict[str, list[Any]] = {k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "env_reward",
                                                 "num_turns")}
    for t in trajectories:
        if not t.token_exact or t.prompt_length < 1:
            raise RuntimeError(f"Sub-env {t.env_index}'s trajectory is not token-exact; EnvRolloutFunc needs tokens mode.")
        P = t.prompt_length
        out["prompt_ids"].append(t.token_ids[:P].tolist())
        out["completion_ids"].append(t.token_ids[P:].tolist())
        out["logprobs"].append(t.logprobs[P:].tolist())
        out["env_mask"].append(t.policy_mask[P:].astype(int).tolist())
        out["env_reward"].append(None if t.reward_failed else t.reward)
        out["num_turns"].append(len(t.steps))
    return out


class EnvRolloutFunc:
    """TRL ``rollout_func`` running a gym_llm chat env with the trainer's generation (see the module docstring).

    Args:
        env_id: a gym_llm chat env id; ``**env_kwargs`` its arguments (``data_files=``, ``max_turns=``,
            ``sandbox=``, ...) — the same as the dataset's, so prompts map to the same tasks. The rollout function
            sets the tokens-mode arguments itself (``mode``, ``tokenizer``, ``vocab_size``, ``max_action_tokens``,
            ``max_seq_len``, ``record_messages``); ``template_kwargs`` defaults to the trainer's
            ``chat_template_kwargs``.
        max_tokens_per_turn: the most tokens sampled per assistant turn (default: the trainer's
            ``max_completion_length``). A completion (all turns plus the env's tokens) may be longer than that;
            the episode is bounded by the env's ``max_turns`` and ``max_seq_len``.
        max_seq_len: the env's token budget per episode, prompt included (default: the model's
            ``max_position_embeddings`` — or ``vllm_max_model_length`` when set — capped at 8192). An episode that
            outgrows it is truncated.
        seed: ``"trainer"`` (default): sampling seeds derive from ``args.seed``, the call count and the process
            index, so runs are reproducible; an int: the same from that seed; None: unseeded sampling (vLLM on GPU
            is a little faster without per-request seeds).
        writer: a :class:`~gym_llm_adapters.rollout_io.RolloutWriter`; every call's trajectories are appended.
            Export them for SFT with :func:`~gym_llm_adapters.trl.sft.sft_dataset`. In a multi-process run each
            process needs its own file (two writers on one file interleave their batches and headers): the first
            call refuses a file another process of the run also writes (``ValueError``, with the fix).

    Attributes:
        last_trajectories: the last call's trajectories (``group_id`` = the TRL group within the call, ``round``
            = the call number).
        calls: how many calls ran.
    """

    def __init__(self, env_id: str, *, max_tokens_per_turn: int | None = None, max_seq_len: int | None = None,
                 seed: int | None | Literal["trainer"] = "trainer", writer: RolloutWriter | None = None,
                 **env_kwargs: Any):
        clash = sorted(set(env_kwargs) & set(_RESERVED))
        if clash:
            raise ValueError(
                f"EnvRolloutFunc sets {clash} itself (tokens mode with the trainer's tokenizer, one sub-env per "
                "prompt); drop them from the env arguments (use max_tokens_per_turn= / max_seq_len= instead).")
        if not (seed is None or seed == "trainer" or (isinstance(seed, int) and not isinstance(seed, bool))):
            raise ValueError(f"seed must be 'trainer', an int or None, got {seed!r}.")
        for name, value in (("max_tokens_per_turn", max_tokens_per_turn), ("max_seq_len", max_seq_len)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}.")
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs)
        self.max_tokens_per_turn, self.max_seq_len, self.seed, self.writer = max_tokens_per_turn, max_seq_len, seed, writer
        self.calls = 0
        self.last_trajectories: list[Trajectory] = []
        self._envs: dict[int, Any] = {}
        self._index: PromptIndex | None = None
        self._engines: dict[Any, Any] = {}
        self._writer_checked = False

    # ---------------------------------------------------------------------------------- TRL
    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        """TRL's entry point: one episode per prompt with the trainer's generation; TRL's output fields."""
        args = trainer.args
        if self.writer is not None and not self._writer_checked:
            _refuse_shared_writer(self.writer, trainer.accelerator)
            self._writer_checked = True
        sampling = sampling_from_trainer(args, self.max_tokens_per_turn)
        group_size = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        base = args.seed if self.seed == "trainer" else self.seed
        seed = None if base is None else base + 1_000_003 * self.calls + 7_919 * trainer.accelerator.process_index
        tokenizer = trainer_tokenizer(trainer)
        env_options: dict[str, Any] = {"vocab_size": max(_model_vocab(trainer.model), len(tokenizer)),
                                       "max_seq_len": self.max_seq_len or _default_max_seq_len(trainer)}
        if args.chat_template_kwargs and "template_kwargs" not in self.env_kwargs:
            env_options["template_kwargs"] = dict(args.chat_template_kwargs)
        with trainer_engine(trainer, self._engines) as engine:
            trajectories = self.rollout(prompts, engine, sampling, group_size=group_size, seed=seed, **env_options)
        return trl_fields(trajectories)

    # ------------------------------------------------------------------------------- engine
    def rollout(self, prompts: Sequence[Any], engine: Any, sampling: SamplingConfig, *, group_size: int | None = None,
                seed: int | None = 0, **env_options: Any) -> list[Trajectory]:
        """Run one episode per prompt with ``engine``; the trajectories in prompt order.

        ``group_size``: TRL's ``num_generations``; consecutive equal prompts (at most ``group_size`` of them) get
        one ``group_id``. ``env_options`` (``vocab_size``, ``max_seq_len``, ``template_kwargs``) are used when the
        env for ``len(prompts)`` sub-envs is first built.
        """
        if not prompts:
            return []
        envs = self._env(len(prompts), engine.tokenizer, sampling.max_tokens, env_options)
        task_ids = [self._index.task_id(p) for p in prompts]
        collector = Collector(envs, engine, sampling, steps_per_batch=1, seed=seed, tokenizer=engine.tokenizer,
                              record_prompt_text=False)
        try:
            trajectories = collector.run_episodes(seed=seed, options={"task_ids": task_ids})
        finally:
            collector.close()
        _assign_groups(trajectories, prompts, group_size or len(prompts), self.calls)
        if self.writer is not None:
            self.writer.write(trajectories)
        self.calls += 1
        self.last_trajectories = trajectories
        logger.debug("rollout %d: %d episodes, mean return %.3f", self.calls, len(trajectories),
                     sum(t.reward for t in trajectories if not t.reward_failed) / max(1, sum(
                         not t.reward_failed for t in trajectories)))
        return trajectories

    def _env(self, num_envs: int, tokenizer: Any, max_tokens: int, env_options: dict[str, Any]) -> Any:
        env = self._envs.get(num_envs)
        if env is None:
            import gymnasium as gym

            import gym_llm  # noqa: F401  (registers the ids)

            kwargs = {**{k: v for k, v in env_options.items() if v is not None}, **self.env_kwargs}
            env = gym.make_vec(self.env_id, num_envs=num_envs, group_size=1, vectorization_mode="vector_entry_point",
                               mode="tokens", tokenizer=tokenizer, max_action_tokens=max_tokens, record_messages=True,
                               **kwargs)
            try:
                chat = chat_common(env)
            except TypeError:
                env.close()
                raise
            self._envs[num_envs] = env
            if self._index is None:
                self._index = PromptIndex(chat, env.unwrapped.parts.tasks)
        return env

    def close(self) -> None:
        """Close the envs (tool sandboxes, scorer pools). The trainer's engines stay the trainer's."""
        envs, self._envs = self._envs, {}
        for env in envs.values():
            env.close()

    def __enter__(self) -> "EnvRolloutFunc":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _assign_groups(trajectories: list[Trajectory], prompts: Sequence[Any], group_size: int, round_: int) -> None:
    """Renumber ``group_id`` as TRL's groups (runs of at most ``group_size`` equal consecutive prompts) and set
    ``round`` to the call number, so ``(group_id, round)`` identifies a GRPO group across calls."""
    group, count, previous = -1, 0, None
    for trajectory, prompt in zip(trajectories, prompts):
        key = _prompt_key(prompt)
        if key != previous or count == group_size:
            group, count, previous = group + 1, 0, key
        count += 1
        trajectory.group_id, trajectory.round = group, round_
        for step in trajectory.steps:
            step.group_id, step.round = group, round_


def _refuse_shared_writer(writer: RolloutWriter, accelerator: Any) -> None:
    """Raise ``ValueError`` on every process when two processes of the run write one rollout file (same host, same
    resolved path): their writers would interleave batches under one header and break each other's commit lines.
    A collective (``gather_object``): every process must call it, as every process calls the rollout function."""
    if accelerator.num_processes < 2:
        return
    import socket
    from pathlib import Path

    from accelerate.utils import gather_object

    mine = (socket.gethostname(), str(Path(writer.path).resolve()))
    everyone = gather_object([mine])  # one entry per process, in process order
    shared = [rank for rank, where in enumerate(everyone) if where[1] == mine[1] and where[0] == mine[0]]
    if len(shared) > 1:
        raise ValueError(
            f"EnvRolloutFunc: processes {shared} of this {accelerator.num_processes}-process run all write the rollout "
            f"file {mine[1]!r}; expected one file per process. Fix: name the file by process with the trainer "
            "config's process index, e.g. RolloutWriter(f\"runs/rollouts.rank{args.process_index}.jsonl\") for "
            "args = GRPOConfig(...), and read the files one by one with read_rollouts."
        )


def _model_vocab(model: Any) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(getattr(config, "vocab_size", 0) or 0)


def _default_max_seq_len(trainer: Any) -> int:
    args = trainer.args
    if getattr(trainer, "use_vllm", False) and args.vllm_max_model_length:
        return int(args.vllm_max_model_length)
    config = trainer.model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return min(int(getattr(config, "max_position_embeddings", None) or _DEFAULT_MAX_SEQ_LEN), _DEFAULT_MAX_SEQ_LEN)
