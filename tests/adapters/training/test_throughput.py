"""MFU's two halves checked from outside: the model FLOPs per token against torch's own FLOP counter, and the
measured matmul peak against a timed matmul of another size."""

from __future__ import annotations

import time

import pytest
import torch

from gym_llm_adapters.training.throughput import format_throughput, matmul_params, matmul_peak, phase_throughput


@pytest.mark.parametrize("tied", [False, True])
def test_two_n_per_token_is_what_torch_counts_for_a_forward(tiny_model_path, tied):
    """torch.utils.flop_counter counts every matmul of a real forward; 2 N per token (N: matmul_params) is that count
    less attention's QK^T and AV, which at 16 tokens is under 2%."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model_path, tie_word_embeddings=tied)
    model = AutoModelForCausalLM.from_config(config).eval()
    n = matmul_params(model)
    embedding = model.get_input_embeddings().weight.numel()
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)  # shared weights once
    assert n == (matrices if tied else matrices - embedding)
    tokens = 16
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randint(0, config.vocab_size, (1, tokens)))
    counted = counter.get_total_flops()
    assert 2 * n * tokens <= counted <= 1.02 * 2 * n * tokens


def test_the_peak_is_a_real_matmul_rate():
    peak = matmul_peak("cpu", "float32", size=256, seconds=0.1)
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    a @ b
    start = time.perf_counter()
    for _ in range(5):
        a @ b
    rate = 5 * 2 * 384 ** 3 / (time.perf_counter() - start)
    assert 0.05 * rate < peak < 20 * rate  # the same order of magnitude as a matmul timed here by hand


def test_phase_throughput_is_flops_over_time_over_peak():
    perf = phase_throughput(params=1_000_000, peak=1e12, seconds=2.0, tokens=4000, flops_per_param=6)
    assert perf == {"tokens_per_s": 2000.0, "mfu": pytest.approx(6 * 1e6 * 4000 / (2.0 * 1e12))}
    assert phase_throughput(params=1, peak=1.0, seconds=0.0, tokens=5, flops_per_param=2) == {"tokens_per_s": 0.0,
                                                                                              "mfu": 0.0}
    text = format_throughput({"perf/policy_tokens_per_s": 2000.0, "perf/policy_mfu": 0.012}, 1e12, "bfloat16")
    assert text == "policy 2,000 tokens/s (MFU 1%) of a measured 1,000 GFLOP/s bfloat16 matmul peak"
