"""The transformers engine serves the trainer's current LoRA adapter, never a stale one (issue 46, items 3-4)."""

from __future__ import annotations

import pytest
from lora_policy import (TOLERANCE, LoraPolicy, assert_sampled_by_current_adapter, assert_serves, corrupted_adapter,
                         max_diff, sequences)

from gym_llm_adapters.engines import HFEngine, SamplingConfig
from gym_llm_adapters.engines.base import AdapterEngine
from gym_llm_adapters.lora import AdapterPushError, AdapterSync

SAMPLING = SamplingConfig(max_tokens=6, temperature=1.0, seed=0)


@pytest.fixture
def setup(tiny_model_path, tmp_path):
    """A LoRA engine, the trainer's policy and the sync between them (nothing pushed yet)."""
    engine = HFEngine(tiny_model_path, lora_rank=8)
    policy = LoraPolicy(tiny_model_path)
    sync = AdapterSync(policy.model, engine, root=tmp_path / "adapters")
    yield engine, policy, sync
    sync.close()


def test_each_push_is_served_at_once_and_never_the_stale_adapter(setup):
    engine, policy, sync = setup
    seqs = sequences()
    base = policy.logprobs(seqs, adapter=False)
    assert engine.serves_adapters and engine.adapter is None and engine.version == 0
    assert max_diff(engine.logprobs(seqs), base) < TOLERANCE  # the base model before the first push

    policy.step(seqs[0])
    assert sync.push() == 1 and engine.version == 1
    v1 = policy.logprobs(seqs)
    assert_serves(engine.logprobs(seqs), v1, {"base model": base})
    assert_sampled_by_current_adapter(engine.generate([s[:40] for s in seqs], SAMPLING), policy, 1)
    first = engine.adapter
    assert first.version == 1

    policy.step(seqs[1])  # the second push changes the adapter: version 2's numbers, not version 1's
    assert sync.push() == 2
    assert_serves(engine.logprobs(seqs), policy.logprobs(seqs), {"base model": base, "version 1 adapter": v1})
    assert_sampled_by_current_adapter(engine.generate([s[:40] for s in seqs], SAMPLING), policy, 2)
    assert engine.adapter.version == 2
    assert engine.adapter.name != first.name and engine.adapter.int_id != first.int_id
    assert list(engine._peft.peft_config) == [engine.adapter.name]  # the older adapter was deleted


def test_a_failed_push_raises_and_leaves_the_version_and_the_served_adapter(setup, tiny_model_path, tmp_path):
    from gym_llm_adapters.models.tiny import tiny_model_dir

    engine, policy, sync = setup
    seqs = sequences()
    policy.step(seqs[0])
    sync.push()
    served = policy.logprobs(seqs)

    too_big = LoraPolicy(tiny_model_path, rank=16)  # above the engine's lora_rank=8
    with pytest.raises(AdapterPushError, match="rank 16, above this engine's largest, 8; start the engine with lora_rank=16"):
        AdapterSync(too_big.model, engine, root=tmp_path / "big").push()
    wider = LoraPolicy(tiny_model_dir(hidden_size=256, num_heads=4))  # an adapter of another model: shapes differ
    with pytest.raises(AdapterPushError, match="size mismatch"):
        AdapterSync(wider.model, engine, root=tmp_path / "wider").push()
    with pytest.raises(Exception, match="header"):  # safetensors cannot read it
        engine.load_adapter(corrupted_adapter(policy, tmp_path / "corrupt", version=2))
    assert engine.version == 1 and engine.adapter.version == 1
    assert_serves(engine.logprobs(seqs), served, {"base model": policy.logprobs(seqs, adapter=False)})
    assert list(engine._peft.peft_config) == [engine.adapter.name]  # nothing half-loaded stays behind

    with pytest.raises(ValueError, match="is for policy version 5.*every push is one version up"):
        engine.load_adapter(corrupted_adapter(policy, tmp_path / "v5", version=5))
    from dataclasses import replace

    with pytest.raises(ValueError, match="reuses the name or id"):
        engine.load_adapter(replace(engine.adapter, version=2))
    assert sync.push() == 2  # the engine still takes good pushes


def test_a_resumed_engine_serves_its_adapter_from_the_first_request(setup, tiny_model_path):
    engine, policy, sync = setup
    seqs = sequences()
    policy.step(seqs[0])
    sync.push()
    adapter = engine.adapter
    resumed = HFEngine(tiny_model_path, lora_rank=8, adapter=adapter)
    assert resumed.version == 1 and resumed.adapter == adapter
    assert_serves(resumed.logprobs(seqs), policy.logprobs(seqs), {"base model": policy.logprobs(seqs, adapter=False)})
    with pytest.raises(ValueError, match="version=3 disagrees with the adapter's version 1"):
        HFEngine(tiny_model_path, lora_rank=8, adapter=adapter, version=3)


def test_weight_loads_reach_the_base_under_the_adapter(setup, tiny_model_path):
    """PEFT moves an adapted layer's weight to ``<layer>.base_layer.weight``; checkpoint names still load."""
    from safetensors.torch import load_file

    engine, policy, sync = setup
    seqs = sequences(1)
    policy.step(seqs[0])
    sync.push()
    before = engine.logprobs(seqs)
    assert engine.load_weights(load_file(str(tiny_model_path / "model.safetensors"))) == 2
    assert max_diff(engine.logprobs(seqs), before) == 0.0 and engine.adapter.version == 1


def test_an_engine_without_lora_refuses_adapters_and_says_how(hf_engine, tiny_model_path, tmp_path):
    policy = LoraPolicy(tiny_model_path)
    assert isinstance(hf_engine, AdapterEngine)  # the protocol is there; LoRA is off
    assert not hf_engine.serves_adapters and hf_engine.adapter is None
    with pytest.raises(ValueError, match="does not serve LoRA adapters"):
        AdapterSync(policy.model, hf_engine)
    with pytest.raises(ValueError, match=r"HFEngine\(\.\.\., lora_rank=16\)"):
        hf_engine.load_adapter(corrupted_adapter(policy, tmp_path / "a", version=hf_engine.version + 1))
    with pytest.raises(ValueError, match="got a PEFT model"):
        HFEngine(policy.model, tokenizer=hf_engine.tokenizer, lora_rank=8)
