"""Engine actors: broadcasts with versions, restarts that restore the weights, a clear error past the limit."""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch
from ray_test_envs import SAMPLING, FlakyHFEngine, chat_spec, check_complete, check_groups

from gym_llm_adapters.engines import HFEngine, SamplingConfig
from gym_llm_adapters.ray import EngineCallError, EngineDiedError, EngineGroup, EngineSpec, PackedWeights, RayCollector
from gym_llm_adapters.weights import WeightSync


def test_packed_weights_round_trip_every_dtype():
    weights = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16), "c": torch.tensor(7),
               "d": torch.arange(6, dtype=torch.int64).reshape(2, 3)[:, ::2]}  # non-contiguous
    packed = PackedWeights.pack(weights)
    assert len(packed) == 4 and packed.nbytes == 48 + 10 + 8 + 32
    restored = dict(ray.cloudpickle.loads(ray.cloudpickle.dumps(packed)).items())
    for name, tensor in weights.items():
        assert restored[name].dtype == tensor.dtype and torch.equal(restored[name], tensor), name


def test_engine_failures_lose_nothing_and_deaths_restart_at_the_pushed_weights(ray_cluster, tiny_model_path, tiny_tok,
                                                                              hf_engine, tmp_path):
    policy = HFEngine(tiny_model_path)  # the "trainer's" copy
    spec = EngineSpec(FlakyHFEngine, tiny_model_path, fail_on_call=3, flag=str(tmp_path / "failed"))
    with EngineGroup(spec, num_engines=2, max_restarts=1) as group:
        greedy = SamplingConfig(max_tokens=6, temperature=0.0)
        prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
        assert [c.token_ids.tolist() for c in group.generate(prompts, greedy)] == \
            [c.token_ids.tolist() for c in hf_engine.generate(prompts, greedy)]  # split over two actors
        with torch.no_grad():
            policy.model.lm_head.weight.mul_(1.5)
        assert WeightSync(policy.model, group).push() == 1 and group.versions() == [1, 1]  # one broadcast, both
        with pytest.raises(EngineCallError, match="negative token id"):
            group.generate([[-3, 4]], greedy)
        assert group.versions() == [1, 1]

        with RayCollector(chat_spec(tiny_tok), group, SAMPLING, num_workers=1, episodes_per_batch=4, seed=0) as collector:
            with pytest.raises(EngineCallError, match="injected engine failure"):  # engine 0's 3rd generate call
                collector.next_batch()
            first = collector.next_batch()  # the worker kept its state: collection goes on
            assert collector.stats.worker_restarts == 0 and collector.stats.episodes_dropped == 0
            ray.kill(group.handle(0))  # worker 0's engine dies; the next step retries on its replacement
            later = collector.collect(3)
            stats = collector.stats
            assert group.restarts == [1, 0] and stats.engine_restarts == 1
            assert stats.worker_restarts == 0 and stats.episodes_dropped == 0  # nothing was lost
            assert group.versions() == [1, 1]
            for batch in [first, *later]:
                check_groups(batch, 2)
                for trajectory in batch:
                    assert set(trajectory.versions) == {1}
                    check_complete(trajectory, policy)  # sampled with the pushed weights, before and after
            sequence = later[-1][0].token_ids
            np.testing.assert_allclose(group.logprobs([sequence])[0], policy.logprobs([sequence])[0], atol=1e-5)

            ray.kill(group.handle(0))  # a second death exceeds max_restarts=1
            with pytest.raises(EngineDiedError, match="max_restarts=1"):
                collector.collect(4)
