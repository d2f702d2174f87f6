"""The collector over real gym_llm vector envs with real engines (transformers; vLLM in the slow test)."""

from __future__ import annotations

from collections import Counter

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

import gym_llm  # noqa: F401  (registers the env ids)
from gym_llm.core.spaces import unpack_tokens
from gym_llm_adapters.collector import Collector
from gym_llm_adapters.engines import HFEngine, SamplingConfig
from gym_llm_adapters.rollout_io import RolloutWriter, read_rollouts
from gym_llm_adapters.types import RolloutBatch, StepRecord, Trajectory
from gym_llm_adapters.weights import WeightSync, policy_lag

# Episodes take 1 + len(follow_ups) turns; the reward of turn t is len(messages) = 2t.
TASKS = [{"prompt": "Say hi.", "follow_ups": []},
         {"prompt": "Count to three.", "follow_ups": ["Again."]},
         {"prompt": "Name a colour.", "follow_ups": ["Another.", "One more."]}]
SAMPLING = SamplingConfig(max_tokens=12, temperature=1.0)


def expected_rewards(task_id: int) -> list[float]:
    return [2.0 * t for t in range(1, 2 + len(TASKS[task_id]["follow_ups"]))]


class TerminalRecorder(gym.vector.VectorWrapper):
    """Keeps every sub-env's terminal observation and info, in episode order (SAME_STEP or NEXT_STEP)."""

    def __init__(self, env):
        super().__init__(env)
        self.finals: list[list[tuple]] = [[] for _ in range(env.num_envs)]

    def step(self, actions):
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        for i in np.flatnonzero(terminated | truncated):
            if "final_obs" in infos:
                final_info = {k: v[i] for k, v in infos["final_info"].items() if not k.startswith("_")}
                self.finals[i].append((infos["final_obs"][i], final_info, rewards[i]))
            else:
                row = {k: v[i] for k, v in obs.items()} if isinstance(obs, dict) else obs[i]
                self.finals[i].append((row, {k: v[i] for k, v in infos.items() if not k.startswith("_")}, rewards[i]))
        return obs, rewards, terminated, truncated, infos


def chat_env(tok, *, num_envs=4, group_size=2, mode="tokens", sync=False, **kwargs):
    options = dict(prompts=TASKS, mode=mode, tokenizer=tok, max_turns=3, max_seq_len=384, max_action_tokens=16,
                   reward_fn=lambda task, messages: float(len(messages)), **kwargs)
    if sync:  # Gymnasium's SyncVectorEnv over scalar envs, NEXT_STEP autoreset, no group ids
        return gym.make_vec("LLMChat-v0", num_envs=num_envs, vectorization_mode="sync",
                            vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP}, **options)
    return gym.make_vec("LLMChat-v0", num_envs=num_envs, group_size=group_size,
                        vectorization_mode="vector_entry_point", **options)


def check_token_exact(trajectory: Trajectory, recorder: TerminalRecorder, engine) -> None:
    """The trajectory is the env's final sequence, masks agree, and its log-probs are the model's."""
    final_obs, final_info, final_reward = recorder.finals[trajectory.env_index][trajectory.round]
    sequence = unpack_tokens(final_obs)
    assert trajectory.token_exact
    assert trajectory.token_ids.tolist() == sequence.tolist()
    assert trajectory.policy_mask.tolist() == final_info["policy_mask"][: len(sequence)].tolist()
    assert trajectory.rewards == expected_rewards(trajectory.task_id) and trajectory.rewards[-1] == final_reward
    assert trajectory.terminated and not trajectory.truncated and trajectory.steps[-1].info["turn"] == len(trajectory.steps)
    sampled = trajectory.policy_mask.astype(bool)
    assert trajectory.logprobs[sampled].tolist() == np.concatenate([s.logprobs for s in trajectory.steps]).tolist()
    assert (trajectory.logprobs[~sampled] == 0).all()
    for step in trajectory.steps:  # every turn conditioned on a prefix of the final sequence
        n, k = len(step.prompt_ids), len(step.completion_ids)
        assert sequence[:n].tolist() == step.prompt_ids.tolist() and sequence[n: n + k].tolist() == step.completion_ids.tolist()
    teacher, = engine.logprobs([trajectory.token_ids])  # what a trainer recomputes on the trajectory
    np.testing.assert_allclose(teacher[sampled], trajectory.logprobs[sampled], atol=1e-4)


def check_groups(batch: list[Trajectory], group_size: int) -> None:
    counts = Counter((t.group_id, t.round) for t in batch)
    assert set(counts.values()) == {group_size}
    for key in counts:
        assert len({t.task_id for t in batch if (t.group_id, t.round) == key}) == 1


def test_tokens_mode_multi_turn_groups_are_token_exact(tiny_tok, hf_engine):
    recorder = TerminalRecorder(chat_env(tiny_tok, num_envs=4, group_size=2))
    collector = Collector(recorder, hf_engine, SAMPLING, episodes_per_batch=4, seed=0)
    batches = collector.collect(3)
    lengths = set()
    for batch in batches:
        assert len(batch) == 4
        check_groups(batch, 2)
        for trajectory in batch:
            check_token_exact(trajectory, recorder, hf_engine)
            lengths.add(len(trajectory.steps))
            assert trajectory.versions == [0] * len(trajectory.steps)
    assert len(lengths) > 1  # groups of different episode lengths came out whole
    stats = collector.stats
    assert stats.batches == 3 and stats.episodes >= 12 and stats.tokens_per_s > 0 and stats.episodes_per_s > 0
    assert stats.generated_tokens >= sum(len(s.completion_ids) for b in batches for t in b for s in t.steps)
    padded = RolloutBatch.from_trajectories(batches[0], pad_id=tiny_tok.pad_token_id)
    assert padded.policy_mask.sum() == sum(t.num_policy_tokens for t in batches[0])


def test_next_step_autoreset_keeps_the_terminal_step(tiny_tok, hf_engine):
    recorder = TerminalRecorder(chat_env(tiny_tok, num_envs=3, sync=True))
    assert recorder.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    collector = Collector(recorder, hf_engine, SAMPLING, episodes_per_batch=4, seed=1)
    for batch in collector.collect(2):
        for trajectory in batch:
            check_token_exact(trajectory, recorder, hf_engine)
            assert trajectory.group_id == trajectory.env_index  # no groups in a plain SyncVectorEnv


def test_steps_mode_in_text_mode(tiny_tok, hf_engine, gsm8k_test_file):
    env = gym.make_vec("LLMGSM8K-v0", num_envs=4, group_size=2, vectorization_mode="vector_entry_point",
                       data_files=gsm8k_test_file, tokenizer=tiny_tok)
    collector = Collector(env, hf_engine, SAMPLING, steps_per_batch=6, seed=0)
    batches = collector.collect(2)
    assert [len(b) for b in batches] == [6, 6]
    for step in batches[0] + batches[1]:
        assert isinstance(step, StepRecord) and step.terminated and step.turn == 1
        assert step.prompt_text.startswith("<|im_start|>user\n") and step.prompt_text.endswith("<|im_start|>assistant\n")
        engine_tok = hf_engine.tokenizer  # text observations are encoded with the engine's tokenizer
        assert step.prompt_ids.tolist() == engine_tok.encode(step.prompt_text, add_special_tokens=False)
        assert step.completion_text == engine_tok.decode(step.completion_ids, skip_special_tokens=True)
        assert step.reward == float(step.info["correct"]) and "reference_answer" in step.info
    assert [s.group_id for s in batches[0][:4]] == [0, 0, 1, 1]
    assert batches[0][0].task_id == batches[0][1].task_id


def test_text_mode_trajectories_say_whether_they_are_token_exact(tiny_tok, hf_engine):
    collector = Collector(chat_env(tiny_tok, mode="text"), hf_engine, SAMPLING, episodes_per_batch=4, seed=0)
    for trajectory in collector.next_batch():
        last = trajectory.steps[-1]
        assert trajectory.rewards == expected_rewards(trajectory.task_id)
        assert trajectory.token_ids[-len(last.completion_ids):].tolist() == last.completion_ids.tolist()
        if trajectory.token_exact:
            assert trajectory.policy_mask.sum() == sum(len(s.completion_ids) for s in trajectory.steps)
        else:  # re-tokenised history: earlier turns became context, the last turn is still exact
            assert trajectory.token_ids[: len(last.prompt_ids)].tolist() == last.prompt_ids.tolist()


def test_overlapped_shards_equal_sequential_collection(tiny_tok, hf_engine):
    def run(overlap):
        envs = [chat_env(tiny_tok, num_envs=2, group_size=2), chat_env(tiny_tok, num_envs=2, group_size=2)]
        with Collector(envs, hf_engine, SAMPLING, episodes_per_batch=2, seed=3, overlap=overlap) as collector:
            return collector.collect(4)

    sequential, overlapped = run(False), run(True)
    assert {t.group_id for b in sequential for t in b} == {0, 1}  # shard 2's group 0 became group 1
    assert {t.env_index for b in sequential for t in b} == {0, 1, 2, 3}
    for a, b in zip(sequential, overlapped, strict=True):
        assert [(t.group_id, t.round, t.token_ids.tolist()) for t in a] == [(t.group_id, t.round, t.token_ids.tolist()) for t in b]


class StepWaitsForRelease(gym.vector.VectorWrapper):
    """An env whose step signals that it runs, then waits (up to 5 s) for the engine to release it."""

    def __init__(self, env, step_running, release):
        super().__init__(env)
        self.step_running, self.release = step_running, release

    def step(self, actions):
        self.step_running.set()
        self.release.wait(timeout=5)
        self.release.clear()
        return self.env.step(actions)


class OverlapProbeEngine(HFEngine):
    """The real transformers engine, counting the calls made while the first shard's step was running."""

    def __init__(self, base, step_running, release):
        super().__init__(base.model, tokenizer=base.tokenizer)
        self.step_running, self.release = step_running, release
        self.collector, self.calls, self.overlapped = None, 0, 0

    def generate(self, prompts, sampling):
        self.calls += 1
        future = self.collector._shards[0].future
        pending = future is not None and not future.done()
        if pending:
            assert self.step_running.wait(timeout=60)  # the submitted step has started
            self.step_running.clear()
        out = super().generate(prompts, sampling)
        if pending:
            self.overlapped += not future.done()  # the step was still running while we generated
            self.release.set()
        return out


def test_overlap_generates_while_an_env_steps(tiny_tok, hf_engine):
    import threading

    step_running, release = threading.Event(), threading.Event()
    engine = OverlapProbeEngine(hf_engine, step_running, release)
    envs = [StepWaitsForRelease(chat_env(tiny_tok, num_envs=2), step_running, release), chat_env(tiny_tok, num_envs=2)]
    with Collector(envs, engine, SAMPLING, steps_per_batch=16, seed=0, overlap=True) as collector:
        engine.collector = collector
        assert len(collector.next_batch()) == 16
    assert engine.calls >= 8 and engine.overlapped >= engine.calls // 2 - 1  # every second-shard call overlapped


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_writer_round_trips_every_batch(tmp_path, tiny_tok, hf_engine, suffix):
    path = tmp_path / f"rollouts{suffix}"
    with RolloutWriter(path) as writer:
        collector = Collector(chat_env(tiny_tok), hf_engine, SAMPLING, episodes_per_batch=2, seed=0,
                              writer=writer, max_batches=2)
        batches = list(collector)
    records = read_rollouts(path)
    assert len(batches) == 2 and len(records) == 4
    for got, want in zip(records, [t for b in batches for t in b]):
        assert_same_record(got, want)


def assert_same_record(got, want):
    assert type(got) is type(want)
    for name in want.__dataclass_fields__:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.tolist() == b.tolist(), name
        elif name == "steps":
            assert len(a) == len(b)
            for x, y in zip(a, b):
                assert_same_record(x, y)
        else:
            assert a == b, name


class FailingEngine(HFEngine):
    """The real transformers engine with one injected failure: generate call number ``fail_on_call`` raises."""

    def __init__(self, base: HFEngine, fail_on_call: int):
        super().__init__(base.model, tokenizer=base.tokenizer)
        self.calls, self.fail_on_call = 0, fail_on_call

    def generate(self, prompts, sampling):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("injected engine failure")
        return super().generate(prompts, sampling)


def test_engine_failure_mid_batch_emits_nothing_and_keeps_what_was_written(tmp_path, tiny_tok, hf_engine):
    path = tmp_path / "rollouts.jsonl"
    engine = FailingEngine(hf_engine, fail_on_call=4)
    writer = RolloutWriter(path)
    collector = Collector(chat_env(tiny_tok, num_envs=2, group_size=2), engine, SAMPLING,
                          episodes_per_batch=2, seed=0, writer=writer)
    first = collector.next_batch()
    calls_for_first = engine.calls
    assert calls_for_first < 4  # the failure lands inside the second batch
    with pytest.raises(RuntimeError, match="injected engine failure"):
        collector.next_batch()
    assert collector.stats.batches == 1
    kept = read_rollouts(path)
    assert len(kept) == 2 and path.read_bytes().endswith(b"\n")
    for got, want in zip(kept, first):
        assert_same_record(got, want)
    second = collector.next_batch()  # the engine error changed nothing: collection goes on
    check_groups(second, 2)
    assert len(read_rollouts(path)) == 4
    writer.close()


def test_versions_follow_weight_pushes(tiny_tok, tiny_model_path):
    engine = HFEngine(tiny_model_path)
    policy = HFEngine(tiny_model_path).model  # the "trainer's" copy
    sync = WeightSync(policy, engine)
    collector = Collector(chat_env(tiny_tok, num_envs=6, group_size=2), engine, SAMPLING, episodes_per_batch=2, seed=0)
    first = collector.next_batch()
    assert all(v == 0 for t in first for v in t.versions)
    with torch.no_grad():
        policy.lm_head.weight.mul_(1.5)
    assert sync.push() == 1 and engine.version == 1
    later = [t for _ in range(4) for t in collector.next_batch()]
    assert any(1 in t.versions for t in later)
    assert any(t.versions[0] == 0 and t.versions[-1] == 1 for t in later)  # an episode spanned the push
    assert policy_lag(later, engine.version).tolist() == [1 - min(t.versions) for t in later]
    torch.testing.assert_close(engine.model.lm_head.weight, policy.lm_head.weight)


@pytest.mark.parametrize("kwargs, match", [
    ({"sampling": SamplingConfig(n=2)}, "group_size=G"),
    ({"episodes_per_batch": 3}, "multiple of the envs' group_size=2"),
    ({"sampling": SamplingConfig(max_tokens=64)}, "exceeds the env's longest action"),
    ({"episodes_per_batch": None}, "exactly one of"),
    ({"steps_per_batch": 4}, "exactly one of"),
])
def test_bad_settings_are_refused(tiny_tok, hf_engine, kwargs, match):
    options = {"sampling": SAMPLING, "episodes_per_batch": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        Collector(chat_env(tiny_tok), hf_engine, options.pop("sampling"), **options)


def test_disabled_autoreset_is_refused(tiny_tok, hf_engine):
    env = gym.make_vec("LLMChat-v0", num_envs=2, vectorization_mode="vector_entry_point", autoreset_mode="Disabled",
                       prompts=TASKS, mode="tokens", tokenizer=tiny_tok, max_action_tokens=16)
    with pytest.raises(ValueError, match="DISABLED"):
        Collector(env, hf_engine, SAMPLING, episodes_per_batch=2)


def test_progress_bar_metrics_and_reset(tiny_tok, hf_engine):
    collector = Collector(chat_env(tiny_tok), hf_engine, SAMPLING, episodes_per_batch=2, progress=True, max_batches=2)
    assert len(list(collector)) == 2
    assert collector._bar.n == 4  # episodes handed out
    metrics = collector.stats.as_dict()
    assert metrics["collector/batches"] == 2 and metrics["collector/tokens_per_s"] > 0
    collector.reset(seed=5)  # same seed, same rollouts as a new collector
    again = Collector(chat_env(tiny_tok), hf_engine, SAMPLING, episodes_per_batch=2, seed=5).next_batch()
    assert [t.token_ids.tolist() for t in collector.next_batch()] == [t.token_ids.tolist() for t in again]
    collector.close()


@pytest.mark.slow
def test_vllm_engine_with_weight_sync(tiny_tok, vllm_engine, hf_engine, fresh_hf_engine):
    recorder = TerminalRecorder(chat_env(tiny_tok, num_envs=4, group_size=2))
    collector = Collector(recorder, vllm_engine, SAMPLING, episodes_per_batch=4, seed=0)
    start = vllm_engine.version
    for trajectory in collector.next_batch():
        check_token_exact(trajectory, recorder, hf_engine)  # vLLM's log-probs == transformers' recomputation
        assert set(trajectory.versions) == {start}
    with torch.no_grad():
        fresh_hf_engine.model.lm_head.weight.mul_(1.3)
    assert WeightSync(fresh_hf_engine.model, vllm_engine).push() == start + 1
    batch = collector.next_batch() + collector.next_batch()
    assert all(t.versions == sorted(t.versions) and set(t.versions) <= {start, start + 1} for t in batch)
    new = [t for t in batch if set(t.versions) == {start + 1}]
    assert new
    for trajectory in new:  # sampled entirely by the updated weights
        check_token_exact(trajectory, recorder, fresh_hf_engine)


class StepCounter(gym.vector.VectorWrapper):
    """Counts, per sub-env, the steps that carried a non-empty action."""

    def __init__(self, env):
        super().__init__(env)
        self.acted = np.zeros(env.num_envs, dtype=int)

    def step(self, actions):
        self.acted += np.asarray(actions["attention_mask"]).sum(1) > 0
        return self.env.step(actions)


def test_run_episodes_runs_one_episode_per_sub_env_on_the_given_tasks(tmp_path, tiny_tok, hf_engine):
    recorder = TerminalRecorder(chat_env(tiny_tok, num_envs=4, group_size=2))
    counter = StepCounter(recorder)
    writer = RolloutWriter(tmp_path / "episodes.jsonl")
    collector = Collector(counter, hf_engine, SAMPLING, episodes_per_batch=4, seed=0, writer=writer)
    task_ids = [2, 2, 0, 1]  # 3, 3, 1 and 2 turns
    trajectories = collector.run_episodes(seed=5, options={"task_ids": task_ids})
    assert [t.env_index for t in trajectories] == [0, 1, 2, 3]
    assert [t.task_id for t in trajectories] == task_ids and all(t.round == 0 for t in trajectories)
    for trajectory in trajectories:
        check_token_exact(trajectory, recorder, hf_engine)
    # idle sub-envs got no generation: each sub-env acted exactly as many times as its episode has turns
    assert counter.acted.tolist() == [3, 3, 1, 2] == [len(t.steps) for t in trajectories]
    assert collector.stats.episodes == 4 and collector.stats.steps == 9
    assert [t.token_ids.tolist() for t in read_rollouts(tmp_path / "episodes.jsonl")] == [
        t.token_ids.tolist() for t in trajectories]
    # the same seed gives the same episodes; batches afterwards start from a fresh reset
    again = collector.run_episodes(seed=5, options={"task_ids": task_ids})
    assert [t.token_ids.tolist() for t in again] == [t.token_ids.tolist() for t in trajectories]
    batch = collector.next_batch()
    assert len(batch) == 4 and all(t.round == 0 for t in batch)
    with pytest.raises(ValueError, match="one per env"):
        collector.run_episodes(options=[{"task_ids": task_ids}, None])


def test_run_episodes_with_next_step_autoreset(tiny_tok, hf_engine):
    recorder = TerminalRecorder(chat_env(tiny_tok, num_envs=3, sync=True))
    collector = Collector(recorder, hf_engine, SAMPLING, steps_per_batch=1, seed=2)
    trajectories = collector.run_episodes()
    assert [t.env_index for t in trajectories] == [0, 1, 2]
    for trajectory in trajectories:
        check_token_exact(trajectory, recorder, hf_engine)
