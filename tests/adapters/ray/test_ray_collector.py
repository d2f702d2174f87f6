"""The Ray collector on a real local Ray cluster: same batches as the local collector, and env workers killed for real."""

from __future__ import annotations

import pytest
import ray
from ray_test_envs import (SAMPLING, assert_same_trajectory, chat_spec, check_complete, check_groups,
                           failing_chat_env, local_chat_env, reward_fn, run_until, variable_chat_env)

from gym_llm.core.load import load_scaled
from gym_llm_adapters.collector import Collector
from gym_llm_adapters.engines import SamplingConfig
from gym_llm_adapters.ray import EngineSpec, EnvSpec, EnvWorkerDiedError, RayCollector
from gym_llm_adapters.rollout_io import RolloutWriter, read_rollouts
from gym_llm_adapters.types import RolloutBatch, StepRecord

pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster: all Ray tests in one pytest-xdist worker


def test_ordered_batches_equal_the_local_collectors(ray_cluster, hf_engines, hf_engine, tiny_tok, tmp_path):
    writer = RolloutWriter(tmp_path / "rollouts.jsonl")
    with RayCollector(chat_spec(tiny_tok), hf_engines, SAMPLING, num_workers=2, episodes_per_batch=4, seed=3,
                      ordered=True, writer=writer) as collector:
        remote = collector.collect(3)
        stats = collector.stats
    local = Collector([local_chat_env(tiny_tok), local_chat_env(tiny_tok)], hf_engine, SAMPLING,
                      episodes_per_batch=4, seed=3).collect(3)
    for got_batch, want_batch in zip(remote, local, strict=True):  # the same seeds give the same batches
        assert len(got_batch) == 4
        check_groups(got_batch, 2)
        for got, want in zip(got_batch, want_batch, strict=True):
            assert_same_trajectory(got, want)
            check_complete(got, hf_engine)
    trajectories = [t for b in remote for t in b]
    assert {t.env_index for t in trajectories} <= set(range(8)) and {t.env_index // 4 for t in trajectories} == {0, 1}
    assert len({len(t.steps) for t in trajectories}) > 1  # multi-turn groups of different lengths came out whole
    assert len(read_rollouts(tmp_path / "rollouts.jsonl")) == 12
    from gym_llm_adapters.replay import replay

    # the workers' env specs reached the driver's file; the test's reward_fn reached the workers by value (Ray's
    # pickling), so the spec names it as not recordable and the replay takes it from here
    report = replay(tmp_path / "rollouts.jsonl", env_kwargs={"reward_fn": reward_fn})
    assert report.exact and len(report.episodes) == 12, report.summary()
    assert stats.batches == 3 and stats.episodes >= 12 and stats.env_steps >= 6 and stats.generated_tokens > 0
    assert stats.steps >= sum(len(t.steps) for t in trajectories) and stats.worker_restarts == 0
    padded = RolloutBatch.from_trajectories(remote[0], pad_id=tiny_tok.pad_token_id)
    assert padded.policy_mask.sum() == sum(t.num_policy_tokens for t in remote[0])


def test_steps_mode_and_a_worker_death_in_it(ray_cluster, hf_engines, tiny_tok, tmp_path):
    # One worker, two vector steps per poll; the first incarnation dies in its third step (in its second poll).
    spec = EnvSpec(failing_chat_env, num_envs=4, tok=tiny_tok, crash_on_step=3, flag=str(tmp_path / "exited"),
                   later_hang=False)
    with RayCollector(spec, hf_engines, SAMPLING, steps_per_batch=6, seed=0, steps_per_poll=2,
                      max_batches=6) as collector:
        batches = list(collector)
        stats = collector.stats
    steps = [s for batch in batches for s in batch]
    assert len(batches) == 6 and len(steps) == 36 and all(isinstance(s, StepRecord) for s in steps)
    assert stats.worker_restarts == 1 and stats.episodes_dropped == 4
    first = [s for s in steps if s.group_id < 2]  # the dead incarnation's; its replacement has groups 2-3
    assert len(first) == 8 and {s.env_index for s in first} == {0, 1, 2, 3}  # its first poll: two steps of 4
    assert {s.env_index for s in steps if s.group_id >= 2} == {0, 1, 2, 3}
    assert all(s.group_id % 2 == s.env_index // 2 and s.version == hf_engines.version for s in steps)
    for s in steps:  # every emitted record is a correct step
        assert s.reward == 2.0 * s.turn and s.prompt_text == tiny_tok.decode(s.prompt_ids.tolist())
    # Steps mode emits steps as they come: the dropped episodes that had taken steps keep them in the batches
    # and never get a final (terminated/truncated) step. What came out of each is a prefix of the episode.
    episodes = {}
    for s in first:
        episodes.setdefault((s.env_index, s.round), []).append(s)
    cut = [e for e in episodes.values() if not (e[-1].terminated or e[-1].truncated)]
    assert 0 < len(cut) <= stats.episodes_dropped
    assert all([s.turn for s in e] == list(range(1, len(e) + 1)) for e in episodes.values())


def replaced(first_new_group: int):
    """Done when a worker was restarted and its replacement (fresh group ids) has delivered a group."""
    return lambda c, batches: c.stats.worker_restarts == 1 and any(
        t.group_id >= first_new_group for b in batches for t in b)


def test_killing_one_of_two_workers_drops_only_its_episodes(ray_cluster, hf_engines, hf_engine, tiny_tok):
    # Worker 0: sub-envs 0-3, groups 0-1; worker 1: sub-envs 4-7, groups 2-3; its replacement: groups 4-5.
    with RayCollector(chat_spec(tiny_tok), hf_engines, SAMPLING, num_workers=2, episodes_per_batch=4,
                      seed=0) as collector:
        before = collector.collect(2)
        survivor, victim = collector.workers
        ray.kill(victim)  # the process ends at once, with a poll in flight
        after = run_until(collector, lambda c, batches: replaced(first_new_group=4)(c, batches) and sum(
            t.group_id < 2 for b in batches for t in b) >= 8)  # ... and the survivor delivered 4+ groups since
        stats = collector.stats
        assert collector.workers[0]._actor_id == survivor._actor_id  # never touched
        assert collector.workers[1]._actor_id != victim._actor_id
    # SAME_STEP autoreset: each of the victim's four sub-envs was always running an episode; all members of a
    # group of this env finish in the same step, so no finished episode was waiting for its group.
    assert stats.worker_restarts == 1 and stats.episodes_dropped == 4 and stats.episodes_orphaned == 0
    trajectories = [t for b in [*before, *after] for t in b]
    owner = {0: range(0, 4), 1: range(0, 4), 2: range(4, 8), 3: range(4, 8), 4: range(4, 8), 5: range(4, 8)}
    assert all(t.env_index in owner[t.group_id] for t in trajectories)  # no group id was reused across workers
    keys = [(t.group_id, t.round, t.env_index) for t in trajectories]
    assert len(keys) == len(set(keys))  # every episode came out once
    for batch in [*before, *after]:
        check_groups(batch, 2)
        for trajectory in batch:
            check_complete(trajectory, hf_engine)  # nothing half-done came out


def test_finished_episodes_of_a_split_group_are_orphaned_when_their_worker_dies(ray_cluster, hf_engines, hf_engine,
                                                                               tiny_tok, tmp_path):
    # Group members end at different turns; the first worker to report a split group dies in its next step.
    flag = tmp_path / "crashed"
    spec = EnvSpec(variable_chat_env, num_envs=4, tok=tiny_tok, crash_flag=str(flag))
    with RayCollector(spec, hf_engines, SAMPLING, num_workers=2, episodes_per_batch=2, seed=0) as collector:
        batches = run_until(collector, lambda c, batches: c.stats.worker_restarts == 1 and sum(
            t.group_id >= 4 for b in batches for t in b) >= 4)  # until the replacement delivered 2 groups
        stats = collector.stats
    orphaned = int(flag.read_text())  # the finished episodes of split groups the dead worker had reported
    assert orphaned > 0 and stats.episodes_orphaned == orphaned and stats.episodes_dropped == 4
    trajectories = [t for b in batches for t in b]
    victim = {t.env_index // 4 for t in trajectories if t.group_id >= 4}  # the replacement's sub-envs
    assert len(victim) == 1
    survivor = 1 - victim.pop()
    assert any(t.group_id // 2 == survivor for t in trajectories)  # the survivor delivered
    assert any(len({len(a.steps), len(b.steps)}) == 2 for a, b in zip(trajectories[::2], trajectories[1::2]))
    for batch in batches:
        check_groups(batch, 2)  # never a partial group, although some were split when the worker died
        for trajectory in batch:
            check_complete(trajectory, hf_engine, fixed_length=False)


def test_worker_exiting_then_hanging_mid_step_is_replaced_until_the_limit(ray_cluster, hf_engines, hf_engine,
                                                                         tiny_tok, tmp_path):
    # Every incarnation finishes groups in steps 1-2; in step 3 the first exits, its replacement hangs.
    spec = EnvSpec(failing_chat_env, num_envs=4, tok=tiny_tok, crash_on_step=3, flag=str(tmp_path / "exited"))
    batches = []
    with RayCollector(spec, hf_engines, SAMPLING, episodes_per_batch=2, seed=0, max_worker_restarts=1,
                      worker_timeout_s=load_scaled(5.0)) as collector:  # a slow healthy poll is no hang
        with pytest.raises(EnvWorkerDiedError, match="TimeoutError.*after 1 restart.*max_worker_restarts=1"):
            for _ in range(30):  # 3 batches come first (each next_batch is bounded by worker_timeout_s); no wall clock:
                batches.append(collector.next_batch())  # a loaded machine once ran out a 180 s one
        stats = collector.stats
        with pytest.raises(RuntimeError, match="Make a new RayCollector"):
            collector.next_batch()
    assert stats.worker_restarts == 1 and stats.episodes_dropped == 8  # four running episodes per failure
    delivered = {t.group_id for b in batches for t in b}
    assert delivered & {0, 1} and delivered & {2, 3} and delivered <= {0, 1, 2, 3}  # both incarnations; fresh ids
    for batch in batches:
        check_groups(batch, 2)
        for trajectory in batch:
            check_complete(trajectory, hf_engine)


def test_bad_settings_are_refused(ray_cluster, hf_engines, tiny_tok):
    with pytest.raises(ValueError, match="exceeds the env's longest action"):  # checked inside the worker
        RayCollector(chat_spec(tiny_tok), hf_engines, SamplingConfig(max_tokens=64), episodes_per_batch=2)
    with pytest.raises(ValueError, match="group_size=G"):
        RayCollector(chat_spec(tiny_tok), hf_engines, SamplingConfig(n=2), episodes_per_batch=2)
    with pytest.raises(TypeError, match="EngineGroup or an EngineSpec"):
        RayCollector(chat_spec(tiny_tok), "hf", SAMPLING, episodes_per_batch=2)
    with pytest.raises(ValueError, match="kind must be one of"):
        EngineSpec("tgi", "model")
    with pytest.raises(TypeError, match="env id .* or a factory"):
        EnvSpec(42)


def test_a_worker_failure_is_logged_with_its_cause_not_rays_header(ray_cluster):
    import ray

    from gym_llm_adapters.ray.collector import root_cause

    @ray.remote
    def reward_that_fails():
        raise ValueError("reward model down: " + "x" * 300)

    with pytest.raises(ValueError) as caught:
        ray.get(reward_that_fails.remote())
    assert "ray::" in str(caught.value)  # what the log showed before: Ray's header, cut at 200 characters
    text = root_cause(caught.value)
    assert text.startswith("ValueError: reward model down: xxx") and "ray::" not in text and len(text) > 300


class ReplyWords:
    """A reward stage defined here (the stage interface is public): the last reply's word count; it cannot score the
    episodes of odd sub-envs."""

    source, weight = "test:reply_words", 0.5

    def score(self, trajectories, tasks):
        from gym_llm_adapters.reward_stages import Score

        return [Score(None, "odd sub-env") if t.env_index % 2 else Score(float(len(t.steps[-1].completion_text.split())))
                for t in trajectories]


def test_reward_stages_run_on_the_driver_and_failed_rewards_are_counted(ray_cluster, hf_engines, tiny_tok):
    from gym_llm_adapters.losses import MCAdvantage

    with RayCollector(chat_spec(tiny_tok), hf_engines, SAMPLING, num_workers=2, episodes_per_batch=4, seed=5,
                      reward_stages=[ReplyWords()], env_reward_weight=2.0) as collector:
        batch = collector.next_batch()
        stats = collector.stats
    for t in batch:
        assert [s["source"] for s in t.scores] == ["test:reply_words"] and t.env_weight == 2.0
        if t.env_index % 2:
            assert t.reward_failed and t.scores[0]["value"] is None
        else:
            words = float(len(t.steps[-1].completion_text.split()))
            assert not t.reward_failed and t.reward == pytest.approx(2.0 * sum(t.rewards) + 0.5 * words)
    assert stats.reward_failed == sum(t.env_index % 2 for t in batch) > 0
    assert len(MCAdvantage()(RolloutBatch.from_trajectories(batch))) == len(batch) - stats.reward_failed
