"""Engine outputs checked at the boundary, before they touch an env or a trajectory.

A completion that is wrong in shape or content (a log-prob short, an id outside the vocabulary, a NaN, an answer
to another prompt) would otherwise become an env action and a training record — mislabelled data, silently. The
collector checks every completion here right after ``generate`` returns, before any env is stepped, so a bad one
costs nothing but the call: :class:`EngineOutputError` says which engine, which prompt (and sub-env), and what was
wrong.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gym_llm_adapters.types import Completion

__all__ = ["EngineOutputError", "FINISH_REASONS", "check_completions"]

FINISH_REASONS = ("stop", "length")
LOGPROB_TOLERANCE = 1e-3
"""Log-probs may exceed 0 by this much (bf16/fp32 rounding of a near-certain token), no more."""


class EngineOutputError(RuntimeError):
    """An engine returned a completion that cannot be right. Nothing was stepped with it.

    Attributes:
        engine: the engine's class name.
        index: which completion of the call (= which prompt).
        sub_env: the sub-env the prompt came from (``None`` if not known).
        problem: what was wrong.
    """

    def __init__(self, engine: str, index: int, sub_env: int | None, problem: str):
        self.engine, self.index, self.sub_env, self.problem = engine, index, sub_env, problem
        where = f"prompt {index}" + (f" (sub-env {sub_env})" if sub_env is not None else "")
        super().__init__(
            f"{engine} returned a bad completion for {where}: {problem}. Nothing was stepped with it; the collector "
            "can go on (the call is retried on the next step) once the engine is fixed — a patched or remote engine "
            "must return one Completion per prompt, in prompt order, with one finite log-prob <= 0 per token."
        )


def check_completions(completions: Any, prompts: Sequence[np.ndarray], *, engine: Any,
                      sub_envs: Sequence[int] | None = None, vocab_size: int | None = None) -> list[Completion]:
    """``completions`` as a list, after checking each against the prompt it answers.

    Checks: one :class:`Completion` per prompt; ``prompt_ids`` equal to the prompt sent (a reordered batch would
    label every trajectory with another prompt's answer); ``token_ids`` a 1-D integer array of ids in
    ``[0, vocab_size)``; ``logprobs`` one per token, finite and ``<= LOGPROB_TOLERANCE``; ``finish_reason`` one of
    :data:`FINISH_REASONS`; no empty completion unless the engine says it stopped (``"stop"``); an int ``version``.
    Raises :class:`EngineOutputError` on the first problem.
    """
    name = type(engine).__name__

    def fail(index: int, problem: str) -> EngineOutputError:
        return EngineOutputError(name, index, None if sub_envs is None else int(sub_envs[index]), problem)

    if not isinstance(completions, (list, tuple)):
        raise EngineOutputError(name, -1, None, f"generate returned {type(completions).__name__}, not a list")
    if len(completions) != len(prompts):
        raise EngineOutputError(name, -1, None, f"{len(completions)} completions for {len(prompts)} prompts")
    for k, (c, prompt) in enumerate(zip(completions, prompts)):
        if not isinstance(c, Completion):
            raise fail(k, f"a {type(c).__name__}, not a Completion")
        ids, lps = c.token_ids, c.logprobs
        if not isinstance(ids, np.ndarray) or ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise fail(k, f"token_ids must be a 1-D integer array, got {_describe(ids)}")
        if not isinstance(lps, np.ndarray) or lps.ndim != 1 or not np.issubdtype(lps.dtype, np.floating):
            raise fail(k, f"logprobs must be a 1-D float array, got {_describe(lps)}")
        if len(lps) != len(ids):
            raise fail(k, f"{len(lps)} log-probs for {len(ids)} tokens")
        if len(ids):
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or (vocab_size is not None and high >= vocab_size):
                raise fail(k, f"token id {low if low < 0 else high} is outside the vocabulary [0, {vocab_size})")
            if not np.isfinite(lps).all():
                raise fail(k, f"a log-prob is not finite (token {int(np.flatnonzero(~np.isfinite(lps))[0])})")
            if float(lps.max()) > LOGPROB_TOLERANCE:
                raise fail(k, f"a log-prob is positive ({float(lps.max()):.4g}): log-probabilities are <= 0")
        if c.finish_reason not in FINISH_REASONS:
            raise fail(k, f"finish_reason {c.finish_reason!r} is not one of {FINISH_REASONS}")
        if not len(ids) and c.finish_reason != "stop":
            raise fail(k, f"an empty completion with finish_reason {c.finish_reason!r} (only 'stop' may be empty)")
        prompt_ids = np.asarray(c.prompt_ids)
        if prompt_ids.shape != np.shape(prompt) or not np.array_equal(prompt_ids, prompt):
            raise fail(k, "its prompt_ids are not the prompt sent (completions out of order, or for another prompt)")
        if isinstance(c.version, bool) or not isinstance(c.version, (int, np.integer)):
            raise fail(k, f"version must be an int, got {c.version!r}")
    return list(completions)


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    return type(value).__name__
