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
  integer ``version`` by one; it returns the new version. ``load_adapter`` does the same for a LoRA adapter (below).

Log-probs are "raw" by default: ``log_softmax(logits)`` of the model, before temperature, top-k or
top-p. That is what a trainer recomputes with a plain forward pass, so the importance ratio of the
engine's and the trainer's log-probs is exactly 1 on-policy. ``logprobs_mode="processed"`` gives the
log-probs of the distribution actually sampled from instead.

LoRA adapters (:class:`AdapterEngine`; the trainer side is :mod:`gym_llm_adapters.lora`):

* ``serves_adapters`` says whether the engine can serve adapters at all. It is fixed when the engine starts
  (``lora_rank=R`` on the package's engines; vLLM sizes its adapter slots then). ``max_lora_rank`` is the largest
  rank it takes (``None``: no limit known here).
* ``adapter`` is the :class:`~gym_llm_adapters.lora.Adapter` served now; ``None`` means the base model. Before the
  first load an engine serves the base model.
* ``load_adapter(adapter)`` makes ``adapter`` the one every later ``generate`` and ``logprobs`` call uses and
  returns the new version, ``version + 1``. The adapter must be for that version (``adapter.version ==
  version + 1``: a record's version is the version of the adapter that sampled it) and its name and id must differ
  from the served one's (engines key caches and adapter slots by them). ``version`` moves only once the adapter is
  loaded and will serve the next request; a load that fails raises and leaves ``version`` and the served adapter as
  they were. The previous adapter is dropped from the engine, so adapter slots do not fill up.
* **Resuming** a run: ``adapter=`` on the engine's constructor serves that adapter from the first request, at
  ``version=adapter.version`` (a ``version=`` given too must be equal). A run that stopped at version ``v`` starts
  its engines with its last adapter, and the next push is ``v + 1``.
* ``load_weights`` on an engine that serves an adapter changes the base weights under it; the adapter stays.
"""

from __future__ import annotations

import abc
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from gym_llm_adapters.types import Completion

if TYPE_CHECKING:
    from gym_llm_adapters.lora import Adapter

__all__ = ["AdapterEngine", "Engine", "EngineBase", "SamplingConfig", "Prompt", "LogprobsMode", "named_tensors",
           "check_adapter_folder"]

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
        """The policy version: 0 (or the constructor's ``version``) plus the number of weight and adapter loads."""
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


@runtime_checkable
class AdapterEngine(Engine, Protocol):
    """An :class:`Engine` that can serve LoRA adapters (see the module docstring). :class:`EngineBase` implements
    the bookkeeping; every package engine and the Ray engine group have it."""

    @property
    def serves_adapters(self) -> bool:
        """Whether :meth:`load_adapter` can work (the engine was started with LoRA on)."""
        ...

    @property
    def adapter(self) -> "Adapter | None":
        """The adapter served now; ``None`` for the base model."""
        ...

    def load_adapter(self, adapter: "Adapter") -> int:
        """Serve ``adapter`` from the next request on; return the new version (``version + 1``)."""
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

    def __init__(self, tokenizer: Any, *, version: int | None = None, adapter: "Adapter | None" = None):
        if adapter is not None:
            _check_adapter_type(adapter)
            if version is not None and version != adapter.version:
                raise ValueError(f"version={version!r} disagrees with the adapter's version {adapter.version}: an "
                                 "engine that starts with an adapter is at that adapter's version (omit version=).")
            version = adapter.version
        version = 0 if version is None else version
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}.")
        self.tokenizer = tokenizer
        self._version = int(version)
        self._adapter: Adapter | None = None
        self._swap_lock = threading.Lock()  # the served adapter and the version change together
        self._closed = False

    @property
    def version(self) -> int:
        return self._version

    # ------------------------------------------------------------------------------ adapters
    @property
    def serves_adapters(self) -> bool:
        """Whether this engine can serve LoRA adapters (fixed when it starts); False unless a subclass says so."""
        return False

    @property
    def max_lora_rank(self) -> int | None:
        """The largest adapter rank the engine takes (``None``: not known here, or no adapters)."""
        return None

    @property
    def adapter(self) -> "Adapter | None":
        """The adapter served now (``None``: the base model)."""
        return self._adapter

    def load_adapter(self, adapter: "Adapter") -> int:
        """Serve ``adapter`` from the next ``generate``/``logprobs`` call on and return the new version
        (``version + 1``). Raises ``ValueError`` for an adapter this engine cannot take (see the module docstring);
        any failure leaves the version and the served adapter unchanged."""
        self._check_open()
        self._check_adapter(adapter, version=self._version + 1)
        previous = self._adapter
        self._load_adapter(adapter, previous)
        with self._swap_lock:
            self._adapter = adapter
            self._version += 1
        logger.debug("%s serves adapter %s (%d bytes); version is now %d", type(self).__name__, adapter.name,
                     adapter.num_bytes, self._version)
        return self._version

    def _served(self) -> "tuple[Adapter | None, int]":
        """The served adapter and the version, read together (for engines whose calls may overlap a push)."""
        with self._swap_lock:
            return self._adapter, self._version

    def _serve_initial_adapter(self, adapter: "Adapter | None") -> None:
        """Subclasses call this at the end of ``__init__``: serve the constructor's ``adapter=`` (a resumed run)."""
        if adapter is None:
            return
        self._check_adapter(adapter, version=self._version)
        self._load_adapter(adapter, None)
        self._adapter = adapter

    def _check_adapter(self, adapter: "Adapter", *, version: int) -> None:
        _check_adapter_type(adapter)
        if not self.serves_adapters:
            raise ValueError(f"This {type(self).__name__} does not serve LoRA adapters: {self._lora_hint()}")
        if adapter.version != version:
            raise ValueError(f"The adapter {adapter.name!r} is for policy version {adapter.version}, but this engine "
                             f"would be at version {version} serving it (its version is {self._version}); every push "
                             "is one version up (AdapterSync does that).")
        current = self._adapter
        if current is not None and (adapter.name == current.name or adapter.int_id == current.int_id):
            raise ValueError(f"The adapter {adapter.name!r} (id {adapter.int_id}) reuses the name or id of the one "
                             f"served now ({current.name!r}, id {current.int_id}); caches are keyed by them, so every "
                             "version needs new ones (Adapter.for_version).")
        limit = self.max_lora_rank
        if limit is not None and adapter.rank > limit:
            raise ValueError(f"The adapter {adapter.name!r} has rank {adapter.rank}, above this engine's largest, "
                             f"{limit}; start the engine with lora_rank={adapter.rank} (or more), or train a lower "
                             "rank.")
        check_adapter_folder(adapter.path)

    def _lora_hint(self) -> str:
        """How to start this kind of engine with LoRA on (for error messages)."""
        return f"start it with lora_rank=R ({type(self).__name__}(..., lora_rank=16)), R >= the adapter's rank."

    def _load_adapter(self, adapter: "Adapter", previous: "Adapter | None") -> None:
        """Make ``adapter`` the served one and drop ``previous`` (no version bookkeeping). Must raise, leaving
        ``previous`` served, when it cannot."""
        raise NotImplementedError(f"{type(self).__name__} does not serve LoRA adapters.")

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
                    finish_reason: str, sampling: SamplingConfig, version: int | None = None) -> Completion:
        """A :class:`Completion`; its text is decoded here (specials skipped, cut at a stop string), the same
        way for every engine, so equal ids always give equal text. ``version``: the version that sampled it, when
        the engine may change version while a call runs (default: the current one)."""
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
                          finish_reason=finish_reason, version=self._version if version is None else int(version))


def _check_adapter_type(adapter: Any) -> None:
    from gym_llm_adapters.lora import Adapter

    if not isinstance(adapter, Adapter):
        raise TypeError(f"load_adapter expects a gym_llm_adapters.lora.Adapter (AdapterSync makes them), got "
                        f"{type(adapter).__name__}.")


def check_adapter_folder(path: str | Path) -> None:
    """Raise ``FileNotFoundError`` unless ``path`` holds a PEFT adapter (``adapter_config.json`` and
    ``adapter_model.safetensors``). Engines check it before loading, so a missing file is named."""
    from gym_llm_adapters.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS

    missing = [name for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if not (Path(path) / name).is_file()]
    if missing:
        raise FileNotFoundError(f"The adapter folder {path} has no {' or '.join(missing)}; it must be a PEFT adapter "
                                "folder that this engine's process can read (save_adapter writes one).")


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

