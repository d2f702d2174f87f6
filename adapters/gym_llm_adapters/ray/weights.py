"""State dicts laid out for Ray's object store.

A weight broadcast puts the tensors in the object store *once* and every engine actor reads them from
there. Torch tensors would be pickled as opaque bytes and copied on every read; numpy arrays are stored
as out-of-band buffers that actors on the same node map read-only from shared memory without a copy
(and that cross to another node once per node). So each tensor travels as its raw bytes (a ``uint8``
numpy view — which also carries ``bfloat16``, a dtype numpy lacks) plus its dtype and shape, and the
actor rebuilds torch views over those bytes. Engines copy the views into their own parameters.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from gym_llm_adapters.engines.base import named_tensors

__all__ = ["PackedWeights"]


@dataclass(frozen=True)
class PackedWeights:
    """Named tensors as raw byte arrays (see the module docstring).

    Attributes:
        names: checkpoint names, in the order given.
        dtypes: torch dtype names (``"float32"``, ``"bfloat16"``, ...).
        shapes: each tensor's shape.
        buffers: each tensor's bytes, ``(numel * element_size,)`` uint8.
    """

    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    buffers: tuple[np.ndarray, ...]

    @classmethod
    def pack(cls, weights: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> "PackedWeights":
        """Pack a state dict or ``(name, tensor)`` pairs (any device; copied to CPU when needed)."""
        import torch

        names, dtypes, shapes, buffers = [], [], [], []
        for name, tensor in named_tensors(weights):
            if not isinstance(tensor, torch.Tensor):
                tensor = torch.as_tensor(np.asarray(tensor))
            tensor = tensor.detach().to("cpu").contiguous()
            names.append(name)
            dtypes.append(str(tensor.dtype).removeprefix("torch."))
            shapes.append(tuple(tensor.shape))
            buffers.append(tensor.reshape(-1).view(torch.uint8).numpy())
        return cls(tuple(names), tuple(dtypes), tuple(shapes), tuple(buffers))

    def items(self) -> list[tuple[str, Any]]:
        """``(name, tensor)`` pairs; the tensors are views of the buffers (read-only when they come from the
        object store: engines copy them, never write to them)."""
        import torch

        out = []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            for name, dtype, shape, buffer in zip(self.names, self.dtypes, self.shapes, self.buffers):
                out.append((name, torch.from_numpy(buffer).view(getattr(torch, dtype)).reshape(shape)))
        return out

    @property
    def nbytes(self) -> int:
        return int(sum(b.nbytes for b in self.buffers))

    def __len__(self) -> int:
        return len(self.names)
