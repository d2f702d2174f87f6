"""How close a training step runs to the machine's limit: tokens per second and model-FLOPs utilisation per phase.

MFU here is ``model FLOPs / (seconds * peak)``, where

* **model FLOPs** count the matrix multiplies a token costs: ``2 N`` per token forward, ``N`` the parameters that
  multiply activations (every weight matrix, the output head; not norms' scales or biases, nor the input embedding's
  lookup unless the head shares it), so ``6 N`` for a full fine-tune's forward + backward, ``4 N`` with a LoRA adapter (the frozen weights need no
  weight gradient) and ``2 N`` for the reference's forward and for generation. Attention's own ``QK^T`` and ``AV``
  (``4 L S d`` per token at context ``S``) are left out: at the lengths these runs use they are a few percent.
* **peak** is measured, not quoted: :func:`matmul_peak` times square matrix multiplies on the trainer's device in the
  run's dtype (a fraction of a second at the start of RL), so the ratio says whether a phase is compute-bound (near
  the peak) or waiting (memory, the engine, the envs, Python).

The trainer logs ``perf/<phase>_tokens_per_s`` and ``perf/<phase>_mfu`` every GRPO step (``policy``, ``reference``,
``generate``) and ``gym-llm train`` prints the run's means.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["matmul_peak", "matmul_params", "phase_throughput", "format_throughput"]


def matmul_peak(device: Any = "cpu", dtype: str = "float32", *, size: int | None = None, seconds: float = 0.3) -> float:
    """The best FLOP/s of ``size x size`` matrix multiplies on ``device`` in ``dtype`` over about ``seconds``
    (``2 size^3`` FLOPs each; default size 1024 on CPU, 4096 on CUDA)."""
    import torch

    device = torch.device(device)
    size = size or (4096 if device.type == "cuda" else 1024)
    torch_dtype = getattr(torch, dtype)
    a = torch.randn(size, size, device=device).to(torch_dtype)
    b = torch.randn(size, size, device=device).to(torch_dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    a @ b  # warm-up (kernel selection, allocation)
    sync()
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == 0.0:
        start = time.perf_counter()
        a @ b
        sync()
        best = max(best, 2 * size ** 3 / max(time.perf_counter() - start, 1e-9))
    return best


def matmul_params(model: Any) -> int:
    """``N``: parameters that multiply activations — the weight matrices (2-D; norms' scales and biases are
    element-wise), but not the input embedding, which is a lookup (counted once when the output head shares it)."""
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skip = set()
    if embedding is not None and (head is None or head.weight is not embedding.weight):
        skip.add(id(embedding.weight))
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen or id(p) in skip or p.dim() < 2:
            continue
        seen.add(id(p))
        total += p.numel()
    return int(total)


def phase_throughput(*, params: int, peak: float, seconds: float, tokens: int, flops_per_param: int) -> dict[str, float]:
    """``{"tokens_per_s", "mfu"}`` of a phase that handled ``tokens`` tokens in ``seconds`` at
    ``flops_per_param * params`` FLOPs per token, against ``peak`` FLOP/s."""
    if seconds <= 0 or tokens <= 0:
        return {"tokens_per_s": 0.0, "mfu": 0.0}
    return {"tokens_per_s": tokens / seconds, "mfu": flops_per_param * params * tokens / (seconds * peak)}


def format_throughput(perf: dict[str, float], peak: float, dtype: str) -> str:
    """``"policy 812 tokens/s (MFU 31%), reference ..., generate ... of a measured 412 GFLOP/s float32 matmul"``."""
    parts = []
    for phase in ("policy", "reference", "generate"):
        if f"perf/{phase}_tokens_per_s" in perf:
            parts.append(f"{phase} {perf[f'perf/{phase}_tokens_per_s']:,.0f} tokens/s "
                         f"(MFU {perf[f'perf/{phase}_mfu']:.0%})")
    return ", ".join(parts) + f" of a measured {peak / 1e9:,.0f} GFLOP/s {dtype} matmul peak"
