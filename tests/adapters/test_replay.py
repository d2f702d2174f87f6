"""Record and replay: real collector episodes of every env id, replayed bit-exact through fresh envs; a changed scorer,
changed data and a changed tokenizer reported at the first step that differs; the ``gym-llm replay`` command."""

from __future__ import annotations

import doctest
import importlib
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import gym_llm
from gym_llm_adapters.cli import main
from gym_llm_adapters.collector import Collector
from gym_llm_adapters.engines import SamplingConfig
from gym_llm_adapters.env_spec import RecordedEnvSpec, decode_kwargs, encode_kwargs
from gym_llm_adapters.replay import ReplayError, count_episodes, replay
from gym_llm_adapters.rollout_io import RolloutWriter, iter_rollouts, read_rollouts, truncate_rollouts
from tests.envs.cases import make_kwargs

REPO = Path(__file__).resolve().parents[2]
SAMPLING = SamplingConfig(max_tokens=6, temperature=1.0)
COLLECTED_IDS = [info.id for info in gym_llm.ENVS if "eval" in info.commands]
"""Every env id the collector drives: those `gym-llm eval` takes (LLMHashing-v0 is token-level, one action = one id)."""
EPISODES = {"LLMBrowser-v0": 16, "LLMPythonTool-v0": 32}
"""Episodes per env id and mode (text, tokens), default 80: fewer where an episode costs more (the browser env's prompt
is ~10x longer; each tool episode restarts its sandboxed interpreter). 8 ids: 1,056 episodes in all."""


def collect(env, engine, writer, *, episodes: int, group_size: int = 2):
    """``episodes`` whole-group episodes of ``env`` through the collector, written by ``writer``."""
    with Collector(env, engine, SAMPLING, episodes_per_batch=2 * group_size, seed=0, writer=writer) as collector:
        trajectories = []
        while len(trajectories) < episodes:
            trajectories += collector.next_batch()
    env.close()
    return trajectories


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, hf_engine):
    """One rollout file of collector episodes of every env id in text and tokens mode: 1,056 episodes, 16 env specs."""
    path = tmp_path_factory.mktemp("replay") / "every_env.jsonl"
    counts = {}
    with RolloutWriter(path) as writer:
        for env_id in COLLECTED_IDS:
            for mode in ("text", "tokens"):
                kwargs = make_kwargs(env_id, mode)
                if env_id == "LLMTokens-v0":  # its episodes otherwise run until 512 characters / 256 tokens
                    kwargs["max_steps"] = 4
                env = gym.make_vec(env_id, num_envs=8, group_size=2, vectorization_mode="vector_entry_point",
                                   **kwargs)
                counts[env_id, mode] = len(collect(env, hf_engine, writer, episodes=EPISODES.get(env_id, 80)))
    return path, counts


@pytest.mark.slow  # ~40 s: recording 1,056 episodes (the IFEval scorer's and the browser's start included)
def test_every_env_id_replays_bit_exact(recorded):
    path, counts = recorded
    assert sum(counts.values()) >= 1000 and {env_id for env_id, _ in counts} == set(COLLECTED_IDS)
    specs = [s for s in iter_rollouts(path, specs=True) if isinstance(s, RecordedEnvSpec)]
    assert len(specs) == len({s.spec_id for s in specs}) == 2 * len(COLLECTED_IDS)  # each written once
    assert all(s.unreplayable == {} and s.gym_llm_version == gym_llm.__version__ for s in specs)
    report = replay(path)
    assert report.exact, report.summary()
    assert len(report.episodes) == sum(counts.values()) == count_episodes(path)
    replayed = {(e.env_id, specs_by_id(specs)[e.spec_id].mode) for e in report.episodes}
    assert replayed == set(counts)
    steps = sum(e.replayed_steps for e in report.episodes)
    assert steps > len(report.episodes)  # multi-turn episodes (chat follow-ups, token env steps) among them


def specs_by_id(specs):
    return {s.spec_id: s for s in specs}


@pytest.mark.slow  # the file of the test above, and a subprocess that imports transformers
def test_cli_replays_a_file_and_says_exact(recorded):
    path, _ = recorded
    out = subprocess.run([sys.executable, "-m", "gym_llm_adapters.cli", "replay", str(path), "--limit", "40", "--json"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["exact"] and report["episodes"] == 40 and report["counts"]["exact"] == 40
    assert "replay" in out.stderr  # the progress bar


# ---------------------------------------------------------------------------------------------- a changed scorer
TASKS = [{"prompt": "Say hi.", "follow_ups": []},
         {"prompt": "Count to three.", "follow_ups": ["Again."]},
         {"prompt": "Name a colour.", "follow_ups": ["Another.", "One more."]}]


def turn_reward(task, messages):
    """The recorded scorer: the conversation's length (2 after turn 1, 4 after turn 2, ...)."""
    return float(len(messages))


def changed_turn_reward(task, messages):
    """A changed scorer: one point more from the second turn on."""
    return float(len(messages)) + (1.0 if len(messages) >= 4 else 0.0)


def chat_env(tok, **kwargs):
    return gym.make_vec("LLMChat-v0", num_envs=4, group_size=2, vectorization_mode="vector_entry_point", prompts=TASKS,
                        mode="tokens", tokenizer=tok, max_turns=3, max_seq_len=256, max_action_tokens=8,
                        reward_fn=turn_reward, reward_timeout_s=None, **kwargs)


@pytest.fixture
def chat_file(tmp_path, tiny_tok, hf_engine):
    path = tmp_path / "chat.jsonl"
    with RolloutWriter(path) as writer:
        trajectories = collect(chat_env(tiny_tok), hf_engine, writer, episodes=12)
    lengths = {len(t.steps) for t in trajectories}
    assert 1 in lengths and max(lengths) >= 2
    return path, trajectories


def test_a_changed_scorer_is_reported_at_the_first_differing_step(chat_file, monkeypatch, capsys):
    path, trajectories = chat_file  # its spec names the scorer as code to import: replayed as a trusted file
    assert replay(path, trust_file=True).exact
    recorded_version = gym_llm.__version__
    monkeypatch.setattr(sys.modules[__name__], "turn_reward", changed_turn_reward)  # the recorded name, new code
    monkeypatch.setattr(gym_llm, "__version__", "9.9.9")
    report = replay(path, trust_file=True)
    assert not report.exact and len(report.episodes) == len(trajectories)
    for result, trajectory in zip(report.episodes, trajectories):
        assert (result.task_id, result.steps) == (trajectory.task_id, len(trajectory.steps))
        if len(trajectory.steps) == 1:  # the changed scorer pays the same for turn 1
            assert result.status == "exact"
            continue
        mismatch = result.mismatch
        assert result.status == "differs" and mismatch.step == 1 and result.replayed_steps == 2
        assert [d.field for d in mismatch.differences] == ["reward"]
        assert (mismatch.differences[0].recorded, mismatch.differences[0].replayed) == (4.0, 5.0)
        assert mismatch.hint.startswith("changed scorer")
        assert f"recorded with gym_llm {recorded_version}, replayed with 9.9.9" in mismatch.hint
    assert main(["replay", str(path), "--no-progress", "--trust-file"]) == 1
    text = capsys.readouterr().out
    assert "differ" in text and "step 1: reward differs: recorded 4.0, replayed 5.0 — changed scorer" in text


def test_an_argument_that_could_not_be_recorded_must_be_given(tmp_path, tiny_tok, hf_engine):
    from gym_llm.envs.chat import LLMChatVectorEnv

    scorer = lambda task, messages: float(len(messages))  # noqa: E731  (a lambda cannot be imported again)
    path = tmp_path / "lambda.jsonl"
    env = LLMChatVectorEnv(4, group_size=2, prompts=TASKS, mode="tokens", tokenizer=tiny_tok, max_turns=3,
                           max_seq_len=256, max_action_tokens=8, reward_fn=scorer, reward_timeout_s=None)
    with RolloutWriter(path) as writer:  # the vector class made directly: its id is found in the registry
        collect(env, hf_engine, writer, episodes=4)
    spec, = [s for s in iter_rollouts(path, specs=True) if isinstance(s, RecordedEnvSpec)]
    assert spec.env_id == "LLMChat-v0" and list(spec.unreplayable) == ["reward_fn"]
    report = replay(path)
    assert report.count("skipped") == 4 and "reward_fn" in report.episodes[0].skipped
    assert "env_kwargs" in report.episodes[0].skipped
    assert replay(path, env_kwargs={"reward_fn": scorer}).exact


# ---------------------------------------------------------------------------------------------- changed data
def test_changed_data_is_reported_at_step_0(tmp_path, gsm8k_test_file, tiny_tok, hf_engine):
    data = tmp_path / "gsm8k.jsonl"
    records = [json.loads(line) for line in gsm8k_test_file.read_text().splitlines()[:6]]
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    env = gym.make_vec("LLMGSM8K-v0", num_envs=4, group_size=2, vectorization_mode="vector_entry_point",
                       data_files=str(data))
    path = tmp_path / "gsm8k_rollouts.jsonl"
    with RolloutWriter(path) as writer:
        trajectories = collect(env, hf_engine, writer, episodes=8)
    assert replay(path).exact
    changed = trajectories[0].task_id
    records[changed]["question"] = records[changed]["question"].replace(" ", "  ", 1)
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = replay(path)
    for result in report.episodes:
        if result.task_id != changed:
            assert result.status == "exact"
            continue
        mismatch = result.mismatch
        assert mismatch.step == 0 and mismatch.field == "observation" and result.replayed_steps == 0
        assert mismatch.hint.startswith("changed data") and "character" in mismatch.differences[0].where
    assert report.count("differs") == sum(t.task_id == changed for t in trajectories) > 0


def test_a_changed_tokenizer_is_named_in_text_mode(tmp_path, hf_engine, qwen_tokenizer):
    env = gym.make_vec("LLMCountdown-v0", num_envs=4, group_size=2, vectorization_mode="vector_entry_point")
    path = tmp_path / "countdown.jsonl"
    with RolloutWriter(path) as writer:
        collect(env, hf_engine, writer, episodes=4)
    report = replay(path, tokenizer=qwen_tokenizer)  # the collector encoded with the tiny model's tokenizer
    mismatch = report.episodes[0].mismatch
    assert mismatch.step == 0 and mismatch.field == "prompt_ids"
    assert "tokenizer changed" in mismatch.hint and "encodes differently from the recorded one" in mismatch.hint


# ---------------------------------------------------------------------------------------------- other files
def test_gymnasium_sync_vector_env_with_next_step_autoreset_replays(tmp_path, hf_engine):
    env = gym.make_vec("LLMGSM8K-v0", num_envs=3, vectorization_mode="sync", source="arithmetic", max_operand=9,
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP})
    path = tmp_path / "sync.jsonl"
    with RolloutWriter(path) as writer:
        collect(env, hf_engine, writer, episodes=6, group_size=1)
    spec, = [s for s in iter_rollouts(path, specs=True) if isinstance(s, RecordedEnvSpec)]
    assert spec.env_kwargs == {"source": "arithmetic", "max_operand": 9} and spec.vector["class"] == "SyncVectorEnv"
    assert spec.vector["autoreset_mode"] == "NextStep"
    assert replay(path).exact


def test_eval_out_is_replayable(tmp_path, capsys):
    out = tmp_path / "eval.jsonl"
    assert main(["eval", "LLMGSM8K-v0", "--source", "arithmetic", "--env-arg", "max_operand=9", "--env-arg",
                 "prompt_template={question}", "--model", "tiny",
                 "--engine", "hf", "--n", "6", "--batch", "3", "--max-new-tokens", "6", "--max-seq-len", "128",
                 "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["replay", str(out), "--no-progress"]) == 0
    assert "6 exact, 0 differ, 0 not replayed" in capsys.readouterr().out


def test_steps_mode_parquet_file_replays_its_episodes(tmp_path, tiny_tok, hf_engine):
    path = tmp_path / "steps.parquet"
    with RolloutWriter(path) as writer, Collector(chat_env(tiny_tok), hf_engine, SAMPLING, steps_per_batch=5, seed=3,
                                                   writer=writer) as collector:
        steps = [s for _ in range(3) for s in collector.next_batch()]  # 4 sub-envs: the last vector step is cut
    report = replay(path, env_kwargs={"reward_fn": turn_reward})  # the scorer given again, not imported from the file
    assert report.exact and sum(e.steps for e in report.episodes) == len(steps) == 15
    assert any(not e.complete for e in report.episodes)  # episodes the file holds only the start of replay too
    assert count_episodes(path) is None  # step records: episodes are known only once grouped


def test_resume_truncation_keeps_the_spec_and_appends_replay(tmp_path, tiny_tok, hf_engine):
    path = tmp_path / "run.jsonl"
    with RolloutWriter(path) as writer:
        first = collect(chat_env(tiny_tok), hf_engine, writer, episodes=4)
        collect(chat_env(tiny_tok), hf_engine, writer, episodes=4)
    assert len(read_rollouts(path)) >= 8
    truncate_rollouts(path, len(first))  # a run resumed from a checkpoint after its first batch
    assert len(read_rollouts(path)) == len(first)
    with RolloutWriter(path) as writer:  # the resumed run's writer writes the spec again with its first batch
        collect(chat_env(tiny_tok), hf_engine, writer, episodes=4)
    kinds = [type(item).__name__ for item in iter_rollouts(path, specs=True)]
    assert kinds[0] == "RecordedEnvSpec" and kinds.count("RecordedEnvSpec") == 2
    assert replay(path, env_kwargs={"reward_fn": turn_reward}).exact


def test_a_file_without_spec_says_how_to_record_one(tmp_path, tiny_tok, hf_engine, capsys):
    path = tmp_path / "old.jsonl"
    trajectories = collect(chat_env(tiny_tok), hf_engine, None, episodes=4)
    for trajectory in trajectories:  # as a writer from before env specs wrote them
        trajectory.spec_id = ""
        for step in trajectory.steps:
            step.spec_id = ""
    with RolloutWriter(path) as writer:
        writer.write(trajectories)
    assert len(read_rollouts(path)) == 4  # still readable
    with pytest.raises(ReplayError, match=r"holds no env spec.*RolloutWriter\(path\)"):
        replay(path)
    assert main(["replay", str(path), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "gym-llm replay: error:" in error and "Collector(" in error and "gym-llm eval --out" in error
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such rollout file" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- the spec itself
def test_spec_arguments_round_trip_and_tampering_is_refused(tiny_tok):
    from gym_llm_adapters.env_spec import tokenizer_fingerprint

    kwargs = {"n": 3, "x": 0.1, "stop": ("a", ["b"]), "path": Path("t.jsonl"), "fn": turn_reward, "tok": tiny_tok,
              "nested": {"k": [1, None, True]}, "arr": np.int64(5)}
    encoded, unreplayable = encode_kwargs(kwargs)
    assert unreplayable == {}
    assert json.loads(json.dumps(encoded)) == encoded
    assert encoded["tok"]["$tokenizer"]["fingerprint"] == tokenizer_fingerprint(tiny_tok)
    with pytest.raises(ValueError, match=r"fn names code to import .*import_callables=True"):
        decode_kwargs(encoded, tokenizer=lambda payload: payload["name_or_path"])  # not from a file you do not trust
    decoded = decode_kwargs(encoded, tokenizer=lambda payload: payload["name_or_path"], import_callables=True)
    assert decoded == {**kwargs, "tok": tiny_tok.name_or_path, "arr": 5}
    assert type(decoded["stop"]) is tuple and isinstance(decoded["path"], Path) and decoded["fn"] is turn_reward
    _, bad = encode_kwargs({"f": lambda: 0, "o": object(), "d": {1: 2}})
    assert set(bad) == {"f", "o", "d"} and "importable" in bad["f"]
    spec = RecordedEnvSpec(env_id="LLMChat-v0", env_kwargs=encoded, mode="tokens", action_length=8,
                           gym_llm_version="0.1.0", gymnasium_version=gym.__version__)
    assert RecordedEnvSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    with pytest.raises(ValueError, match="does not match its content"):
        RecordedEnvSpec.from_dict({**spec.to_dict(), "env_kwargs": {**encoded, "n": 4}})


@pytest.mark.parametrize("name", ["gym_llm_adapters.env_spec", "gym_llm_adapters.replay_report"])
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
