"""Data-parallel training over ``torch.distributed`` (``torchrun --nproc-per-node N -m gym_llm_adapters.cli train``).

Each of the N ranks holds a full copy of the policy and its own engine, generates its share of the step's groups
(``num_tasks / N`` prompts, each ``group_size`` times, from its own env seeds), scores them, and computes the loss
over its share **normalised by the global batch** (token counts and row counts summed over the ranks). The gradients
are then summed over the ranks in one all-reduce per optimizer pass, so every rank takes the same AdamW step and the
replicas stay identical: the weights after K steps are those a single process would reach on the same global batch
(tests/adapters/training/test_data_parallel.py checks this). Groups never straddle ranks, so the group baseline is
local; only the sums below cross the wire.

Which sharding (``--sharding``): **FSDP2** (``fully_shard``; :mod:`~gym_llm_adapters.training.fsdp`) for a full
fine-tune, on ``gloo`` (CPU) and ``nccl`` (CUDA) alike: each rank holds ``1/N`` of every weight, gradient and AdamW
moment, and the gradients are reduce-scattered instead of all-reduced. **DDP's algorithm** (whole replicas, one flat
gradient all-reduce per optimizer pass: :meth:`DataParallel.all_reduce_grads`) for a LoRA run, whose trainable
adapter is small, or on request (``--sharding ddp``). Both reach the same weights (the tests compare each with one
process).

Rank 0 is the one writer: metrics, rollouts (every rank's trajectories gathered, in rank order), checkpoints,
evaluations and the progress bar. Ctrl-C stops every rank after the same step (the stop flag is all-reduced).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["DataParallel", "DataParallelError", "data_parallel_from_env"]

logger = logging.getLogger(__name__)


class DataParallelError(ValueError):
    """A data-parallel set-up that cannot run (refused before any model loads)."""


@dataclass
class DataParallel:
    """This process's place in a data-parallel run.

    Attributes:
        rank / world / local_rank: from torchrun's ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (CUDA).
        strategy: ``"fsdp"`` (FSDP2 shards) or ``"ddp"`` (whole replicas); :func:`sharding_strategy`.
    """

    rank: int
    world: int
    local_rank: int
    backend: str
    strategy: str = "ddp"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def device(self, device: str) -> str:
        """The rank's device: ``cuda`` becomes ``cuda:LOCAL_RANK``; ``cpu`` stays."""
        return f"cuda:{self.local_rank}" if device == "cuda" else device

    # --------------------------------------------------------------------------------- collectives
    def sum(self, *values: float) -> list[float]:
        """Each value summed over the ranks (float64)."""
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return [float(v) for v in t.cpu()]

    def max(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def any(self, flag: bool) -> bool:
        """True on every rank when it is True on any (a stop request, a skipped step)."""
        return self.max(1.0 if flag else 0.0) > 0

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0, in rank order (None on the others)."""
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.world if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` on every rank, in rank order."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def all_reduce_grads(self, params: Iterable[Any]) -> None:
        """Sum the gradients of ``params`` over the ranks, in place (one flat buffer per dtype: few messages). A
        parameter without a gradient on this rank (no rows this step) counts as zeros, so every rank sends the same
        shapes."""
        import torch
        import torch.distributed as dist

        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        by_dtype: dict[Any, list[Any]] = {}
        for p in params:
            by_dtype.setdefault(p.grad.dtype, []).append(p)
        for group in by_dtype.values():
            flat = torch.cat([p.grad.reshape(-1) for p in group])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for p in group:
                n = p.grad.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
                offset += n

    def broadcast_params(self, model: Any) -> None:
        """Rank 0's parameters and buffers to every rank (the replicas start identical whatever each loaded)."""
        import torch.distributed as dist

        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def _comm_device(self) -> str:
        return f"cuda:{self.local_rank}" if self.backend == "nccl" else "cpu"


def data_parallel_from_env(config: Any) -> DataParallel | None:
    """The run's :class:`DataParallel` when started by ``torchrun`` with more than one process (the process group is
    initialised here, once), else None. Refuses set-ups that cannot run, with the fix:

    * ``num_tasks`` not divisible by the number of ranks (each rank generates whole groups);
    * more ranks on a node than GPUs (each rank needs its own device for its policy and engine);
    * a device other than CPU or CUDA (no torch.distributed backend for it here).
    """
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return None
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    check_data_parallel(config, world=world, local_world=local_world)
    import torch.distributed as dist

    from gym_llm_adapters.training.setup import resolve_device

    device = resolve_device(config.device)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if not dist.is_initialized():
        if backend == "nccl":
            import torch

            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend)
    dp = DataParallel(rank=rank, world=world, local_rank=local_rank, backend=backend,
                      strategy=sharding_strategy(config))
    if dp.is_main:
        how = "FSDP2: each rank holds 1/%d of the weights, gradients and optimizer state" % world \
            if dp.strategy == "fsdp" else "DDP: whole replicas, gradients all-reduced"
        logger.info("data-parallel: %d ranks, backend %s, %s; %d of the %d groups per rank per step", world, backend,
                    how, config.num_tasks // world, config.num_tasks)
    return dp


def sharding_strategy(config: Any) -> str:
    """``"fsdp"`` or ``"ddp"`` for ``config.sharding`` (``"auto"``: FSDP2 for a full fine-tune, DDP for LoRA)."""
    sharding = getattr(config, "sharding", "auto")
    if sharding == "auto":
        return "ddp" if getattr(config, "lora_rank", None) is not None or not fsdp2_available() else "fsdp"
    if sharding == "fsdp" and not fsdp2_available():
        import torch

        raise DataParallelError(f"--sharding fsdp needs FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6); this "
                                f"torch is {torch.__version__}. Upgrade torch, or use --sharding ddp.")
    return sharding


def fsdp2_available() -> bool:
    """Whether this torch has FSDP2's ``fully_shard`` (torch >= 2.6; gloo and nccl both run it)."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def check_data_parallel(config: Any, *, world: int, local_world: int) -> None:
    """The refusals of :func:`data_parallel_from_env`, without starting anything (the CLI calls it first)."""
    if config.num_tasks % world:
        raise DataParallelError(
            f"data-parallel training with {world} ranks needs --num-tasks divisible by {world} (each rank generates "
            f"whole groups); got --num-tasks {config.num_tasks}. Use --num-tasks "
            f"{max(world, config.num_tasks - config.num_tasks % world)} or {config.num_tasks + world - config.num_tasks % world}, "
            f"or --nproc-per-node that divides {config.num_tasks}.")
    if config.algorithm == "sft" or config.sft_warmup_steps:
        if config.sft_batch_size % world:
            raise DataParallelError(
                f"data-parallel SFT with {world} ranks needs --sft-batch-size divisible by {world} (each rank takes an "
                f"equal share of the minibatch); got {config.sft_batch_size}.")
    if getattr(config, "async_steps", 0):
        raise DataParallelError(
            f"--async-steps {config.async_steps} with {world} ranks is not supported yet (each rank would need its own "
            "overlapped engine server); run the ranks synchronously (--async-steps 0) or one process with --async-steps.")
    sharding_strategy(config)  # --sharding fsdp on a torch without FSDP2
    from gym_llm_adapters.training.setup import resolve_device

    device = resolve_device(config.device)
    if device.startswith("cuda"):
        import torch

        count = torch.cuda.device_count()
        if local_world > count:
            raise DataParallelError(
                f"{local_world} ranks on this node but {count} GPU(s): each rank needs its own GPU for its policy copy "
                f"and its engine. Start torchrun with --nproc-per-node {count} (or fewer).")
        if ":" in device:
            raise DataParallelError(
                f"--device {device} names one GPU, but data-parallel ranks each take their own (cuda:LOCAL_RANK). "
                "Pass --device cuda (or auto).")
    elif device != "cpu":
        raise DataParallelError(
            f"data-parallel training runs on cpu (gloo) or cuda (nccl); --device {device} has neither backend here. "
            "Pass --device cpu or cuda, or run one process.")
