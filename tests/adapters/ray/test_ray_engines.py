"""Engine actors started by the collector: broadcasts with versions, restarts that restore the weights, a clear error
past the limit."""

from __future__ import annotations

import time

import numpy as np
import pytest
import ray
import torch
from ray_test_envs import SAMPLING, FlakyHFEngine, chat_spec, check_complete, check_groups, run_until

from gym_llm_adapters.engines import HFEngine, SamplingConfig
from gym_llm_adapters.ray import EngineCallError, EngineDiedError, EngineSpec, PackedWeights, RayCollector

pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster: all Ray tests in one pytest-xdist worker


def test_packed_weights_round_trip_every_dtype():
    weights = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16), "c": torch.tensor(7),
               "d": torch.arange(6, dtype=torch.int64).reshape(2, 3)[:, ::2]}  # non-contiguous
    packed = PackedWeights.pack(weights)
    assert len(packed) == 4 and packed.nbytes == 48 + 10 + 8 + 32
    restored = dict(ray.cloudpickle.loads(ray.cloudpickle.dumps(packed)).items())
    for name, tensor in weights.items():
        assert restored[name].dtype == tensor.dtype and torch.equal(restored[name], tensor), name


def test_collector_owned_engines_take_weights_survive_a_death_and_stop_at_the_second(ray_cluster, tiny_model_path,
                                                                                    tiny_tok, hf_engine, tmp_path):
    policy = HFEngine(tiny_model_path)  # the "trainer's" copy
    spec = EngineSpec(FlakyHFEngine, tiny_model_path, fail_on_call=3, flag=str(tmp_path / "failed"))
    collector = RayCollector(chat_spec(tiny_tok), spec, SAMPLING, num_workers=2, num_engines=2, episodes_per_batch=4,
                             seed=0)  # starts and owns two engine actors, max_engine_restarts=1 (the default)
    group = collector.engines
    with collector:
        greedy = SamplingConfig(max_tokens=6, temperature=0.0)
        prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
        assert [c.token_ids.tolist() for c in group.generate(prompts, greedy)] == \
            [c.token_ids.tolist() for c in hf_engine.generate(prompts, greedy)]  # split over two actors
        with pytest.raises(EngineCallError, match="negative token id"):
            group.generate([[-3, 4]], greedy)
        with pytest.raises(EngineCallError, match="injected engine failure"):  # an engine's 3rd sampled call
            run_until(collector, never)
        first = collector.next_batch()  # the worker kept its state: collection goes on
        assert collector.stats.worker_restarts == 0 and collector.stats.episodes_dropped == 0

        with torch.no_grad():
            policy.model.lm_head.weight.mul_(1.5)
        assert collector.load_weights(policy.model.state_dict()) == 1  # one broadcast through the collector
        assert collector.version == 1 and group.versions() == [1, 1]
        pushed = run_until(collector, lambda c, batches: batches and all(
            set(t.versions) == {1} for t in batches[-1]))  # steps in flight during the push end at version 1
        ray.kill(group.handle(0))  # worker 0's engine dies; its next step is retried on the replacement
        later = run_until(collector, lambda c, batches: c.stats.engine_restarts == 1 and len(batches) >= 3)
        stats = collector.stats
        assert group.restarts == [1, 0] and stats.engine_restarts == 1
        assert stats.worker_restarts == 0 and stats.episodes_dropped == 0  # nothing was lost
        assert group.versions() == [1, 1]  # the replacement got the pushed weights
        by_version = {0: hf_engine, 1: policy}
        for batch in [first, *pushed, *later]:
            check_groups(batch, 2)
            for trajectory in batch:
                check_complete(trajectory, by_version)  # each step's log-probs are its version's weights'
        sequence = later[-1][0].token_ids
        np.testing.assert_allclose(group.logprobs([sequence])[0], policy.logprobs([sequence])[0], atol=1e-5)
        assert np.abs(hf_engine.logprobs([sequence])[0] - policy.logprobs([sequence])[0]).max() > 0.05  # it matters

        ray.kill(group.handle(0))  # a second death exceeds max_engine_restarts=1
        with pytest.raises(EngineDiedError, match="max_restarts=1"):
            run_until(collector, never)  # as soon as worker 0 calls its engine
        for _ in range(2):  # and the collector stays stopped
            with pytest.raises(RuntimeError, match="(?s)EngineDiedError: Engine actor 0 died.*Make a new RayCollector"):
                collector.next_batch()
    deadline = time.monotonic() + 60
    with pytest.raises(ray.exceptions.RayActorError):  # close() ended the engines the collector started
        while time.monotonic() < deadline:  # (ray.kill lands asynchronously)
            ray.get(group.handle(1).version.remote(), timeout=30)
            time.sleep(0.2)


def never(collector, batches) -> bool:
    return False
