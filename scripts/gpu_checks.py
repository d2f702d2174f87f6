"""Training-math checks on a GPU (CUDA), for whoever has one: the CPU suite runs the same checks on CPU.

1. **Mixed precision** (issue 18): 10 AdamW steps at lr 1e-5 on a SmolLM2-shaped Qwen2 (hidden 576, 8 layers, vocab
   49,152, random init) three ways — fp32; the trainer's ``--dtype bfloat16`` (fp32 master weights and AdamW state,
   bf16 autocast); plain bf16 weights — and how far each moved the weights (relative L2) and which fraction of
   parameters changed at all. Mixed precision must move like fp32; plain bf16 loses most updates.
2. **The sampled distribution** (issue 18): ``token_logprobs(..., temperature=0.7, top_p=0.9)`` on the GPU against a
   float64 reference of the renormalised kept set, values and gradient.

    python scripts/gpu_checks.py            # needs torch with CUDA and transformers; imports nothing else

Only torch, transformers and two files of this package are loaded (no gymnasium), so it runs on a bare GPU image.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1] / "adapters" / "gym_llm_adapters"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


logprobs = _load("gym_llm_logprobs", ROOT / "logprobs.py")
precision = _load("gym_llm_precision", ROOT / "training" / "precision.py")


def model(device: str, dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype)


def precision_check(device: str, steps: int = 10, lr: float = 1e-5) -> dict[str, tuple[float, float]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 49152, (8, 256), generator=g).to(device)
    attention = torch.ones_like(ids)
    mask = torch.zeros_like(ids)
    mask[:, 64:] = 1
    out = {}
    for mode in ("fp32", "mixed", "pure_bf16"):
        net = model(device, torch.bfloat16 if mode == "pure_bf16" else torch.float32).train()
        before = {name: p.detach().clone() for name, p in net.named_parameters()}
        opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
        for _ in range(steps):
            with precision.autocast(device, "bfloat16" if mode == "mixed" else "float32"):
                lp = logprobs.token_logprobs(net, ids, attention, mask)
            loss = -(lp.float() * mask).sum() / mask.sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
        out[mode] = precision.weight_movement(before, net)
        del net, opt
        torch.cuda.empty_cache() if device.startswith("cuda") else None
    return out


def sampled_distribution_check(device: str) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(64, 576, generator=g).to(device).requires_grad_(True)
    weight = (torch.randn(49152, 576, generator=g) * 0.05).to(device).requires_grad_(True)
    targets = torch.randint(0, 49152, (64,), generator=g).to(device)
    T, P = 0.7, 0.9
    got = logprobs._LinearTokenLogProb.apply(hidden, weight, None, targets, 1 / T, 16, 0, P)
    with torch.no_grad():  # float64 reference: sort each row, keep while the mass before is < P, plus the target
        z = (hidden.double() @ weight.double().t()) / T
        probs = z.softmax(-1)
        order = probs.argsort(-1, descending=True)
        sorted_p = probs.gather(1, order)
        keep_sorted = (sorted_p.cumsum(-1) - sorted_p) < P
        keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
        keep[torch.arange(64), targets] = True
    ref = ((hidden.double() @ weight.double().t()) / T).masked_fill(~keep, float("-inf")).log_softmax(-1)
    want = ref.gather(1, targets[:, None]).squeeze(1)
    up = torch.randn(64, generator=g, dtype=torch.float64).to(device)
    g_got = torch.autograd.grad((got.double() * up).sum(), (hidden, weight))
    g_want = torch.autograd.grad((want * up).sum(), (hidden, weight))
    rel = max(float((a.double() - b).norm() / b.norm()) for a, b in zip(g_got, g_want))
    return {"value_max_abs_err": float((got.detach().double() - want).abs().max()), "grad_max_rel_err": rel}


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    start = time.perf_counter()
    moves = precision_check(device)
    fp32 = moves["fp32"][0]
    report = {"device": name, "torch": torch.__version__,
              "movement_vs_fp32": {k: round(v[0] / fp32, 3) for k, v in moves.items()},
              "fraction_changed": {k: round(v[1], 3) for k, v in moves.items()},
              "sampled_distribution": sampled_distribution_check(device),
              "seconds": round(time.perf_counter() - start, 1)}
    print(json.dumps(report, indent=1))
    ok = (0.8 < report["movement_vs_fp32"]["mixed"] < 1.25
          and report["fraction_changed"]["mixed"] > 0.95 * report["fraction_changed"]["fp32"]
          and report["sampled_distribution"]["value_max_abs_err"] < 1e-4
          and report["sampled_distribution"]["grad_max_rel_err"] < 1e-3)
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
