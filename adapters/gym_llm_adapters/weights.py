"""Policy versions and weight sync from a trainer's torch model to inference engines.

The policy version is an integer owned by each engine: 0 at start (or the ``version`` given when
resuming) and +1 per :meth:`Engine.load_weights`. Every completion, step record and trajectory carries
the version that generated it; :func:`policy_lag` says how stale a batch is. :class:`WeightSync` is the
trainer-side helper: it pushes a model's weights to one or more engines and keeps their versions in
step.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from gym_llm_adapters.engines.base import Engine
from gym_llm_adapters.types import RolloutBatch, StepRecord, Trajectory

__all__ = ["WeightSync", "policy_lag", "strip_wrapper_prefixes"]

logger = logging.getLogger(__name__)

_INNER_WRAPPERS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})
_WRAPPER_PREFIXES = _INNER_WRAPPERS | {"module"}


def strip_wrapper_prefixes(name: str) -> str:
    """``module.model.layers.0...`` -> ``model.layers.0...``: drops the names that DDP (leading ``module.``),
    ``torch.compile`` (``_orig_mod.``), FSDP and activation checkpointing wrappers add."""
    parts = name.split(".")
    while parts and parts[0] in _WRAPPER_PREFIXES:
        parts = parts[1:]
    return ".".join(p for p in parts if p not in _INNER_WRAPPERS)


class WeightSync:
    """Pushes a torch model's weights into engines and bumps their versions (TorchRL's ``vLLMUpdater`` role).

    Args:
        model: the trainer's model (a ``transformers`` causal LM, possibly wrapped by DDP/compile).
        engines: one engine or several (e.g. a vLLM engine per GPU); all get the same weights.
        rename: maps a state-dict name to the engine's checkpoint name, or None to skip the tensor.
            Default: strip wrapper prefixes (``module.``, ``_orig_mod.``).
        dtype: cast tensors before sending (e.g. ``torch.bfloat16`` for a bf16 engine); default: as is.

    Example::

        sync = WeightSync(policy, engine)
        ...  # optimizer step
        version = sync.push()   # engine.version == version; new rollouts carry it
    """

    def __init__(self, model: Any, engines: Engine | Sequence[Engine], *,
                 rename: Callable[[str], str | None] | None = None, dtype: Any = None):
        if not hasattr(model, "state_dict"):
            raise TypeError(f"model must be a torch module (with state_dict), got {type(model).__name__}.")
        self.model = model
        self.engines: list[Engine] = [engines] if not isinstance(engines, (list, tuple)) else list(engines)
        if not self.engines:
            raise ValueError("WeightSync needs at least one engine.")
        self.rename = rename or strip_wrapper_prefixes
        self.dtype = dtype
        self.pushes = 0
        self.last_push_s = 0.0

    def named_tensors(self) -> Iterable[tuple[str, Any]]:
        """The tensors to send: the model's state dict, renamed, detached and cast."""
        for name, tensor in self.model.state_dict().items():
            target = self.rename(name)
            if target is None:
                continue
            tensor = tensor.detach()
            if hasattr(tensor, "full_tensor"):  # an FSDP2 shard (DTensor): gathered whole (every rank pushes)
                tensor = tensor.full_tensor()
            if self.dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(self.dtype)
            yield target, tensor

    def push(self) -> int:
        """Send the current weights to every engine; returns the new (common) version.

        Raises ``RuntimeError`` if the engines disagree on the version afterwards (one of them was
        updated elsewhere): rollouts would then be tagged inconsistently.
        """
        start = time.perf_counter()
        items = list(self.named_tensors())
        versions = [engine.load_weights(items) for engine in self.engines]
        self.last_push_s = time.perf_counter() - start
        self.pushes += 1
        if len(set(versions)) != 1:
            raise RuntimeError(f"The engines' versions disagree after the weight push: {versions}.")
        logger.debug("pushed %d tensors to %d engine(s) in %.3f s; version %d",
                     len(items), len(self.engines), self.last_push_s, versions[0])
        return versions[0]

    @property
    def version(self) -> int:
        return self.engines[0].version


def policy_lag(records: RolloutBatch | Sequence[Trajectory] | Sequence[StepRecord], current_version: int) -> np.ndarray:
    """How many weight updates old each record is: ``current_version - version`` (oldest step of a trajectory).

    Returns an int64 array with one entry per record.
    """
    if isinstance(records, RolloutBatch):
        versions = records.versions
    else:
        versions = np.array([min(r.versions) if isinstance(r, Trajectory) else r.version for r in records], dtype=np.int64)
    return int(current_version) - np.asarray(versions, dtype=np.int64)
