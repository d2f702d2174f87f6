"""TRL's colocated vLLM weight sync, made right on vLLM-CPU whatever the CPU.

TRL 1.16 (``VLLMGeneration.sync_weights``, ``vllm_mode="colocate"``) writes each trained parameter with
``model.load_weights([(name, param)])`` into the engine's live model. On vLLM-CPU that is wrong on most CPUs: at
load, vLLM repacks every linear layer's weight into a kernel handle (oneDNN on AVX2/AVX-512, sgl-kernel packing on
AMX) and leaves an empty ``weight`` (see :mod:`gym_llm_adapters.engines.cpu_paths`), so the write raises
``AttributeError: 'Parameter' object has no attribute 'weight_loader'``; and the output head keeps its ``weight``
but computes from a packed copy, so a write there would succeed and change nothing.

:func:`install_vllm_weight_sync` replaces the colocated CPU case with vLLM's in-place reload
(``collective_rpc("reload_weights", weights_iterator=...)``): the model's own loader runs, then its post-load
processing, so every layer is repacked from the new weights, on every CPU path; an output head tied to the input
embedding (SmolLM2), which that reload skips, is repacked after it. The weights still come from TRL's
own parameter walk (PEFT merge, FSDP/DeepSpeed gathering, TRL's name fixes), and the prefix cache is reset after,
as TRL does. On vLLM-CPU, TRL's colocated ``vllm.LLM`` is also built with ``enforce_eager=True`` (TRL has no option
for it; ``GYM_LLM_TRL_VLLM_COMPILE=1`` keeps vLLM's compiled default). Every other case (server mode, GPU builds)
runs TRL's code unchanged.

Importing :mod:`gym_llm_adapters.trl` installs it, so ``GRPOTrainer(..., args=GRPOConfig(use_vllm=True,
vllm_mode="colocate"))`` trains on vLLM-CPU as written. A TRL whose internals differ from the tested version is
reported when TRL is imported, with the fix, instead of failing at the first sync.

Tested with TRL 1.16.0 and vllm-cpu 0.32.0. TRL warns that it supports vLLM 0.22-0.31; with this sync the pair
passes the TRL tests in ``tests/adapters/trl/`` (real optimizer steps, the engine's log-probs checked against the
trained model after each sync) on every forced CPU path. With PEFT (``GRPOTrainer(peft_config=...)``), TRL's walk
merges the adapter into the base weights, yields every weight under the base model's names and unmerges at its end;
this sync pushes that as it pushes a full model (a full push of merged weights; tested with peft 0.21.2: the engine
then computes what the PEFT model computes with its adapter on, docs/trl.md "GRPO with a LoRA adapter").
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import warnings
from typing import Any, Iterator

from gym_llm_adapters.engines import cpu_paths  # (imports nothing heavy: vLLM only when apply() runs)

__all__ = ["install_vllm_weight_sync", "reload_sync_weights"]

logger = logging.getLogger(__name__)

_SUPPORTED_TRL = "1.16.0"


def _is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _cloned(items: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """TRL's ``(name, param.data)`` pairs, each copied while TRL's gather context is still open.

    vLLM's reload buffers a layer's tensors until the whole layer has arrived; by then TRL may have released a
    gathered shard (DeepSpeed ZeRO-3, FSDP) or unmerged a PEFT adapter in place. A copy per tensor costs at most a
    layer's worth of memory (vLLM frees each layer's buffer once it is processed).
    """
    for name, tensor in items:
        yield name, tensor.detach().clone()


def reload_sync_weights(generation: Any) -> None:
    """Push the trainer's weights into ``generation``'s colocated ``vllm.LLM`` through vLLM's in-place reload.

    Args:
        generation: TRL's ``VLLMGeneration`` (``trainer.vllm_generation``) in colocate mode.

    (Sleep mode, which TRL wakes before a sync, does not exist on vLLM-CPU: vLLM refuses
    ``vllm_enable_sleep_mode=True`` when TRL builds the engine, before training starts.)
    """
    from gym_llm_adapters.engines.vllm import _quiet_tied_head_reload_warning, _retie_output_head

    llm = generation.llm
    if not getattr(llm, "_gym_llm_quiet_tied_head", False):  # once per engine; a tied head gets no weights of its own
        llm.collective_rpc(_quiet_tied_head_reload_warning)
        llm._gym_llm_quiet_tied_head = True
    # In process (TRL's colocated engine uses the external_launcher executor), so the generator is consumed inside
    # TRL's gather contexts, one tensor at a time.
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": _cloned(generation._iter_named_params())})
    # A model whose output head is tied to the input embedding (SmolLM2) gets no lm_head weights in the reload, so
    # vLLM never repacks its head: without this the engine samples with the first weights' head (VLLMEngine does
    # the same after its own reloads).
    llm.collective_rpc(_retie_output_head)
    llm.reset_prefix_cache()


_MODULE = "trl.generation.vllm_generation"


def install_vllm_weight_sync() -> None:
    """Make TRL's ``VLLMGeneration.sync_weights`` use :func:`reload_sync_weights` in colocate mode on vLLM-CPU.

    Costs nothing until TRL's generation module is imported (``from trl import GRPOTrainer`` does): if it is
    already imported, the class is patched now; otherwise a one-shot import hook patches it right after TRL defines
    it, and first applies the CPU-path switches of :mod:`gym_llm_adapters.engines.cpu_paths` (importing that module
    imports vLLM). Idempotent; ``import gym_llm_adapters.trl`` calls it.

    A TRL whose internals differ from the tested 1.16 (no ``VLLMGeneration.sync_weights``/``_iter_named_params``)
    is left as it is, with a warning that names the fix (``pip install 'trl==1.16.0'``).
    """
    module = sys.modules.get(_MODULE)
    if module is not None:
        _patch(module)
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds TRL's generation module with the regular finders, and patches it once it has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)  # one-shot, and the lookup below must not find us again
        try:
            cpu_paths.apply()  # before TRL's module imports vLLM
        except Exception:  # a bad switch value must not break TRL's import; VLLMEngine raises it clearly
            logger.warning("could not apply the CPU-path switches", exc_info=True)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any):
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _patch(module: Any) -> None:
    cls = getattr(module, "VLLMGeneration", None)
    if cls is None or getattr(cls.sync_weights, "_gym_llm", False):
        return
    missing = [name for name in ("sync_weights", "_iter_named_params") if not hasattr(cls, name)]
    if missing:
        import trl

        message = (f"gym_llm_adapters.trl could not fix TRL's colocated vLLM weight sync for vLLM-CPU: TRL "
                   f"{trl.__version__} has no VLLMGeneration.{', '.join(missing)}. On vLLM-CPU, colocated training "
                   f"will fail at the first weight sync. Install the tested version: pip install 'trl=={_SUPPORTED_TRL}'.")
        logger.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return
    trl_sync_weights = cls.sync_weights

    def sync_weights(self: Any) -> None:
        if self.mode == "colocate" and _is_cpu_platform():
            reload_sync_weights(self)
        else:
            trl_sync_weights(self)

    sync_weights.__doc__ = (trl_sync_weights.__doc__ or "") + (
        "\n\n(gym_llm_adapters: colocate mode on vLLM-CPU reloads the weights through vLLM's in-place reload; "
        "see gym_llm_adapters.trl.vllm_sync.)")
    sync_weights._gym_llm = True  # type: ignore[attr-defined]
    sync_weights._trl_original = trl_sync_weights  # type: ignore[attr-defined]
    cls.sync_weights = sync_weights
    if getattr(module, "LLM", None) is not None:  # (once: the sync_weights check above returns on a second call)
        module.LLM = _eager_on_cpu(module.LLM)


_COMPILE_ENV = "GYM_LLM_TRL_VLLM_COMPILE"


def _eager_on_cpu(llm_class: Any) -> Any:
    """TRL's colocated ``vllm.LLM(...)`` with ``enforce_eager=True`` on vLLM-CPU (TRL has no option for it), as the
    package's own CPU engines run. Otherwise vLLM compiles the model with inductor when TRL builds it: a C++ build
    of ~10 CPU-s even for the 2-layer test model (and dynamo's tracing besides), repeated for each GEMM path's
    graph. ``GYM_LLM_TRL_VLLM_COMPILE=1`` keeps vLLM's default (compiled). Also the package's other CPU default,
    KV-cache blocks of 32 tokens (:func:`cpu_paths.llm_defaults`). GPU builds are never changed."""

    def build(*args: Any, **kwargs: Any) -> Any:
        cpu = _is_cpu_platform()
        if cpu and os.environ.get(_COMPILE_ENV, "0") != "1" and "enforce_eager" not in kwargs:
            kwargs["enforce_eager"] = True
            logger.info("TRL's colocated vLLM on CPU runs eagerly (set %s=1 to let vLLM compile it)", _COMPILE_ENV)
        return llm_class(*args, **cpu_paths.llm_defaults(kwargs, cpu=cpu))

    build.__doc__ = llm_class.__doc__
    return build
