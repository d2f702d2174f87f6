"""A TRL trainer's generation as an :class:`~gym_llm_adapters.engines.base.Engine`.

:func:`trainer_engine` gives the engine a rollout function should sample with, the way ``GRPOTrainer`` itself
would generate:

| trainer | engine |
|---|---|
| ``use_vllm=True, vllm_mode="colocate"`` | :class:`~gym_llm_adapters.engines.vllm.VLLMEngine` over the trainer's own ``vllm.LLM`` (``trainer.vllm_generation.llm``) |
| ``use_vllm=True, vllm_mode="server"`` | :class:`~gym_llm_adapters.engines.server.VLLMServerEngine` on the server TRL talks to (``vllm_server_base_url`` or host/port) |
| ``use_vllm=False`` | :class:`~gym_llm_adapters.engines.hf.HFEngine` over the trainer's model, unwrapped with TRL's ``unwrap_model_for_generation`` |

TRL keeps the vLLM weights in sync before it calls the rollout function; the engine never loads weights.
Every completion carries ``trainer.state.global_step`` as its version. Log-probs are those of the sampling
distribution (TRL's colocated vLLM runs with ``logprobs_mode="processed_logprobs"``; the transformers engine
is made with ``logprobs_mode="processed"``), which is what TRL's vLLM importance-sampling correction expects.

:func:`sampling_from_trainer` maps the trainer's generation settings to a
:class:`~gym_llm_adapters.engines.base.SamplingConfig` and refuses the ones it cannot honour.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Any, Iterator, MutableMapping, Sequence

from gym_llm_adapters.engines.base import SamplingConfig
from gym_llm_adapters.types import Completion

__all__ = ["trainer_engine", "sampling_from_trainer", "trainer_tokenizer", "StepVersionedEngine"]

logger = logging.getLogger(__name__)


class StepVersionedEngine:
    """Delegates to ``engine`` and stamps every completion with ``version`` (the trainer's global step).

    The trainer owns the weights (TRL syncs vLLM itself), so :meth:`load_weights` refuses.
    """

    def __init__(self, engine: Any, version: int):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.version = int(version)

    def generate(self, prompts: Sequence[Any], sampling: SamplingConfig) -> list[Completion]:
        return [dataclasses.replace(c, version=self.version) for c in self.engine.generate(prompts, sampling)]

    def logprobs(self, sequences: Sequence[Any]) -> list[Any]:
        return self.engine.logprobs(sequences)

    def load_weights(self, weights: Any) -> int:
        raise RuntimeError("The trainer owns the weights: TRL syncs its vLLM engine itself; nothing to load here.")

    def close(self) -> None:
        """Nothing to release: the wrapped engine belongs to the trainer (or to its cache)."""


def trainer_tokenizer(trainer: Any) -> Any:
    """The trainer's tokenizer (``processing_class``, or its ``tokenizer`` for multimodal processors)."""
    processing = trainer.processing_class
    return getattr(processing, "tokenizer", None) or processing


def sampling_from_trainer(args: Any, max_tokens: int | None = None) -> SamplingConfig:
    """``SamplingConfig`` from a ``GRPOConfig``: ``temperature``, ``top_p``, ``top_k`` and, per assistant turn,
    ``max_tokens`` (default ``args.max_completion_length``).

    Raises:
        ValueError: a setting the gym_llm engines do not implement is set (``repetition_penalty != 1``,
            ``min_p``, ``generation_kwargs``, ``vllm_structured_outputs_regex``): sampling would silently differ
            from what the trainer asked for.
    """
    unsupported = []
    if getattr(args, "repetition_penalty", 1.0) != 1.0:
        unsupported.append(f"repetition_penalty={args.repetition_penalty}")
    if getattr(args, "min_p", None) not in (None, 0.0):
        unsupported.append(f"min_p={args.min_p}")
    if getattr(args, "generation_kwargs", None):
        unsupported.append(f"generation_kwargs={args.generation_kwargs}")
    if getattr(args, "vllm_structured_outputs_regex", None):
        unsupported.append("vllm_structured_outputs_regex")
    if unsupported:
        raise ValueError(
            f"EnvRolloutFunc samples with temperature, top_p, top_k and max_completion_length only; the GRPOConfig "
            f"also sets {', '.join(unsupported)}, which it cannot honour. Unset them (defaults: repetition_penalty=1.0, "
            "min_p=None, generation_kwargs=None)."
        )
    tokens = max_tokens if max_tokens is not None else args.max_completion_length
    if tokens is None:
        raise ValueError("Set GRPOConfig.max_completion_length (or EnvRolloutFunc(max_tokens_per_turn=...)).")
    return SamplingConfig(max_tokens=int(tokens), temperature=float(args.temperature), top_p=float(args.top_p),
                          top_k=int(args.top_k or 0))


@contextlib.contextmanager
def trainer_engine(trainer: Any, cache: MutableMapping[Any, Any] | None = None) -> Iterator[StepVersionedEngine]:
    """The engine that samples like ``trainer`` would (see the module docstring), for the duration of a rollout.

    Args:
        trainer: a ``trl.GRPOTrainer``.
        cache: where to keep vLLM engines between calls (they are cheap to use, not to build).

    Raises:
        NotImplementedError: vLLM colocate with ``vllm_enable_sleep_mode`` or ``vllm_tensor_parallel_size > 1``
            (every rank of a tensor-parallel group would have to send the same prompts, but each runs its own envs).
    """
    cache = {} if cache is None else cache
    tokenizer = trainer_tokenizer(trainer)
    step = int(trainer.state.global_step)
    if not getattr(trainer, "use_vllm", False):
        from trl.models import unwrap_model_for_generation

        from gym_llm_adapters.engines.hf import HFEngine

        args = trainer.args
        with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                         gather_deepspeed3_params=args.ds3_gather_for_generation,
                                         gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs) as model:
            yield StepVersionedEngine(HFEngine(model, tokenizer=tokenizer, logprobs_mode="processed"), step)
        return
    generation = trainer.vllm_generation
    if trainer.vllm_mode == "colocate":
        if generation.enable_sleep_mode:
            raise NotImplementedError(
                "EnvRolloutFunc does not support vllm_enable_sleep_mode=True (the engine would have to wake up and "
                "sleep around every multi-turn rollout); set vllm_enable_sleep_mode=False.")
        if generation.tensor_parallel_size > 1:
            raise NotImplementedError(
                "EnvRolloutFunc does not support vllm_mode='colocate' with vllm_tensor_parallel_size > 1: each rank "
                "runs its own envs, but a tensor-parallel group must generate the same prompts. Use "
                "vllm_tensor_parallel_size=1 or vllm_mode='server'.")
        key = ("colocate", id(generation.llm))
        if key not in cache:
            from gym_llm_adapters.engines.vllm import VLLMEngine

            cache[key] = VLLMEngine(llm=generation.llm, tokenizer=tokenizer)
        yield StepVersionedEngine(cache[key], step)
        return
    args = trainer.args
    base_url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
    key = ("server", base_url)
    if key not in cache:
        from gym_llm_adapters.engines.server import VLLMServerEngine

        cache[key] = VLLMServerEngine(base_url, tokenizer=tokenizer)
    yield StepVersionedEngine(cache[key], step)
