"""State dicts laid out for Ray's object store.

A weight broadcast puts the tensors in the object store *once* and every engine actor reads them from
there. Torch tensors would be pickled as opaque bytes and copied on every read; numpy arrays are stored
as out-of-band buffers that actors on the same node map read-only from shared memory without a copy
(and that cross to another node once per node). So each tensor travels as its raw bytes (a ``uint8``
numpy view — which also carries ``bfloat16``, a dtype numpy lacks) plus its dtype and shape, and the
actor rebuilds torch views over those bytes. Engines copy the views into their own parameters.

A LoRA adapter travels the same way as :class:`PackedAdapter`: the bytes of its two files (a few MB at most; rank 16
on every linear layer of a 7B model is ~80 MB in bf16) plus its name, id, version and rank. Each engine actor writes
them to a folder of its own and loads that, so an actor on another machine needs no shared file system.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np

from gym_llm_adapters.engines.base import named_tensors

if TYPE_CHECKING:
    from gym_llm_adapters.lora import Adapter

__all__ = ["PackedAdapter", "PackedWeights"]


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


@dataclass(frozen=True)
class PackedAdapter:
    """A LoRA adapter (:class:`~gym_llm_adapters.lora.Adapter`) with its folder's files as bytes, for the object store.

    Attributes:
        name, int_id, version, rank: the adapter's (see :class:`~gym_llm_adapters.lora.Adapter`).
        files: ``(file name, bytes as a uint8 array)`` for each file of the folder (PEFT's config and weights).
    """

    name: str
    int_id: int
    version: int
    rank: int
    files: tuple[tuple[str, np.ndarray], ...]

    @classmethod
    def pack(cls, adapter: "Adapter") -> "PackedAdapter":
        """Read ``adapter``'s folder (its two PEFT files)."""
        from gym_llm_adapters.engines.base import check_adapter_folder
        from gym_llm_adapters.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS

        check_adapter_folder(adapter.path)
        files = tuple((name, np.frombuffer((Path(adapter.path) / name).read_bytes(), dtype=np.uint8))
                      for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS))
        return cls(adapter.name, int(adapter.int_id), int(adapter.version), int(adapter.rank), files)

    def unpack(self, root: str | Path, *, version: int | None = None) -> "Adapter":
        """Write the files to the new folder ``root/<name>`` and return the adapter served from there.
        ``version`` relabels it (an engine restarted at another version; the name and id stay)."""
        from gym_llm_adapters.lora import ADAPTER_WEIGHTS, Adapter

        folder = Path(root) / self.name
        if folder.exists():  # never rewrite the files of an adapter that may be served: names are new per version
            raise ValueError(f"An adapter named {self.name!r} was already unpacked in {root}; every version's adapter "
                             "needs a new name (Adapter.for_version).")
        folder.mkdir(parents=True)
        for name, data in self.files:
            (folder / name).write_bytes(data.tobytes())
        adapter = Adapter(path=folder, version=self.version, name=self.name, int_id=self.int_id, rank=self.rank,
                          num_bytes=(folder / ADAPTER_WEIGHTS).stat().st_size)
        return adapter if version is None else dataclasses.replace(adapter, version=int(version))

    @property
    def nbytes(self) -> int:
        return int(sum(data.nbytes for _, data in self.files))
