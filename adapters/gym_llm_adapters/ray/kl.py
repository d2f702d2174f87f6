"""Reference KL in a Ray actor: the frozen reference model lives on its own worker (e.g. a GPU node).

:class:`RemoteReferenceKL` starts an actor holding a :class:`~gym_llm_adapters.kl.ReferenceKL` (the same code,
estimators and masks as in-process) and sends it :class:`~gym_llm_adapters.types.RolloutBatch` es. The
reference forward then overlaps with collection and training: :meth:`RemoteReferenceKL.submit` returns at
once, ``ray.get`` (or :meth:`RemoteReferenceKL.result`) gives the batch with ``ref_logprobs`` (and KL-shaped
rewards when ``reward_coef > 0``). The actor holds no state but the frozen model, so Ray restarts it and
retries the call when it dies (``max_restarts`` / ``max_task_retries``, 1 each by default); past that, calls
raise ``RuntimeError``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping

from gym_llm_adapters.ray.specs import require_ray
from gym_llm_adapters.types import RolloutBatch

__all__ = ["ReferenceKLActor", "RemoteReferenceKL"]

logger = logging.getLogger(__name__)


class ReferenceKLActor:
    """The body of the reference-KL actor: loads the model and applies :class:`~gym_llm_adapters.kl.ReferenceKL`."""

    def __init__(self, model: str | Path | Callable[[], Any], config: Any = None, dtype: str | None = None,
                 device: str | None = None):
        from gym_llm_adapters.kl import ReferenceKL

        if callable(model):
            module = model()
        else:
            import torch
            from transformers import AutoModelForCausalLM

            kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
            module = AutoModelForCausalLM.from_pretrained(str(model), **kwargs)
        if device is not None:
            module = module.to(device)
        module.requires_grad_(False)
        self.reference = ReferenceKL(module, config)

    def apply(self, batch: RolloutBatch) -> RolloutBatch:
        return self.reference.apply(batch)

    def compute(self, batch: RolloutBatch) -> dict[str, Any]:
        """:class:`~gym_llm_adapters.kl.KLOutput` as numpy arrays (``ref_logprobs``, ``kl``, ``kl_per_sequence``,
        ``rewards``)."""
        out = self.reference(batch)
        return {name: getattr(out, name).cpu().numpy() for name in ("ref_logprobs", "kl", "kl_per_sequence", "rewards")}


class RemoteReferenceKL:
    """:class:`~gym_llm_adapters.kl.ReferenceKL` running in a Ray actor.

    Args:
        model: a checkpoint folder (loaded with ``AutoModelForCausalLM`` in the actor) or a factory returning the
            reference model.
        config: a :class:`~gym_llm_adapters.kl.ReferenceKLConfig` (default: k3, no reward shaping).
        dtype: the model's torch dtype name (e.g. ``"bfloat16"``); default: the checkpoint's.
        device: where the actor puts the model (e.g. ``"cuda"``; pair it with ``actor_options={"num_gpus": 1}``).
        actor_options: Ray actor options. By default Ray restarts a dead actor once and retries the call.

    Example::

        ref = RemoteReferenceKL(ckpt, ReferenceKLConfig(reward_coef=0.05), device="cuda", actor_options={"num_gpus": 1})
        pending = ref.submit(batch)          # runs while the next batch is collected
        batch = ref.result(pending)          # ref_logprobs set, rewards KL-shaped
    """

    def __init__(self, model: str | Path | Callable[[], Any], config: Any = None, *, dtype: str | None = None,
                 device: str | None = None, actor_options: Mapping[str, Any] | None = None):
        ray = require_ray()
        self.options = {"max_restarts": 1, "max_task_retries": 1, **dict(actor_options or {})}
        self.actor = ray.remote(ReferenceKLActor).options(**self.options).remote(model, config, dtype, device)

    def submit(self, batch: RolloutBatch) -> Any:
        """Start scoring ``batch``; returns an object ref of the scored :class:`RolloutBatch`."""
        if not isinstance(batch, RolloutBatch):
            raise TypeError(f"RemoteReferenceKL expects a RolloutBatch; got {type(batch).__name__}. Make one with "
                            "RolloutBatch.from_trajectories(batch, pad_id=...).")
        return self.actor.apply.remote(batch)

    def result(self, ref: Any, timeout_s: float | None = None) -> RolloutBatch:
        """The scored batch of a :meth:`submit`. ``RuntimeError`` if the actor died past its restarts."""
        return self._get(ref, timeout_s)

    def apply(self, batch: RolloutBatch) -> RolloutBatch:
        """A copy of ``batch`` with ``ref_logprobs`` (and KL-shaped rewards), like ``ReferenceKL.apply``."""
        return self.result(self.submit(batch))

    def compute(self, batch: RolloutBatch) -> dict[str, Any]:
        """The KL terms of ``batch`` as numpy arrays (see :meth:`ReferenceKLActor.compute`)."""
        return self._get(self.actor.compute.remote(batch))

    def _get(self, ref: Any, timeout_s: float | None = None) -> Any:
        import ray

        try:
            return ray.get(ref, timeout=timeout_s)
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(
                f"The reference-KL actor died and may not be restarted again (max_restarts="
                f"{self.options['max_restarts']}, max_task_retries={self.options['max_task_retries']}): {e}. Check its "
                "log (out of memory?), then make a new RemoteReferenceKL, or allow more restarts with actor_options."
            ) from e

    def close(self) -> None:
        import ray

        ray.kill(self.actor, no_restart=True)

    def __enter__(self) -> "RemoteReferenceKL":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
