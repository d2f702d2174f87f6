"""Fault injection into the real collector: nothing partial, nothing mislabelled, nothing lost.

A fault at every call site — the engine (raises, or returns a completion with a log-prob short, an id outside the
vocabulary, a NaN or positive log-prob, an unknown finish reason, another prompt's answer, too few completions), a
sub-env's step (its reward raises, or Ctrl-C), the writer (ENOSPC, Ctrl-C, a killed process), the reference-KL model
after a batch — each on the first, a middle and the last sub-env, with the transformers and the vLLM engine. After
each: every returned trajectory's reward, task and tokens match an independent re-score of that episode (the reward
rule of these tasks, which depends on the reply's text; the task's own prompt text; the engine's log-probs
recomputed on the trajectory), the rollout file reads back with no torn or mislabelled record, and the collector
either produces the next correct batch (recovered: the shard restarted, its in-flight episodes counted as dropped)
or refuses with its named error until reset.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import gym_llm  # noqa: F401  (registers the env ids)
from gym_llm_adapters.collector import Collector
from gym_llm_adapters.engines import SamplingConfig
from gym_llm_adapters.engines.validate import EngineOutputError
from gym_llm_adapters.rollout_io import RolloutWriter, read_rollouts, record_checksum
from gym_llm_adapters.types import Trajectory

# Episodes take 1 + len(follow_ups) turns; the reward of turn t is len(messages) = 2t, plus a tenth of the reply's
# length mod 5: a reward swapped between two episodes of the same task would not re-score.
TASKS = [{"prompt": "Say hi.", "follow_ups": []},
         {"prompt": "Count to three.", "follow_ups": ["Again."]},
         {"prompt": "Name a colour.", "follow_ups": ["Another.", "One more."]}]
SAMPLING = SamplingConfig(max_tokens=10, temperature=1.0)
NUM_ENVS, GROUP = 4, 2
POSITIONS = {"first": 0, "middle": 1, "last": NUM_ENVS - 1}


class RewardFault:
    """The tasks' reward, len(messages); once armed with ``(prompt, exc, at)``, raises ``exc`` on its first call for
    an episode of that prompt from call number ``at`` on."""

    def __init__(self):
        self.armed: tuple[str, BaseException, int] | None = None
        self.calls = 0

    def __call__(self, task, messages):
        self.calls += 1
        prompt = next(m.content for m in messages if m.role == "user")
        if self.armed is not None and self.armed[0] in prompt and self.calls >= self.armed[2]:
            exc, self.armed = self.armed[1], None
            raise exc
        return expected_reward(len(messages) // 2, messages[-1].content)


def expected_reward(turn: int, reply: str) -> float:
    return 2.0 * turn + (len(reply) % 5) / 10


def reply_text(tok, ids) -> str:
    """The assistant message an env makes of sampled ids: their text, special tokens (the closing eos) left out."""
    return tok.decode(ids.tolist(), skip_special_tokens=True)


def fail_sub_env_once(collector, index: int, exc: BaseException) -> None:
    """The next step of sub-env ``index`` raises ``exc`` while it responds (a reward or tool failing there)."""
    [shard] = collector._shards
    episode = shard.env.unwrapped.episodes[index]

    def failing(reply):
        del episode.respond  # once
        raise exc

    episode.respond = failing


def chat_env(tok, reward):
    return gym.make_vec("LLMChat-v0", num_envs=NUM_ENVS, group_size=GROUP, vectorization_mode="vector_entry_point",
                        prompts=TASKS, mode="tokens", tokenizer=tok, max_turns=3, max_seq_len=384,
                        max_action_tokens=16, reward_fn=reward,
                        reward_timeout_s=None)  # RewardFault is armed from this process: call it in the env thread


class FaultyEngine:
    """The real engine, with one fault injected into one call's output for one prompt."""

    def __init__(self, engine):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.fault: tuple[str, int] | None = None  # (kind, position among the call's prompts)

    @property
    def version(self):
        return self.engine.version

    def logprobs(self, sequences):
        return self.engine.logprobs(sequences)

    def generate(self, prompts, sampling):
        completions = self.engine.generate(prompts, sampling)
        if self.fault is None:
            return completions
        kind, position = self.fault
        self.fault = None
        k = min(position, len(completions) - 1)
        c = completions[k]
        if kind == "raise":
            raise RuntimeError("injected engine failure")
        if kind == "short_logprobs":
            completions[k] = dataclasses.replace(c, logprobs=c.logprobs[:-1])
        elif kind == "id_out_of_vocab":
            completions[k] = dataclasses.replace(c, token_ids=np.append(c.token_ids[:-1], 10**9), )
        elif kind == "nan_logprob":
            completions[k] = dataclasses.replace(c, logprobs=np.where(np.arange(len(c.logprobs)) == 0, np.nan, c.logprobs)
                                                 .astype(np.float32))
        elif kind == "positive_logprob":
            completions[k] = dataclasses.replace(c, logprobs=np.abs(c.logprobs) + 0.5)
        elif kind == "finish_reason":
            completions[k] = dataclasses.replace(c, finish_reason="abort")
        elif kind == "another_prompts_answer":  # swapped with a completion of a different prompt
            other = next(j for j in range(len(completions)) if not np.array_equal(prompts[j], prompts[k]))
            completions[k], completions[other] = completions[other], completions[k]
        elif kind == "too_few":
            del completions[k]
        elif kind == "empty_length":
            completions[k] = dataclasses.replace(c, token_ids=c.token_ids[:0], logprobs=c.logprobs[:0],
                                                 finish_reason="length")
        return completions


def check_batch(batch: list[Trajectory], engine, tok) -> None:
    """An independent re-score of every trajectory: reward rule, task text, tokens and log-probs, whole groups."""
    assert len(batch) == GROUP * 2 or len(batch) == GROUP
    for t in batch:
        task = TASKS[t.task_id]
        expected = [expected_reward(turn, reply_text(tok, s.completion_ids)) for turn, s in enumerate(t.steps, 1)]
        assert len(t.steps) == 1 + len(task["follow_ups"]) and t.rewards == pytest.approx(expected), (t.task_id, t.rewards)
        assert task["prompt"] in tok.decode(t.token_ids[: t.prompt_length].tolist())
        sampled = t.policy_mask.astype(bool)
        assert t.logprobs[sampled].tolist() == np.concatenate([s.logprobs for s in t.steps]).tolist()
        teacher, = engine.logprobs([t.token_ids])
        np.testing.assert_allclose(teacher[sampled], t.logprobs[sampled], atol=1e-3)
        assert t.env_id == "LLMChat-v0"
        assert all(s.task_id == t.task_id and s.group_id == t.group_id for s in t.steps)
    groups: dict[tuple[int, int], set[int]] = {}
    for t in batch:
        groups.setdefault((t.group_id, t.round), set()).add(t.task_id)
    assert all(len(tasks) == 1 for tasks in groups.values())
    assert sum(1 for t in batch) == GROUP * len(groups)


def check_file(path: Path, returned: list[list[Trajectory]]) -> None:
    """The file holds exactly the returned batches, in order, each record intact."""
    records = read_rollouts(path)
    flat = [t for batch in returned for t in batch]
    assert len(records) == len(flat)
    for got, want in zip(records, flat):
        assert record_checksum(got) == record_checksum(want)
        assert (got.task_id, got.group_id, got.rewards, got.versions, got.env_id) == \
               (want.task_id, want.group_id, want.rewards, want.versions, want.env_id)


@pytest.fixture
def setup(tmp_path, tiny_tok, hf_engine):
    reward = RewardFault()
    engine = FaultyEngine(hf_engine)
    writer = RolloutWriter(tmp_path / "rollouts.jsonl")
    collector = Collector(chat_env(tiny_tok, reward), engine, SAMPLING, episodes_per_batch=2 * GROUP, seed=0,
                          writer=writer)
    yield collector, engine, reward, writer, tmp_path / "rollouts.jsonl"
    writer.close()


ENGINE_FAULTS = ["short_logprobs", "id_out_of_vocab", "nan_logprob", "positive_logprob", "finish_reason",
                 "another_prompts_answer", "too_few", "empty_length"]


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("kind", ENGINE_FAULTS)
def test_a_bad_engine_output_is_named_and_steps_nothing(setup, tiny_tok, hf_engine, kind, position):
    collector, engine, reward, writer, path = setup
    first = collector.next_batch()
    steps_before = collector.stats.env_steps
    engine.fault = (kind, POSITIONS[position])
    with pytest.raises(EngineOutputError) as caught:
        collector.next_batch()
    assert caught.value.engine == "FaultyEngine" and caught.value.problem
    if kind != "too_few":
        assert caught.value.sub_env is not None and 0 <= caught.value.sub_env < NUM_ENVS
    assert collector.stats.env_steps == steps_before  # no env saw the bad output
    second = collector.next_batch()  # the collector goes on, with correct data
    for batch in (first, second):
        check_batch(batch, hf_engine, tiny_tok)
    check_file(path, [first, second])


@pytest.mark.parametrize("position", POSITIONS)
def test_an_engine_that_raises_costs_the_call_only(setup, tiny_tok, hf_engine, position):
    collector, engine, reward, writer, path = setup
    first = collector.next_batch()
    engine.fault = ("raise", POSITIONS[position])
    with pytest.raises(RuntimeError, match="injected engine failure"):
        collector.next_batch()
    second = collector.next_batch()
    check_batch(second, hf_engine, tiny_tok)
    check_file(path, [first, second])


@pytest.mark.parametrize("position", POSITIONS)
def test_a_failing_sub_env_restarts_its_shard_and_drops_its_episodes(setup, tiny_tok, hf_engine, position, caplog):
    collector, engine, reward, writer, path = setup
    first = collector.next_batch()
    fail_sub_env_once(collector, POSITIONS[position], ValueError("reward model down"))
    steps = collector.stats.env_steps
    later = [collector.next_batch() for _ in range(3)]  # recovered: no exception reaches the caller
    assert collector.stats.restarts == 1 and collector.stats.episodes_dropped == NUM_ENVS, collector.stats
    warnings = [r for r in caplog.records if "restarted it from a fresh reset" in r.getMessage()]
    assert len(warnings) == 1 and "ValueError: reward model down" in warnings[0].getMessage()
    assert f"sub-env {POSITIONS[position]}" in warnings[0].getMessage()  # the env's note names the sub-env
    assert collector.stats.env_steps > steps
    for batch in (first, *later):
        check_batch(batch, hf_engine, tiny_tok)
    check_file(path, [first, *later])
    groups = [(t.group_id, t.round) for batch in (first, *later) for t in batch]
    assert len(set(groups)) == len(groups) // GROUP  # fresh group ids after the restart: no group mixes two runs


def test_past_the_restart_budget_the_collector_refuses_until_reset(tmp_path, tiny_tok, hf_engine):
    from gym_llm_adapters.faults import CollectorBrokenError

    with RolloutWriter(tmp_path / "r.jsonl") as writer:
        collector = Collector(chat_env(tiny_tok, RewardFault()), hf_engine, SAMPLING, episodes_per_batch=2 * GROUP,
                              seed=0, writer=writer, max_env_restarts=1)
        first = collector.next_batch()
        fail_sub_env_once(collector, 0, ValueError("first"))
        second = collector.next_batch()  # restart 1 of 1
        fail_sub_env_once(collector, NUM_ENVS - 1, ValueError("second"))
        with pytest.raises(CollectorBrokenError, match=r"ValueError: second.*after 1 restart.*max_env_restarts=1"):
            for _ in range(4):
                collector.next_batch()
        kept = read_rollouts(tmp_path / "r.jsonl")
        for call in (collector.next_batch, collector.advance):
            with pytest.raises(CollectorBrokenError, match="max_env_restarts=1"):
                call()
        assert len(read_rollouts(tmp_path / "r.jsonl")) == len(kept)  # a refused call writes nothing
        collector.reset()
        after = collector.next_batch()
    for batch in (first, second, after):
        check_batch(batch, hf_engine, tiny_tok)
    assert len(read_rollouts(tmp_path / "r.jsonl")) == len(kept) + len(after)


@pytest.mark.parametrize("position", POSITIONS)
def test_ctrl_c_in_a_step_refuses_until_reset(setup, tiny_tok, hf_engine, position):
    from gym_llm_adapters.faults import CollectorBrokenError

    collector, engine, reward, writer, path = setup
    first = collector.next_batch()
    fail_sub_env_once(collector, POSITIONS[position], KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        for _ in range(4):
            collector.next_batch()
    kept = read_rollouts(path)
    with pytest.raises(CollectorBrokenError, match="Call collector.reset"):
        collector.next_batch()
    assert collector.stats.restarts == 0 and len(read_rollouts(path)) == len(kept)
    collector.reset()
    after = collector.next_batch()
    for batch in (first, after):
        check_batch(batch, hf_engine, tiny_tok)
    records = read_rollouts(path)
    assert len(records) == len(kept) + len(after)
    for got in records:  # every record on disk is a whole, correctly labelled trajectory
        assert got.rewards == pytest.approx([expected_reward(turn, reply_text(tiny_tok, s.completion_ids))
                                             for turn, s in enumerate(got.steps, 1)])


def test_a_reference_kl_failure_writes_nothing_of_its_step_and_resumes(tmp_path):
    """The built-in trainer writes a step's rollouts only after its loss and optimizer step: a reference model that
    fails mid-run leaves the file with exactly the earlier steps' batches, and --resume goes on from the checkpoint."""
    from gym_llm_adapters.training import TrainConfig, Trainer

    cfg = TrainConfig(algorithm="grpo", env_id="LLMGSM8K-v0", model="tiny", out_dir=tmp_path / "run", engine="hf",
                      device="cpu", env_kwargs={"source": "arithmetic", "max_operand": 9}, steps=4, num_tasks=2,
                      group_size=2, max_new_tokens=8, max_seq_len=128, eval_every=0, eval_episodes=4, save_every=2,
                      progress=False, learning_rate=1e-4)
    with Trainer(cfg) as trainer:
        real = None

        def failing_reference(step, metrics):
            nonlocal real
            if step == 3 and "train/loss" in metrics:  # from step 4 on, the reference model fails
                real = trainer.reference

                class Broken:
                    def __call__(self, batch):
                        raise RuntimeError("reference model lost")

                trainer.reference = Broken()

        trainer.metrics.callbacks.append(failing_reference)
        with pytest.raises(RuntimeError, match="reference model lost"):
            trainer.run()
    records = read_rollouts(cfg.out_dir / "rollouts.jsonl")
    assert len(records) == 3 * 4  # steps 1-3, whole; nothing of step 4
    with Trainer(cfg, resume=True) as trainer:
        result = trainer.run()
    assert result.steps == 4 and len(read_rollouts(cfg.out_dir / "rollouts.jsonl")) == 4 * 4


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()],
                         ids=["enospc", "ctrl-c"])
def test_a_failed_write_leaves_nothing_on_disk_and_loses_no_batch(setup, tiny_tok, hf_engine, exc, monkeypatch):
    collector, engine, reward, writer, path = setup
    first = collector.next_batch()
    size = path.stat().st_size
    real_write = writer._file.write

    def failing_write(data):
        real_write(data[: len(data) // 2])  # half the batch reached the file, then the disk filled / Ctrl-C
        raise exc

    monkeypatch.setattr(writer._file, "write", failing_write)
    with pytest.raises(type(exc)):
        collector.next_batch()
    assert path.stat().st_size == size  # cut back to where the batch began
    monkeypatch.undo()
    second = collector.next_batch()  # the batch that failed to write, written now
    third = collector.next_batch()
    for batch in (first, second, third):
        check_batch(batch, hf_engine, tiny_tok)
    check_file(path, [first, second, third])


class StageDownOnce:
    """A reward stage (a reply's word count) whose second call raises, as a judge whose server went down would."""

    source, weight = "test:words", 0.5

    def __init__(self):
        self.calls: list[list[Trajectory]] = []

    def score(self, trajectories, tasks):
        from gym_llm_adapters.reward_stages import Score

        self.calls.append(list(trajectories))
        if len(self.calls) == 2:
            raise ConnectionError("judge server down")
        return [Score(float(len(t.steps[-1].completion_text.split()))) for t in trajectories]


def test_a_reward_stage_that_raises_loses_no_batch(tmp_path, tiny_tok, hf_engine):
    """The popped batch stays held, unscored: the next call scores those same trajectories before stepping any env,
    and the file holds each batch once, scored."""
    stage, path = StageDownOnce(), tmp_path / "rollouts.jsonl"
    with RolloutWriter(path) as writer, Collector(chat_env(tiny_tok, RewardFault()), hf_engine, SAMPLING,
                                                  episodes_per_batch=2 * GROUP, seed=0, writer=writer,
                                                  reward_stages=[stage]) as collector:
        first = collector.next_batch()
        with pytest.raises(ConnectionError, match="judge server down") as caught:
            collector.next_batch()
        assert "kept, unscored" in " ".join(caught.value.__notes__)
        assert len(read_rollouts(path)) == len(first)  # nothing of the failed batch on disk
        steps = collector.stats.env_steps
        second = collector.next_batch()
        assert collector.stats.env_steps == steps  # nothing new collected: the held batch came back
        assert [id(t) for t in second] == [id(t) for t in stage.calls[1]] == [id(t) for t in stage.calls[2]]
        third = collector.next_batch()
    for batch in (first, second, third):
        check_batch(batch, hf_engine, tiny_tok)
        for t in batch:
            words = float(len(t.steps[-1].completion_text.split()))
            assert t.scores == [{"source": "test:words", "value": words, "weight": 0.5, "error": None}]
    check_file(path, [first, second, third])
    assert [t.scores for t in read_rollouts(path)] == [t.scores for b in (first, second, third) for t in b]


KILLED_WRITER = """
import os, signal, sys
sys.path[:0] = {paths!r}
import numpy as np
from gym_llm_adapters.rollout_io import RolloutWriter
from gym_llm_adapters.types import Trajectory

def trajectory(i):
    return Trajectory(task_id=i, group_id=i, round=0, token_ids=np.arange(4 + i), policy_mask=np.ones(4 + i, np.int8),
                      logprobs=np.full(4 + i, -0.5, np.float32), prompt_length=0, rewards=[float(i)], versions=[0],
                      terminated=True, truncated=False, env_id="LLMChat-v0")

writer = RolloutWriter(sys.argv[1])
writer.write([trajectory(0), trajectory(1)])
writer.write([trajectory(2), trajectory(3)])
real = writer._file.write
def write_then_die(data):  # the third batch: its records reach the file, then the process is killed
    real(data[: data.rindex(b'{{"kind":"batch"')])
    writer._file.flush()
    os.kill(os.getpid(), signal.SIGKILL)
writer._file.write = write_then_die
writer.write([trajectory(4), trajectory(5)])
"""


def test_a_killed_writer_leaves_exactly_the_completed_batches(tmp_path, caplog):
    path = tmp_path / "killed.jsonl"
    repo = Path(__file__).resolve().parents[2]
    script = KILLED_WRITER.format(paths=[str(repo), str(repo / "adapters")])
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    records = read_rollouts(path)
    assert [r.task_id for r in records] == [0, 1, 2, 3]  # the third batch never committed
    assert "never committed" in caplog.text
    with RolloutWriter(path) as writer:  # a new writer cuts the uncommitted tail, then appends
        writer.write(records[:1])
    assert [r.task_id for r in read_rollouts(path)] == [0, 1, 2, 3, 0]


def test_a_corrupt_record_is_dropped_with_its_line_and_the_rest_kept(tmp_path, caplog):
    path = tmp_path / "corrupt.jsonl"
    trajectories = [Trajectory(task_id=i, group_id=i, round=0, token_ids=np.arange(3), policy_mask=np.ones(3, np.int8),
                               logprobs=np.full(3, -1.0, np.float32), prompt_length=0, rewards=[1.0], versions=[0],
                               terminated=True, truncated=False) for i in range(4)]
    with RolloutWriter(path) as writer:
        writer.write(trajectories[:2])
        writer.write(trajectories[2:])
    lines = path.read_bytes().split(b"\n")
    assert lines[2].startswith(b'{"kind":"trajectory"')  # line 3: the second record
    lines[2] = lines[2].replace(b'"rewards":[1.0]', b'"rewards":[9.0]')  # a flipped reward: a lie, not a tear
    lines[4] = lines[4][: len(lines[4]) // 2]  # line 5: the third record, torn
    path.write_bytes(b"\n".join(lines))
    records = read_rollouts(path)
    assert [r.task_id for r in records] == [0, 3]
    assert ":3: dropping a corrupt record" in caplog.text and ":5: dropping a corrupt record" in caplog.text


@pytest.mark.slow
def test_vllm_engine_faults_are_caught_the_same_way(tmp_path, tiny_tok, vllm_engine):
    """Every engine fault at the first, a middle and the last sub-env, and a failing sub-env, with the vLLM engine."""
    reward = RewardFault()
    engine = FaultyEngine(vllm_engine)
    returned = []
    with RolloutWriter(tmp_path / "v.jsonl") as writer:
        collector = Collector(chat_env(tiny_tok, reward), engine, SAMPLING, episodes_per_batch=2 * GROUP, seed=0,
                              writer=writer)
        returned.append(collector.next_batch())
        for kind in ENGINE_FAULTS:
            for position in POSITIONS.values():
                engine.fault = (kind, position)
                with pytest.raises(EngineOutputError):
                    collector.next_batch()
        returned.append(collector.next_batch())
        fail_sub_env_once(collector, NUM_ENVS // 2, ValueError("verifier crashed"))
        returned += [collector.next_batch() for _ in range(2)]
        assert collector.stats.restarts == 1
    for batch in returned:
        check_batch(batch, vllm_engine, tiny_tok)
    check_file(tmp_path / "v.jsonl", returned)
