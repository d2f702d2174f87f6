"""Engine actors serve the trainer's current LoRA adapter, never a stale one (issue 46, items 3-4): the adapter's bytes
go through the object store to every actor, and an actor restarted after a death serves the latest adapter too."""

from __future__ import annotations

import pytest
import ray
from ray_test_envs import SAMPLING as CHAT_SAMPLING
from ray_test_envs import chat_spec, check_complete, check_groups, run_until

from gym_llm_adapters.engines import SamplingConfig
from gym_llm_adapters.engines.base import AdapterEngine
from gym_llm_adapters.lora import AdapterPushError, AdapterSync, save_adapter
from gym_llm_adapters.ray import EngineGroup, EngineSpec, RayCollector
from gym_llm_adapters.ray.weights import PackedAdapter
from tests.adapters.engines.lora_policy import (TOLERANCE, LoraPolicy, assert_sampled_by_current_adapter,
                                                assert_serves, max_diff, sequences)

pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster: all Ray tests in one pytest-xdist worker

SAMPLING = SamplingConfig(max_tokens=6, temperature=1.0, seed=0)
GREEDY = SamplingConfig(max_tokens=6, temperature=0.0)


def test_packed_adapter_round_trips_and_never_overwrites_a_served_folder(tiny_model_path, tmp_path):
    from gym_llm_adapters.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, Adapter

    policy = LoraPolicy(tiny_model_path)
    save_adapter(policy.model, tmp_path / "v1")
    adapter = Adapter.from_folder(tmp_path / "v1", version=1, run_id="r")
    packed = ray.cloudpickle.loads(ray.cloudpickle.dumps(PackedAdapter.pack(adapter)))
    assert packed.nbytes == adapter.num_bytes + (tmp_path / "v1" / ADAPTER_CONFIG).stat().st_size
    there = packed.unpack(tmp_path / "actor", version=4)
    assert (there.name, there.int_id, there.rank, there.version) == (adapter.name, adapter.int_id, adapter.rank, 4)
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        assert (there.path / name).read_bytes() == (adapter.path / name).read_bytes()
    with pytest.raises(ValueError, match="already unpacked"):
        packed.unpack(tmp_path / "actor")


def test_hf_engine_actors_serve_each_push_and_a_restarted_actor_the_latest(ray_cluster, tiny_model_path, tmp_path):
    seqs = sequences(4)
    policy = LoraPolicy(tiny_model_path)
    base = policy.logprobs(seqs, adapter=False)
    with EngineGroup(EngineSpec("hf", tiny_model_path, lora_rank=8), num_engines=2) as group:
        assert max_diff(group.logprobs(seqs), base) < TOLERANCE  # the base model before the first push
        assert isinstance(group, AdapterEngine) and group.serves_adapters and group.adapter is None
        sync = AdapterSync(policy.model, group, root=tmp_path / "adapters")

        policy.step(seqs[0])
        assert sync.push() == 1 and group.versions() == [1, 1]
        v1 = policy.logprobs(seqs)
        assert_serves(group.logprobs(seqs), v1, {"base model": base})  # split over both actors
        assert_sampled_by_current_adapter(group.generate([s[:40] for s in seqs], SAMPLING), policy, 1)

        policy.step(seqs[1])
        assert sync.push() == 2 and group.versions() == [2, 2]
        v2 = policy.logprobs(seqs)
        assert_serves(group.logprobs(seqs), v2, {"base model": base, "version 1 adapter": v1})
        assert_sampled_by_current_adapter(group.generate([s[:40] for s in seqs], SAMPLING), policy, 2)
        client = group.client(1)
        assert client.serves_adapters and client.adapter.name == group.adapter.name == sync_name(sync, 2)
        assert group.adapter.version == 2

        too_big = LoraPolicy(tiny_model_path, rank=16)
        with pytest.raises(AdapterPushError, match="rank 16, above this engine's largest, 8"):
            AdapterSync(too_big.model, group, root=tmp_path / "big").push()
        assert group.version == 2 and group.versions() == [2, 2] and group.adapter.version == 2
        assert_serves(group.logprobs(seqs), v2, {"base model": base, "version 1 adapter": v1})

        ray.kill(group.handle(0))  # the replacement starts serving version 2's adapter (shipped from the group)
        assert_serves(group.logprobs(seqs), v2, {"base model": base, "version 1 adapter": v1})
        assert group.restarts == [1, 0] and group.versions() == [2, 2]
        assert_sampled_by_current_adapter(group.generate([s[:40] for s in seqs], SAMPLING), policy, 2)

        resumed = EngineGroup(EngineSpec("hf", tiny_model_path, lora_rank=8), adapter=group.adapter)
        with resumed:  # a resumed run's group serves its adapter from the first request, at its version
            assert resumed.version == 2 and resumed.versions() == [2]
            assert_serves(resumed.logprobs(seqs), v2, {"base model": base})
        sync.close()


def test_collected_records_carry_the_version_of_the_adapter_that_sampled_them(ray_cluster, tiny_model_path, tiny_tok,
                                                                              tmp_path):
    policy = LoraPolicy(tiny_model_path)
    by_version = {0: policy.frozen(adapter=False)}  # what each version's engine must have computed
    with EngineGroup(EngineSpec("hf", tiny_model_path, lora_rank=8)) as group:
        with RayCollector(chat_spec(tiny_tok), group, CHAT_SAMPLING, num_workers=1, episodes_per_batch=4,
                          seed=0) as collector:
            first = collector.next_batch()
            sync = AdapterSync(policy.model, collector, root=tmp_path / "adapters")  # pushes through the collector
            policy.step(sequences(1)[0])
            assert sync.push() == 1 and collector.version == 1 and collector.adapter.version == 1
            by_version[1] = policy.frozen()
            later = run_until(collector, lambda c, batches: batches and all(
                set(t.versions) == {1} for t in batches[-1]))  # episodes in flight during the push end at version 1
            sync.close()
    for batch in [first, *later]:
        check_groups(batch, 2)
        for trajectory in batch:
            check_complete(trajectory, by_version)  # each step's log-probs are its version's adapter's (1e-4)
    assert {v for batch in later for t in batch for v in t.versions} >= {1}


def sync_name(sync: AdapterSync, version: int) -> str:
    from gym_llm_adapters.lora import Adapter

    return Adapter.for_version(sync.run_id, version)[0]


def test_engine_actors_without_lora_refuse_adapters(hf_engines, tiny_model_path):
    assert not hf_engines.serves_adapters
    with pytest.raises(ValueError, match="does not serve LoRA adapters"):
        AdapterSync(LoraPolicy(tiny_model_path).model, hf_engines)


@pytest.mark.slow
def test_vllm_engine_actor_serves_each_push_never_a_stale_prefix(ray_cluster, tiny_model_path, tmp_path):
    seqs = sequences()
    prompts = [s[:66] for s in seqs]  # two full KV-cache blocks each: the prefix cache keeps them
    policy = LoraPolicy(tiny_model_path)
    base = policy.logprobs(seqs, adapter=False)
    spec = EngineSpec("vllm", tiny_model_path, lora_rank=8, dtype="float32", enforce_eager=True,
                      kv_cache_memory_bytes=32 << 20)
    with EngineGroup(spec) as group:
        sync = AdapterSync(policy.model, group, root=tmp_path / "adapters")
        policy.step(seqs[0])
        assert sync.push() == 1
        v1 = policy.logprobs(seqs)
        assert_serves(group.logprobs(seqs), v1, {"base model": base})
        assert_sampled_by_current_adapter(group.generate(prompts, GREEDY), policy, 1)
        policy.step(seqs[1])
        assert sync.push() == 2
        assert_serves(group.logprobs(seqs), policy.logprobs(seqs), {"base model": base, "version 1 adapter": v1})
        assert_sampled_by_current_adapter(group.generate(prompts, GREEDY), policy, 2)
        sync.close()
