"""The engine protocol every inference backend implements, and the sampling settings they share.

An *engine* turns prompts into :class:`~gym_llm_adapters.types.Completion` records and back:

* ``generate(prompts, sampling)`` samples ``sampling.n`` continuations per prompt. Prompts are token
  ids (the truth) or text (encoded with the engine's tokenizer *without* added special tokens, like the
  envs do: a rendered chat template already holds them). The result is flat and prompt-major:
  ``completions[i * n + j]`` is sample ``j`` of prompt ``i``. Each completion carries the sampled ids,
  the log-prob of every sampled token (the first included), the text, the finish reason and the
  engine's ``version``.
* ``logprobs(sequences)`` teacher-forces given sequences: ``out[b][t] = log p(seq[t] | seq[:t])`` for
  ``t >= 1`` and ``out[b][0] = 0.0`` (nothing predicts the first token).
* ``load_weights(named_tensors)`` copies new weights in (Hugging Face checkpoint names) and bumps the
  integer ``version`` by one; it returns the new version.

Log-probs are "raw" by default: ``log_softmax(logits)`` of the model, before temperature, top-k or
top-p. That is what a trainer recomputes with a plain forward pass, so the importance ratio of the
engine's and the trainer's log-probs is exactly 1 on-policy. ``logprobs_mode="processed"`` gives the
log-probs of the distribution actually sampled from instead.
"""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from gym_llm_adapters.types import Completion

__all__ = ["Engine", "EngineBase", "SamplingConfig", "Prompt", "LogprobsMode", "named_tensors"]

logger = logging.getLogger(__name__)

Prompt = "str | Sequence[int] | np.ndarray"
"""A prompt: token ids (1-D ints) or text."""

LogprobsMode = Literal["raw", "processed"]


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How an engine samples. Shared by every engine, so the same settings mean the same thing.

    Attributes:
        n: samples per prompt (>= 1). The output is prompt-major: ``completions[i * n + j]``.
        max_tokens: the most tokens sampled per completion (>= 1); reaching it gives
            ``finish_reason == "length"``.
        temperature: softmax temperature; ``0.0`` is greedy decoding (argmax).
        top_p: nucleus sampling mass in ``(0, 1]``; 1.0 disables it.
        top_k: keep only the ``top_k`` most likely tokens; 0 disables it.
        seed: makes sampling reproducible. vLLM engines seed prompt ``i`` with ``seed + i * n`` (and its
            ``j``-th sample with ``+ j``), so equal prompts still get different samples; the
            transformers engine seeds one generator per call. ``None``: not reproducible.
        stop: strings that end a completion. The ids include the token that completed the string; the
            text stops before it (unless ``include_stop_str_in_output``).
        stop_token_ids: ids that end a completion besides the model's eos; the id is kept in the ids.
        ignore_eos: keep sampling past eos (benchmarks with fixed lengths). ``stop``/``stop_token_ids``
            still apply.
        include_stop_str_in_output: keep the matched stop string at the end of the text.
    """

    n: int = 1
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("n", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"SamplingConfig.{name} must be an int >= 1, got {value!r}.")
        if not self.temperature >= 0.0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0 (0 = greedy), got {self.temperature!r}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p!r}.")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
            raise ValueError(f"SamplingConfig.top_k must be an int >= 0 (0 disables it), got {self.top_k!r}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))):
            raise TypeError(f"SamplingConfig.seed must be an int or None, got {type(self.seed).__name__}.")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"SamplingConfig.stop must be non-empty strings, got {self.stop!r}.")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@runtime_checkable
class Engine(Protocol):
    """What the collector, the trainers and the KL code need from an inference backend.

    Implementations: :class:`~gym_llm_adapters.engines.vllm.VLLMEngine` (in-process ``vllm.LLM``),
    :class:`~gym_llm_adapters.engines.server.VLLMServerEngine` (a running ``vllm serve``) and
    :class:`~gym_llm_adapters.engines.hf.HFEngine` (transformers).
    """

    tokenizer: Any

    @property
    def version(self) -> int:
        """The policy version: 0 (or the constructor's ``version``) plus the number of weight loads."""
        ...

    def generate(self, prompts: Sequence[Any], sampling: SamplingConfig) -> list[Completion]:
        """``len(prompts) * sampling.n`` completions, prompt-major."""
        ...

    def logprobs(self, sequences: Sequence[Any]) -> list[np.ndarray]:
        """Teacher-forced log-probs, one ``(S_b,)`` float32 array per sequence (position 0 holds 0.0)."""
        ...

    def load_weights(self, weights: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> int:
        """Load named tensors (checkpoint names); return the new version."""
        ...

    def close(self) -> None:
        """Release the engine's resources."""
        ...


def named_tensors(weights: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``weights`` (a state dict or ``(name, tensor)`` pairs) as a list of detached ``(name, tensor)``.

    Raises ``TypeError`` naming the first entry that is not ``(str, tensor)``, and ``ValueError`` when
    there is nothing to load.
    """
    items = list(weights.items()) if isinstance(weights, Mapping) else list(weights)
    if not items:
        raise ValueError("load_weights got no tensors; pass model.state_dict() or (name, tensor) pairs.")
    out = []
    for entry in items:
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str) and hasattr(entry[1], "shape")):
            raise TypeError(
                f"load_weights expects a state dict or (name, tensor) pairs, got an entry of type "
                f"{type(entry).__name__}: {entry!r:.80}."
            )
        name, tensor = entry
        out.append((name, tensor.detach() if hasattr(tensor, "detach") else tensor))
    return out


class EngineBase(abc.ABC):
    """Shared parts of the engines: prompt normalisation, the version counter, stop-string handling.

    Subclasses implement :meth:`_generate_ids` (token-id prompts only), :meth:`logprobs` and
    :meth:`_load_weights`.
    """

    tokenizer: Any

    def __init__(self, tokenizer: Any, *, version: int = 0):
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}.")
        self.tokenizer = tokenizer
        self._version = int(version)
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    # ------------------------------------------------------------------------------ prompts
    def prompt_ids(self, prompts: Sequence[Any]) -> list[np.ndarray]:
        """Each prompt as a 1-D int64 array; text is encoded without added special tokens."""
        if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
            raise TypeError(
                f"prompts must be a list of prompts (token-id sequences or str), got {type(prompts).__name__}; "
                "wrap a single prompt in a list."
            )
        out = []
        for index, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ValueError("Text prompts need a tokenizer; pass tokenizer= to the engine or give token ids.")
                ids = np.asarray(self.tokenizer.encode(prompt, add_special_tokens=False), dtype=np.int64)
            else:
                ids = np.asarray(prompt)
                if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
                    raise TypeError(
                        f"Prompt {index} must be a str or a 1-D sequence of int token ids, got "
                        f"{type(prompt).__name__} with shape {ids.shape} and dtype {ids.dtype}."
                    )
                ids = ids.astype(np.int64, copy=False)
            if ids.size == 0:
                raise ValueError(f"Prompt {index} is empty; every prompt needs at least one token.")
            if ids.min() < 0:
                raise ValueError(f"Prompt {index} holds a negative token id ({int(ids.min())}).")
            out.append(ids)
        return out

    # ----------------------------------------------------------------------------- protocol
    def generate(self, prompts: Sequence[Any], sampling: SamplingConfig) -> list[Completion]:
        """Sample ``sampling.n`` completions for every prompt (see the module docstring)."""
        if not isinstance(sampling, SamplingConfig):
            raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}.")
        self._check_open()
        ids = self.prompt_ids(prompts)
        if not ids:
            return []
        completions = self._generate_ids(ids, sampling)
        assert len(completions) == len(ids) * sampling.n, (len(completions), len(ids), sampling.n)
        return completions

    @abc.abstractmethod
    def _generate_ids(self, prompts: list[np.ndarray], sampling: SamplingConfig) -> list[Completion]:
        """Generate for token-id prompts; prompt-major output of ``len(prompts) * n`` completions."""

    @abc.abstractmethod
    def logprobs(self, sequences: Sequence[Any]) -> list[np.ndarray]:
        """Teacher-forced log-probs (see the module docstring)."""

    def load_weights(self, weights: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> int:
        """Copy ``weights`` into the model and bump :attr:`version`; returns the new version.

        A failed load raises and leaves the version unchanged.
        """
        self._check_open()
        items = named_tensors(weights)
        self._load_weights(items)
        self._version += 1
        logger.debug("%s loaded %d tensors; version is now %d", type(self).__name__, len(items), self._version)
        return self._version

    @abc.abstractmethod
    def _load_weights(self, items: list[tuple[str, Any]]) -> None:
        """Copy the named tensors into the model (no version bookkeeping)."""

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"This {type(self).__name__} is closed; make a new one.")

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -------------------------------------------------------------------------------- helpers
    def _completion(self, prompt: np.ndarray, token_ids: Sequence[int], logprobs: Sequence[float],
                    finish_reason: str, sampling: SamplingConfig) -> Completion:
        """A :class:`Completion`; its text is decoded here (specials skipped, cut at a stop string), the same
        way for every engine, so equal ids always give equal text."""
        ids = np.asarray(token_ids, dtype=np.int64)
        lps = np.asarray(logprobs, dtype=np.float32)
        if len(ids) != len(lps):
            raise RuntimeError(
                f"{type(self).__name__} returned {len(lps)} log-probs for {len(ids)} tokens; every sampled "
                "token needs its log-prob."
            )
        if finish_reason not in ("stop", "length"):
            raise RuntimeError(f"{type(self).__name__}: generation ended with finish_reason={finish_reason!r}.")
        text = self.tokenizer.decode(ids.tolist(), skip_special_tokens=True) if self.tokenizer is not None else ""
        if sampling.stop:
            text, _ = cut_at_stop(text, sampling.stop, sampling.include_stop_str_in_output)
        return Completion(prompt_ids=prompt, token_ids=ids, logprobs=lps, text=text,
                          finish_reason=finish_reason, version=self._version)


def cut_at_stop(text: str, stop: Sequence[str], include: bool) -> tuple[str, bool]:
    """``text`` up to its earliest stop string (kept if ``include``) and whether one was found."""
    best = -1
    best_stop = ""
    for s in stop:
        at = text.find(s)
        if at != -1 and (best == -1 or at < best):
            best, best_stop = at, s
    if best == -1:
        return text, False
    return text[: best + (len(best_stop) if include else 0)], True

