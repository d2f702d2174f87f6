"""Training-math checks on a GPU (CUDA), for whoever has one: the CPU suite runs the same checks on CPU.

1. **Mixed precision** (issue 18): 10 AdamW steps at lr 1e-5 on a SmolLM2-shaped Qwen2 (hidden 576, 8 layers, vocab
   49,152, random init) three ways — fp32; the trainer's ``--dtype bfloat16`` (fp32 master weights and AdamW state,
   bf16 autocast); plain bf16 weights — and how far each moved the weights (relative L2) and which fraction of
   parameters changed at all. Mixed precision must move like fp32; plain bf16 loses most updates.
2. **The sampled distribution** (issue 18): ``token_logprobs(..., temperature=0.7, top_p=0.9)`` on the GPU against a
   float64 reference of the renormalised kept set, values and gradient.
3. **A LoRA step** (issue 46): the tiny model with a rank-16 adapter on every linear layer (PEFT), three AdamW steps
   of the adapter under the trainer's bf16 autocast, then the adapter pushed (``AdapterSync``) to an ``HFEngine`` on
   the same device. The base weights must be bit-identical afterwards, the adapter must have moved, and the engine's
   log-probs of a fixed sequence must equal the trainer's with the adapter on (fp32, 1e-4) and differ from the base's.

    python scripts/gpu_checks.py                   # all three; needs torch with CUDA and transformers
    python scripts/gpu_checks.py --checks lora     # some of them (precision, sampled, lora); on CPU without a GPU

Checks 1 and 2 load only torch, transformers and two files of this package (no gymnasium), so they run on a bare GPU
image; check 3 needs the package and peft (``pip install -e '.[lora]'``) and says so, skipped, where they are missing.
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


def lora_check(device: str, steps: int = 3, rank: int = 16) -> dict[str, object]:
    """Check 3 (module docstring): a LoRA step on ``device`` and a push to an HF engine there. ``{"skipped": why}``
    when the package or peft cannot be imported."""
    sys.path[:0] = [str(ROOT.parents[1]), str(ROOT.parent)]  # the repository: gym_llm and gym_llm_adapters
    try:
        from transformers import AutoModelForCausalLM

        from gym_llm_adapters.engines import HFEngine
        from gym_llm_adapters.lora import AdapterSync, LoraSettings, add_lora
        from gym_llm_adapters.models.tiny import tiny_model_dir
        import peft  # noqa: F401
    except ImportError as e:
        return {"skipped": f"{e} (pip install -e '.[lora]' in the repository)"}
    path = tiny_model_dir()
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    before = {name: p.detach().clone() for name, p in base.named_parameters()}
    policy = add_lora(base, LoraSettings(rank=rank))
    model = policy.get_base_model()  # the transformers model, LoRA layers in it (what the trainer runs)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, base.config.vocab_size, (4, 48), generator=g).to(device)  # (B, T)
    attention = torch.ones_like(ids)
    mask = torch.zeros_like(ids)
    mask[:, 16:] = 1
    opt = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        with precision.autocast(device, "bfloat16"):
            lp = logprobs.token_logprobs(model, ids, attention, mask)
        (-(lp.float() * mask).sum() / mask.sum()).backward()
        opt.step()
        opt.zero_grad()
    after = {name.replace(".base_layer.", "."): p for name, p in model.named_parameters() if "lora_" not in name}
    moved = max(float(p.detach().abs().max()) for name, p in model.named_parameters() if "lora_B" in name)
    with torch.no_grad():
        trainer = logprobs.token_logprobs(model, ids, attention, mask)[mask.bool()]  # fp32, adapter on
        with policy.disable_adapter():
            base_lp = logprobs.token_logprobs(model, ids, attention, mask)[mask.bool()]
    engine = HFEngine(str(path), device=device, dtype=torch.float32, lora_rank=rank)
    sync = AdapterSync(policy, engine)
    try:
        version = sync.push()
        served = torch.stack([torch.as_tensor(row, device=device) for row in engine.logprobs(ids.cpu().numpy())])
    finally:
        sync.close()
        engine.close()
    served = served[mask.bool()]
    return {"base_unchanged": all(torch.equal(after[name], before[name]) for name in before) and len(after) == len(before),
            "adapter_b_max_abs": moved, "engine_version": version,
            "engine_vs_trainer_max_abs_err": float((served - trainer).abs().max()),
            "engine_vs_base_max_abs_diff": float((served - base_lp).abs().max())}


def lora_ok(result: dict[str, object]) -> bool:
    return ("skipped" in result or (bool(result["base_unchanged"]) and float(result["adapter_b_max_abs"]) > 0
                                    and result["engine_version"] == 1
                                    and float(result["engine_vs_trainer_max_abs_err"]) < 1e-4
                                    and float(result["engine_vs_base_max_abs_diff"]) > 1e-3))


CHECKS = ("precision", "sampled", "lora")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Training-math checks on a GPU (module docstring).")
    parser.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated, of {', '.join(CHECKS)} (default: all)")
    checks = parser.parse_args(argv).checks.split(",")
    unknown = sorted(set(checks) - set(CHECKS))
    if unknown:
        parser.error(f"--checks: unknown {unknown}; choose from {', '.join(CHECKS)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    start = time.perf_counter()
    report: dict[str, object] = {"device": name, "torch": torch.__version__}
    ok = True
    if "precision" in checks:
        moves = precision_check(device)
        fp32 = moves["fp32"][0]
        report["movement_vs_fp32"] = movement = {k: round(v[0] / fp32, 3) for k, v in moves.items()}
        report["fraction_changed"] = changed = {k: round(v[1], 3) for k, v in moves.items()}
        ok &= 0.8 < movement["mixed"] < 1.25 and changed["mixed"] > 0.95 * changed["fp32"]
    if "sampled" in checks:
        report["sampled_distribution"] = sampled = sampled_distribution_check(device)
        ok &= sampled["value_max_abs_err"] < 1e-4 and sampled["grad_max_rel_err"] < 1e-3
    if "lora" in checks:
        report["lora"] = lora = lora_check(device)
        ok &= lora_ok(lora)
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(report, indent=1))
    if "skipped" in report.get("lora", {}):
        print(f"lora: SKIPPED ({report['lora']['skipped']})")
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
