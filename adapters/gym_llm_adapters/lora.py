"""LoRA: a trainable low-rank adapter on a frozen policy, pushed to the engines as an adapter, never stale.

A LoRA adapter adds, to each targeted linear layer ``y = W x``, a low-rank update::

    y = W x + (alpha / rank) * B (A x)        A: (rank, in_features), B: (out_features, rank), B = 0 at start

Only ``A`` and ``B`` train (PEFT's ``LoraConfig``; ``peft`` is the library: :func:`add_lora`). Three things follow:

* **The reference is free.** The KL term's reference is the same model with the adapter switched off (PEFT's
  ``disable_adapter()``): no second copy of the weights.
* **A push is the adapter alone.** :class:`AdapterSync` writes the adapter in PEFT's format
  (``adapter_model.safetensors`` + ``adapter_config.json``) to a folder of its own per policy version and calls
  each engine's ``load_adapter``: rank 16 on every linear layer is ~3.6% of SmolLM2-135M's weights.
* **Never stale.** Every push gets a name and an integer id that are new for that policy version
  (:meth:`Adapter.for_version`), so nothing an engine cached for an older version — a prefix-cache block (vLLM keys
  them by adapter id), an adapter slot, a server's adapter registry — can serve a newer request. An engine bumps its
  ``version`` only once the new adapter is loaded; a load that fails raises :class:`AdapterPushError` and the
  version stays where it was, so no record is ever tagged with a version that did not sample it.

Engines that serve adapters implement ``load_adapter(adapter: Adapter) -> int`` (the new version) and say so with
``serves_adapters = True`` (:mod:`gym_llm_adapters.engines.base`).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "Adapter", "AdapterPushError", "AdapterSync", "LoraSettings",
           "adapter_parameters", "add_lora", "memory_dir", "save_adapter"]

logger = logging.getLogger(__name__)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


class AdapterPushError(RuntimeError):
    """An engine did not take a new adapter: the run must stop (its version was not bumped)."""


@dataclass(frozen=True, kw_only=True)
class LoraSettings:
    """A LoRA adapter's shape.

    Attributes:
        rank: ``r``, the rank of ``B A`` (>= 1, at most the smallest in/out width of a targeted layer).
        alpha: the update is scaled by ``alpha / rank``; default ``2 * rank`` (a scale of 2).
        dropout: dropout on the adapter's input during training (0 keeps training deterministic).
        target_modules: ``"all-linear"`` (every linear layer but the output head: PEFT's rule) or the module
            names to adapt (``("q_proj", "v_proj")``: matched as PEFT matches them, by name suffix).
    """

    rank: int
    alpha: float | None = None
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = "all-linear"

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"LoRA rank must be an int >= 1, got {self.rank!r}: use e.g. 16 (--lora-rank 16; 8 to 32 "
                             "is usual), or leave it unset to train every weight.")
        if self.alpha is not None and not (isinstance(self.alpha, (int, float)) and self.alpha > 0):
            raise ValueError(f"LoRA alpha must be a number > 0 (default 2 * rank), got {self.alpha!r}.")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}.")
        if isinstance(self.target_modules, (list, tuple)):
            object.__setattr__(self, "target_modules", tuple(str(m) for m in self.target_modules))
            if not self.target_modules:
                raise ValueError("LoRA target_modules must name at least one module (or be 'all-linear').")
        elif self.target_modules != "all-linear":
            raise ValueError(f"LoRA target_modules must be 'all-linear' or a list of module names, got "
                             f"{self.target_modules!r}.")

    @property
    def scale_alpha(self) -> float:
        return float(self.alpha) if self.alpha is not None else 2.0 * self.rank

    def peft_config(self) -> Any:
        from peft import LoraConfig

        targets = self.target_modules if self.target_modules == "all-linear" else list(self.target_modules)
        return LoraConfig(r=self.rank, lora_alpha=self.scale_alpha, lora_dropout=float(self.dropout),
                          target_modules=targets, task_type="CAUSAL_LM", bias="none")

    def check(self, model: Any) -> None:
        """Raise ``ValueError`` (with the fix) when this adapter cannot go on ``model``: a target module it does not
        have, or a rank above a targeted layer's width."""
        import torch

        linear = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
        output = getattr(model, "get_output_embeddings", lambda: None)()
        if self.target_modules == "all-linear":
            targets = {name: m for name, m in linear.items() if m is not output}
        else:
            targets = {name: m for name, m in linear.items()
                       if any(name == t or name.endswith("." + t) for t in self.target_modules)}
            missing = [t for t in self.target_modules
                       if not any(name == t or name.endswith("." + t) for name in linear)]
            if missing:
                names = sorted({name.rsplit(".", 1)[-1] for name in linear if linear[name] is not output})
                raise ValueError(f"LoRA target_modules {missing} are not linear layers of this model; its linear "
                                 f"layers are {names}: name some of them (--lora-target-modules "
                                 f"{' '.join(names[:2])}), or use 'all-linear'.")
        if not targets:
            raise ValueError("LoRA found no linear layer to adapt in this model.")
        width = min(min(m.in_features, m.out_features) for m in targets.values())
        if self.rank > width:
            raise ValueError(f"LoRA rank {self.rank} is above the narrowest targeted layer's width ({width}): a rank "
                             f"can be at most {width} here (--lora-rank {min(16, width)}; 16 or 32 is usual).")


def add_lora(model: Any, settings: LoraSettings) -> Any:
    """``model`` wrapped by PEFT with a fresh LoRA adapter (``B = 0``: the wrapped model computes what ``model``
    did); only the adapter's parameters require gradients."""
    from peft import get_peft_model

    settings.check(model)
    return get_peft_model(model, settings.peft_config())


@dataclass(frozen=True, kw_only=True)
class Adapter:
    """One policy version's adapter, as engines load it.

    Attributes:
        path: a PEFT adapter folder (``adapter_model.safetensors`` + ``adapter_config.json``).
        version: the policy version an engine serving it has.
        name: unique to this run and version (engines key caches and registries by it).
        int_id: unique to the version, >= 1 (vLLM's ``lora_int_id``).
        rank: the adapter's rank (engines size their adapter slots by it).
        num_bytes: the size of the adapter's weights file (what a push moves).
    """

    path: Path
    version: int
    name: str
    int_id: int
    rank: int
    num_bytes: int

    @staticmethod
    def for_version(run_id: str, version: int) -> tuple[str, int]:
        """The name and id of ``version``'s adapter: new for every version, so no cache entry of another serves it."""
        return f"gym-llm-{run_id}-v{version}", version + 1

    @classmethod
    def from_folder(cls, path: str | Path, *, version: int, run_id: str) -> "Adapter":
        path = Path(path)
        config = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        name, int_id = cls.for_version(run_id, version)
        return cls(path=path, version=version, name=name, int_id=int_id, rank=int(config["r"]),
                   num_bytes=(path / ADAPTER_WEIGHTS).stat().st_size)


def save_adapter(model: Any, path: str | Path, tensors: dict[str, Any] | None = None) -> None:
    """Write ``model``'s (a PEFT model's) adapter to the folder ``path`` in PEFT's format, which ``peft`` and vLLM load
    as an adapter. ``tensors``: the adapter's tensors under PEFT's saved names, when the caller has them
    (:func:`adapter_tensors`); default: PEFT's ``get_peft_model_state_dict``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if tensors is None:
        from peft.utils import get_peft_model_state_dict

        tensors = get_peft_model_state_dict(model)
    save_file({name: tensor.detach().to("cpu").contiguous() for name, tensor in tensors.items()},
              str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    model.peft_config["default"].save_pretrained(str(path))


def adapter_parameters(model: Any) -> list[tuple[str, Any]]:
    """``(saved name, parameter)`` of every tensor PEFT saves for ``model``'s adapter, matched once by storage:
    PEFT's ``get_peft_model_state_dict`` walks the whole state dict on every call (48 ms for SmolLM2-135M here),
    reading these pairs takes a few ms. Raises ``ValueError`` when a saved tensor is not a parameter."""
    from peft.utils import get_peft_model_state_dict

    saved = get_peft_model_state_dict(model)
    by_storage = {tensor.data_ptr(): name for name, tensor in saved.items()}
    pairs = [(by_storage[p.data_ptr()], p) for _, p in model.named_parameters() if p.data_ptr() in by_storage]
    if sorted(name for name, _ in pairs) != sorted(saved):
        raise ValueError("the adapter's saved tensors are not all parameters of the model")
    return pairs


def memory_dir(min_free_bytes: int = 1 << 30) -> str | None:
    """``/dev/shm`` where it is a writable memory filesystem with at least ``min_free_bytes`` free (a push's folder
    is written and read back at once; a container's 64 MiB ``/dev/shm`` is too small for a large model's adapters),
    else None (the system's temporary folder)."""
    import os

    shm = "/dev/shm"
    try:
        stats = os.statvfs(shm)
    except OSError:
        return None
    free = stats.f_bavail * stats.f_frsize
    return shm if free >= min_free_bytes and os.access(shm, os.W_OK | os.X_OK) else None


class AdapterSync:
    """Pushes a PEFT model's adapter to engines that serve adapters, and keeps their versions in step (the LoRA
    counterpart of :class:`~gym_llm_adapters.weights.WeightSync`).

    Args:
        model: the trainer's PEFT model.
        engines: one engine or several; each must have ``serves_adapters`` and ``load_adapter``.
        root: where each version's adapter folder is written (default: a temporary folder removed on :meth:`close`).
        keep: how many of the newest adapter folders stay on disk (an engine may still read the previous one).
        run_id: part of every adapter's name (default: random), so two runs never share a name on one server.
    """

    def __init__(self, model: Any, engines: Any | Sequence[Any], *, root: str | Path | None = None, keep: int = 2,
                 run_id: str | None = None):
        self.model = model
        self.engines = [engines] if not isinstance(engines, (list, tuple)) else list(engines)
        if not self.engines:
            raise ValueError("AdapterSync needs at least one engine.")
        for engine in self.engines:
            if not getattr(engine, "serves_adapters", False):
                raise ValueError(f"{type(engine).__name__} does not serve LoRA adapters (it was not started with LoRA "
                                 "enabled, or cannot load them); start it with LoRA on or train without --lora-rank.")
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="gym_llm_adapters_", dir=memory_dir())) if root is None else Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = max(1, int(keep))
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.pushes = 0
        self.last_push_s = 0.0
        self.last_push_bytes = 0
        self._parameters: list[tuple[str, Any]] | None = None

    @property
    def version(self) -> int:
        return self.engines[0].version

    def push(self) -> int:
        """Write the current adapter under the next version's name and load it into every engine; returns the new
        (common) version. Raises :class:`AdapterPushError` when an engine refuses it or the versions disagree."""
        start = time.perf_counter()
        version = self.engines[0].version + 1
        path = self.root / f"v{version:07d}"
        if path.exists():
            shutil.rmtree(path)
        if self._parameters is None:
            self._parameters = adapter_parameters(self.model)
        save_adapter(self.model, path, {name: parameter for name, parameter in self._parameters})
        adapter = Adapter.from_folder(path, version=version, run_id=self.run_id)
        versions = []
        for engine in self.engines:
            try:
                versions.append(int(engine.load_adapter(adapter)))
            except Exception as e:
                raise AdapterPushError(f"{type(engine).__name__} did not load the adapter of policy version {version} "
                                       f"({type(e).__name__}: {e}); stopping: sampling must not go on from the old "
                                       "adapter") from e
        if set(versions) != {version}:
            raise AdapterPushError(f"the engines' versions after the adapter push are {versions}, expected {version}.")
        self._prune()
        self.last_push_s = time.perf_counter() - start
        self.last_push_bytes = adapter.num_bytes
        self.pushes += 1
        logger.debug("pushed adapter %s (%d bytes) in %.3f s", adapter.name, adapter.num_bytes, self.last_push_s)
        return version

    def _prune(self) -> None:
        folders = sorted(p for p in self.root.glob("v*") if p.is_dir())
        for old in folders[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
