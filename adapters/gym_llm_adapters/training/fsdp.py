"""FSDP2 sharding of the policy in a data-parallel run (``torchrun ... train --sharding fsdp``; the default for a full
fine-tune under torchrun).

Each decoder layer is its own ``fully_shard`` unit and a thin root module, :class:`LogProbRoot`, holds the rest (the
embedding, the final norm, the output head): its ``forward`` *is* the trainer's log-prob call
(:func:`~gym_llm_adapters.logprobs.token_logprobs`), so FSDP2's root hook gathers the embedding and head shards for the
chunked head that call computes, though it calls the model's backbone and its head separately. Each rank then holds
``1/N`` of every weight, gradient and AdamW moment between uses (a layer's full weights exist only while it runs).

What the trainer does differently under FSDP2 (training/steps.py):

* **Gradients are summed, not averaged** (``set_gradient_divide_factor(1.0)``): the loss over a rank's share is
  already normalised by the global batch, as under DDP, so the reduced gradient is the one-process gradient.
* **Every rank runs the same number of forwards and backwards** per optimizer pass: FSDP2's all-gathers and
  reduce-scatters are collectives issued by module hooks, so a rank with fewer micro-batches (fewer rows, shorter
  rows) would leave the others waiting. The trainer takes the largest micro-batch count over the ranks and a rank short
  of it runs :func:`padding_pass` (one two-token row whose loss is multiplied by zero: its gradient is exactly zero).
  Each log-prob call is one backbone forward (no per-call token limit, no shared-prefix path: both would make the
  count depend on the rank's data).
* **Gradients are reduced once per optimizer pass**, at its last backward (``set_requires_gradient_sync``); earlier
  micro-batches accumulate unsharded gradients locally (as DDP's ``no_sync``).
* **Whole tensors where they leave the run**: the weight push to each rank's engine and the checkpoint gather every
  parameter (:func:`full_state_dict`, collective on every rank) and AdamW's moments (:func:`full_optimizer_state`); a
  checkpoint is therefore the same files as a one-process run's, and any run (one process, DDP or FSDP2) resumes it
  (:func:`load_optimizer_state` shards the moments again).

LoRA runs use DDP: the trainable adapter is small and PEFT's ``disable_adapter`` reference scope would run the sharded
base outside the root's forward. Which backend: ``gloo`` (CPU; FSDP2 runs there in torch >= 2.6) and ``nccl`` (CUDA).
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["LogProbRoot", "decoder_layers", "full_optimizer_state", "full_state_dict", "load_optimizer_state",
           "padding_pass", "shard_for_run", "shard_policy"]

logger = logging.getLogger(__name__)


def decoder_layers(model: Any) -> list[Any]:
    """The repeated blocks of a transformers causal LM (``model.model.layers`` and the like), each an FSDP2 unit.

    Raises:
        ValueError: the model has no ``ModuleList`` of layers FSDP2 could shard one by one.
    """
    import torch.nn as nn

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    for name in ("layers", "h", "blocks"):
        layers = getattr(decoder, name, None)
        if isinstance(layers, nn.ModuleList) and len(layers):
            return list(layers)
    raise ValueError(f"--sharding fsdp shards a causal LM layer by layer, but {type(model).__name__} has no list of "
                     "decoder layers (model.model.layers / .h / .blocks). Use --sharding ddp.")


try:
    import torch.nn as _nn

    _Module = _nn.Module
except ImportError:  # pragma: no cover - the adapters need torch; this keeps the module importable for docs
    _Module = object


class LogProbRoot(_Module):
    """The FSDP2 root: holds the causal LM; ``forward(input_ids, attention_mask, score_mask, **kwargs)`` returns
    :func:`~gym_llm_adapters.logprobs.token_logprobs` of it — ``(B, S)`` float32, the log-prob at scored positions."""

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def forward(self, input_ids: Any, attention_mask: Any, score_mask: Any, **kwargs: Any) -> Any:
        from gym_llm_adapters.logprobs import token_logprobs

        return token_logprobs(self.model, input_ids, attention_mask, score_mask, **kwargs)


def shard_policy(policy: Any, *, world: int, device: str) -> LogProbRoot:
    """Shard ``policy`` in place over ``world`` ranks (its parameters become ``DTensor`` shards) and return the root
    whose forward the trainer calls. Call it after the replicas are equal (rank 0's weights broadcast) and before the
    optimizer is built."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh("cuda" if device.startswith("cuda") else "cpu", (world,))
    for layer in decoder_layers(policy):
        fully_shard(layer, mesh=mesh)
    root = LogProbRoot(policy)
    fully_shard(root, mesh=mesh)
    for module in root.modules():  # each unit's own setting (these two do not recurse)
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # summed: each rank's loss is already over the global batch
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM; the factor is 1)
    return root


def shard_for_run(policy: Any, dp: Any, *, sharding: str, device: str) -> LogProbRoot | None:
    """The trainer's call: :func:`shard_policy` over ``dp``'s ranks; or, under ``--sharding auto``, None for a model
    without a list of decoder layers (``dp.strategy`` becomes ``"ddp"``: whole replicas, with a warning)."""
    try:
        decoder_layers(policy)
    except ValueError:
        if sharding == "fsdp":
            raise
        logger.warning("--sharding auto: %s has no list of decoder layers to shard; keeping whole replicas (DDP)",
                       type(policy).__name__)
        dp.strategy = "ddp"
        return None
    return shard_policy(policy, world=dp.world, device=device)


def padding_pass(root: LogProbRoot, device: str) -> Any:
    """One forward of a two-token row through every layer and the head; returns a loss whose value and gradient are
    exactly zero (``0 * log p``; the log-prob is finite: no top-p, temperature 1). A rank with fewer micro-batches
    than another runs it (and its backward) so both issue the same collectives."""
    import torch

    ids = torch.zeros(1, 2, dtype=torch.long, device=device)
    ones = torch.ones(1, 2, dtype=torch.long, device=device)
    score = torch.tensor([[0, 1]], dtype=torch.bool, device=device)
    return 0.0 * root(ids, ones, score).sum()


def _full(tensor: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_state_dict(model: Any, *, cpu: bool = True) -> dict[str, Any]:
    """The model's state dict with every sharded tensor gathered whole (collective: every rank calls it, in the same
    order). Tied weights stay one tensor (gathered once)."""
    seen: dict[int, Any] = {}
    out = {}
    for name, tensor in model.state_dict(keep_vars=True).items():  # the parameters themselves: tied ones are one
        key = id(tensor)
        if key not in seen:
            full = _full(tensor.detach())
            seen[key] = full.cpu() if cpu else full
        out[name] = seen[key]
    return out


def full_optimizer_state(optimizer: Any) -> dict[str, Any]:
    """``optimizer.state_dict()`` with every sharded moment gathered whole (collective): the same format, keyed by
    parameter index, as a one-process run's, so checkpoints do not depend on the sharding."""
    state = optimizer.state_dict()
    return {"state": {index: {k: _full(v).cpu() if hasattr(v, "shape") else v for k, v in entry.items()}
                      for index, entry in state["state"].items()},
            "param_groups": state["param_groups"]}


def load_optimizer_state(optimizer: Any, saved: dict[str, Any]) -> None:
    """Load a whole-tensor optimizer state (any run's checkpoint) into an optimizer over sharded parameters: each
    moment shaped like its parameter is cut to this rank's shard (every rank reads the same file: no communication)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, entry in saved["state"].items():
        param = params[int(index)]
        state[index] = {
            k: distribute_tensor(v.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
            if isinstance(param, DTensor) and hasattr(v, "shape") and tuple(v.shape) == tuple(param.shape) else v
            for k, v in entry.items()}
    optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
