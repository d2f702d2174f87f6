"""Started by tests/adapters/training/test_fsdp.py as ``torchrun --nproc-per-node 2 -m tests.adapters.training.fsdp_grads
OUT``: the tiny model with tied embeddings, sharded by :func:`~gym_llm_adapters.training.fsdp.shard_policy`; rank 0
runs two micro-batches, rank 1 one and a :func:`padding_pass` (the uneven case the trainer pads), gradients reduced at
the last backward only; one AdamW step; the optimizer state gathered whole and loaded back into fresh shards. Each rank
writes its whole gradients, weights, state dict and moments to ``OUT/rank-<r>.pt``; the test redoes it all in one
process."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from gym_llm_adapters.training import fsdp
from tests.adapters.training.fsdp_case import batch, build_model, loss_of, ROWS


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model()
    root = fsdp.shard_policy(model, world=world, device="cpu")
    ids, mask, score = batch()
    mine = ROWS[rank::world]  # 4 rows each
    parts = [mine[:2], mine[2:]] if rank == 0 else [mine]
    count = 2
    for j in range(count):
        root.set_requires_gradient_sync(j == count - 1)
        loss = loss_of(root(ids[parts[j]], mask[parts[j]], score[parts[j]]), score) if j < len(parts) else \
            fsdp.padding_pass(root, "cpu")
        loss.backward()
    grads = {k: p.grad.full_tensor() for k, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    optimizer.step()
    moments = fsdp.full_optimizer_state(optimizer)
    again = torch.optim.AdamW(model.parameters(), lr=1e-2)  # fresh, then the whole moments cut back to shards
    fsdp.load_optimizer_state(again, moments)
    reloaded = fsdp.full_optimizer_state(again)
    state = fsdp.full_state_dict(model)
    torch.save({"grads": grads, "state": state, "moments": moments, "reloaded": reloaded,
                "tied": state["lm_head.weight"] is state["model.embed_tokens.weight"],
                "parameter_type": type(next(model.parameters())).__name__}, out / f"rank-{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
