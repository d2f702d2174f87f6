"""LLM judges and reward models against real parts: a ``vllm serve`` of the tiny model as the judge (started here on
127.0.0.1), the collector over ``LLMChat-v0`` with the transformers engine, and a sequence-classifier reward model.

The tiny model is random-init: unconstrained it answers noise (a malformed judge reply, every time), and with the
server's structured output (``Endpoint(structured=True)``) it must answer in the score format, so both paths are real.
"""

from __future__ import annotations

import random
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task
from gym_llm.rewards.judge import Endpoint, GroupJudge, LLMJudge, Rubric
from gym_llm_adapters.engines import SamplingConfig
from gym_llm_adapters.engines.server_process import VLLMServer

pytestmark = pytest.mark.slow

PROMPTS = [{"prompt": "Describe the sea.", "criterion": "The reply must be under 10 words."},
           {"prompt": "Name a colour.", "criterion": "The reply must mention red."},
           {"prompt": "Say hello.", "criterion": "The reply must be in French."}]
SAMPLING = SamplingConfig(max_tokens=12, temperature=1.0)


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("judge-serve")
    srv = VLLMServer(tiny_model_path, served_model_name="judge",
                     args=["--dtype", "float32", "--enforce-eager", "--kv-cache-memory-bytes", str(64 << 20)],
                     env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}, log_path=folder / "server.log")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def structured(server):
    return Endpoint(f"{server.base_url}/v1", "judge", structured=True)


@pytest.fixture(scope="module")
def free(server):
    return Endpoint(f"{server.base_url}/v1", "judge")


TASK = Task(0, (Message("user", "Describe the sea."),), data=PROMPTS[0])


def conversation(reply):
    return [*TASK.messages, Message("assistant", reply)]


def chat_env(tok, reward_fn=None, num_envs=6, group_size=3):
    return gym.make_vec("LLMChat-v0", num_envs=num_envs, group_size=group_size, vectorization_mode="vector_entry_point",
                        prompts=PROMPTS, mode="tokens", tokenizer=tok, max_turns=1, max_seq_len=256,
                        max_action_tokens=16, reward_fn=reward_fn)


def test_a_score_is_parsed(structured):
    judge = LLMJudge(structured, Rubric.criterion(None), seed=0)
    result = judge.judge(TASK, conversation("It is wide and blue."))
    assert result.error is None and isinstance(result.score, int) and 0 <= result.score <= 10
    last = result.text.strip().splitlines()[-1]
    assert last == f"SCORE: {result.score}" and result.reward == pytest.approx(result.score / 10)
    reward, info = judge(TASK, conversation("It is wide and blue."))
    assert reward == result.reward and info == {"reward_source": judge.source, "judge_cached": True,
                                                "judge_score": result.score}


def test_a_cached_repeat_makes_no_call(structured):
    judge = LLMJudge(structured, Rubric.criterion(None), seed=0)
    first = judge.judge(TASK, conversation("Salty water."))
    calls, tokens = judge.client.calls, judge.client.tokens
    again = judge.judge(TASK, conversation("Salty water."))
    assert calls == 1 and tokens > 0 and again.cached and again.score == first.score and again.tokens == 0
    assert judge.client.calls == calls and judge.client.tokens == tokens
    judge.judge(TASK, conversation("Salty water!"))  # another conversation is another call
    assert judge.client.calls == calls + 1


def test_a_deadline_hit_is_a_failed_reward_in_time(free):
    """The server must run past the deadline whatever the model writes: ``ignore_eos`` (a vLLM request field, sent
    through ``extra_body``) makes it generate all 1,000 tokens (seconds on this CPU) against a 0.3 s deadline; without
    it the random-init model sometimes ended its reply in time and the test saw a parse error instead."""
    slow = Rubric(Rubric.criterion(None).template, max_tokens=1000)
    endpoint = Endpoint(free.base_url, free.model, extra_body={"ignore_eos": True})
    judge = LLMJudge(endpoint, slow, deadline_s=0.3, max_retries=3)
    start = time.monotonic()
    result = judge.judge(TASK, conversation("Waves."))
    assert result.reward is None and "deadline of 0.3 s passed" in result.error
    assert time.monotonic() - start < 2.0


def test_a_malformed_judge_reply_is_a_failed_reward_counted_and_left_out_of_the_loss(free, hf_engine, tiny_tok):
    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.losses import MCAdvantage
    from gym_llm_adapters.types import RolloutBatch

    judge = LLMJudge(free, Rubric.criterion(None))  # the tiny model unconstrained: noise, never 'SCORE: n'
    env = chat_env(tiny_tok, reward_fn=judge)
    with Collector(env, hf_engine, SAMPLING, episodes_per_batch=6, seed=0) as collector:
        batch = collector.next_batch()
        assert collector.stats.reward_failed == 6
    env.close()
    for t in batch:
        error = t.steps[-1].info["reward_error"]
        assert t.reward_failed and error.startswith("JudgeError: the judge's last line is not 'SCORE: n'")
        assert t.steps[-1].info["reward_source"] == judge.source and t.rewards == [0.0]
    rollout = RolloutBatch.from_trajectories(batch)
    assert np.isnan(rollout.rewards).all()
    assert len(MCAdvantage()(rollout)) == 0  # nothing of it reaches the loss


def test_group_ranking_maps_back_to_the_right_episodes(structured, hf_engine, tiny_tok):
    """The collector's group stage scores each group in one call, members shown in sub-env order; shuffling the
    trajectories (groups finishing out of order) gives every trajectory the same score, and each equals the score
    the judge gives that reply when the group is sent by hand."""
    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.reward_stages import GroupJudgeStage, conversation_of

    judge = GroupJudge(structured, Rubric.group_criterion(None), seed=0)
    stage = GroupJudgeStage(judge, weight=2.0)
    env = chat_env(tiny_tok, num_envs=9, group_size=3)
    tasks = env.unwrapped.parts.tasks if hasattr(env, "unwrapped") else env.parts.tasks
    with Collector(env, hf_engine, SAMPLING, episodes_per_batch=9, seed=1, reward_stages=[stage],
                   env_reward_weight=0.0) as collector:
        batch = collector.next_batch()
    env.close()
    assert collector.stats.reward_failed == 0
    for t in batch:
        assert len(t.scores) == 1 and t.scores[0]["source"] == judge.source and t.scores[0]["weight"] == 2.0
        assert t.reward == pytest.approx(2.0 * t.scores[0]["value"])
    recorded = {id(t): t.scores[0]["value"] for t in batch}
    by_hand: dict[int, float] = {}
    groups: dict[int, list] = {}
    for t in batch:
        groups.setdefault(t.group_id, []).append(t)
    assert len(groups) == 3
    for members in groups.values():
        members.sort(key=lambda t: t.env_index)
        task = tasks[members[0].task_id]
        before = conversation_of(members[0], task)[:-1]
        results = judge.judge_group(task, before, [m.steps[-1].completion_text for m in members])
        for m, r in zip(members, results):
            by_hand[id(m)] = r.reward
    assert by_hand == recorded
    calls = judge.client.calls
    shuffled = list(batch)
    random.Random(0).shuffle(shuffled)
    scores = stage.score(shuffled, [tasks[t.task_id] for t in shuffled])
    assert {id(t): s.value for t, s in zip(shuffled, scores)} == recorded
    assert judge.client.calls == calls  # the same groups again: cached


def test_a_reward_models_scores_equal_the_classifier_run_by_hand(tiny_model_path, tiny_tok, tmp_path):
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from gym_llm_adapters.reward_stages import RewardModelStage, conversation_of
    from gym_llm_adapters.types import StepRecord, Trajectory

    config = AutoConfig.from_pretrained(tiny_model_path, num_labels=1)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    model.config.pad_token_id = tiny_tok.pad_token_id
    model.save_pretrained(tmp_path / "rm")
    tiny_tok.save_pretrained(tmp_path / "rm")
    stage = RewardModelStage(tmp_path / "rm", batch_size=3, weight=0.5)
    replies = ["Blue.", "The sea is wide, deep and salty, and it covers most of the planet.", "", "Waves " * 20,
               "Red!", "Bonjour"]
    trajectories = [Trajectory(0, 0, 0, np.zeros(3, np.int64), np.zeros(3, np.int8), np.zeros(3, np.float32), 1, [0.0],
                               [0], True, False, steps=[StepRecord(i, 0, 0, 0, 1, np.zeros(1), np.zeros(1),
                                                                   np.zeros(1, np.float32), 0.0, True, False, 0,
                                                                   completion_text=r)])
                    for i, r in enumerate(replies)]
    scores = stage.score(trajectories, [TASK] * len(replies))
    tok = AutoTokenizer.from_pretrained(tmp_path / "rm")
    by_hand = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    for t, s in zip(trajectories, scores):  # one text at a time, unpadded
        text = tok.apply_chat_template([{"role": m.role, "content": m.content} for m in conversation_of(t, TASK)],
                                       tokenize=False)
        with torch.no_grad():
            logit = by_hand(**tok(text, return_tensors="pt")).logits[0, 0].item()
        assert s.error is None and s.value == pytest.approx(logit, abs=1e-5)
    assert len({round(s.value, 6) for s in scores}) == len(replies)  # the texts are told apart


def test_bad_judges_are_refused_when_made(server, free, hf_engine, tiny_tok):
    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.reward_stages import JudgeStage

    start = time.monotonic()
    with pytest.raises(ValueError, match="does not serve model 'qwen'.*serves \\['judge'\\]"):
        LLMJudge(Endpoint(f"{server.base_url}/v1", "qwen"), Rubric.criterion("x"))
    with pytest.raises(ConnectionError, match="HTTP 404.*usually ends in /v1"):
        LLMJudge(Endpoint(server.base_url, "judge"), Rubric.criterion("x"))
    assert time.monotonic() - start < 5
    env = gym.make_vec("LLMChat-v0", num_envs=2, group_size=2, vectorization_mode="vector_entry_point", mode="tokens",
                       tokenizer=tiny_tok, max_seq_len=256, max_action_tokens=16)  # the built-in prompts: no criterion
    with pytest.raises(ValueError, match="cannot judge LLMChat-v0's tasks.*criterion"):
        Collector(env, hf_engine, SAMPLING, episodes_per_batch=2, reward_stages=[JudgeStage(LLMJudge(
            free, Rubric.criterion(None)))])
    with pytest.raises(ValueError, match="episodes_per_batch"):
        Collector(env, hf_engine, SAMPLING, steps_per_batch=2, reward_stages=[JudgeStage(LLMJudge(
            free, Rubric.criterion("x")))])
    env.close()


@pytest.mark.parametrize("structured", [True, False], ids=["scored", "judge-fails"])
def test_the_trainer_trains_on_judged_rewards_and_never_on_failed_ones(server, tmp_path, structured):
    """``TrainConfig(judge=...)``: every step's episodes are judged; the rollout file records each score with its source;
    with a judge that always fails (the tiny model unconstrained) every episode is counted and left out, so the step
    changes no weight."""
    from gym_llm_adapters.rollout_io import read_rollouts
    from gym_llm_adapters.training import TrainConfig, Trainer

    judge = {"url": f"{server.base_url}/v1", "model": "judge", "mode": "group", "structured": structured,
             "env_weight": 0.0}
    cfg = TrainConfig(algorithm="grpo", env_id="LLMChat-v0", env_kwargs={"prompts": PROMPTS, "max_turns": 1},
                      eval_env_id="LLMGSM8K-v0", eval_env_kwargs={"source": "arithmetic"}, judge=judge, model="tiny",
                      out_dir=tmp_path / "run", engine="hf", device="cpu", steps=2, num_tasks=2, group_size=3,
                      max_new_tokens=8, max_seq_len=128, eval_every=0, eval_episodes=4, save_every=100,
                      learning_rate=1e-3, log_kl=False, progress=False)
    with Trainer(cfg) as trainer:
        before = {k: v.detach().clone() for k, v in trainer.policy.named_parameters()}
        trainer._start_phase("grpo")
        metrics = trainer._grpo_step()
        changed = any(not torch.equal(before[k], v) for k, v in trainer.policy.named_parameters())
        trainer.close()
    records = read_rollouts(cfg.out_dir / "rollouts.jsonl")
    assert metrics["judge/calls"] == 2 and metrics["judge/tokens"] > 0  # one call per group, two groups
    assert len(records) == 6 and all(len(t.scores) == 1 and t.scores[0]["source"].startswith("judge:judge/")
                                     for t in records)
    if structured:
        assert metrics["train/reward_failed"] == 0 and changed is (metrics["train/reward_std"] > 0)
        assert all(t.env_weight == 0.0 and t.reward == pytest.approx(t.scores[0]["value"]) for t in records)
    else:
        assert metrics["train/reward_failed"] == 6 and not changed and all(t.reward_failed for t in records)


def test_replay_rechecks_the_envs_rewards_and_says_why_it_cannot_recheck_the_judges(structured, hf_engine, tiny_tok,
                                                                                     tmp_path):
    from gym_llm_adapters.collector import Collector
    from gym_llm_adapters.replay import replay
    from gym_llm_adapters.reward_stages import JudgeStage
    from gym_llm_adapters.rollout_io import RolloutWriter

    judge = LLMJudge(structured, Rubric.criterion(None), seed=0)
    env = chat_env(tiny_tok, num_envs=4, group_size=2)
    with RolloutWriter(tmp_path / "r.jsonl") as writer, \
            Collector(env, hf_engine, SAMPLING, episodes_per_batch=4, seed=2, writer=writer,
                      reward_stages=[JudgeStage(judge)]) as collector:
        collector.next_batch()
    env.close()
    report = replay(tmp_path / "r.jsonl")
    assert report.exact and report.unchecked_scores == {judge.source: 4}
    assert f"reward-stage scores not re-checked (4 from {judge.source})" in report.summary()


@pytest.mark.parametrize("structured", [True, False], ids=["scored", "judge-fails"])
def test_trls_grpo_trainer_trains_on_a_group_judge_and_never_on_its_failures(server, tiny_model_path, tmp_path,
                                                                            structured):
    """JudgeReward as TRL's reward function: each prompt's completions judged together, scores equal to the judge's
    by hand; a judge that always fails gives None, which TRL leaves out (advantage 0): no weight moves."""
    import warnings

    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from gym_llm_adapters.trl import env_dataset
    from gym_llm_adapters.trl.rewards import JudgeReward, completion_text

    judge = GroupJudge(Endpoint(f"{server.base_url}/v1", "judge", structured=structured), Rubric.group_criterion(None),
                       seed=0)
    calls = []

    def reward(**kwargs):
        out = JudgeReward(judge)(**kwargs)
        calls.append((kwargs, out))
        return out

    reward.__name__ = "group_judge"
    dataset = env_dataset("LLMChat-v0", prompts=PROMPTS, extra_columns=lambda task: {"criterion": task.data["criterion"]})
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=1, learning_rate=1e-2, report_to=[], use_cpu=True, bf16=False,
                      logging_steps=1, save_strategy="no", seed=0, beta=0.0)
    trainer = GRPOTrainer(model=str(tiny_model_path), reward_funcs=reward, train_dataset=dataset, args=args,
                          processing_class=AutoTokenizer.from_pretrained(tiny_model_path))
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    changed = any(not torch.equal(p.detach(), before[name]) for name, p in trainer.model.named_parameters())
    kwargs, out = calls[0]
    assert len(out) == 4 and len({str(p) for p in kwargs["prompts"]}) == 1  # one prompt's group
    if structured:
        prompt = kwargs["prompts"][0]
        task = Task(0, tuple(Message(m["role"], m["content"]) for m in prompt), data={"criterion": kwargs["criterion"][0]})
        by_hand = judge.judge_group(task, list(task.messages), [completion_text(c) for c in kwargs["completions"]])
        assert out == [r.reward for r in by_hand] and all(v is not None for v in out)
        assert changed is (len(set(out)) > 1)
    else:
        assert out == [None] * 4 and not changed


def test_an_expected_score_is_the_judges_probability_weighted_digit(structured):
    """score='expected': the reward is sum n p(n) / sum p(n) over the score digits at the position the judge wrote
    one; recomputed here from the server's own log-probs of the same request."""
    import math

    import openai

    from gym_llm.rewards.judge import _score_regex

    rubric = Rubric.criterion(None, low=0, high=1)
    judge = LLMJudge(structured, rubric, seed=0, score="expected")
    result = judge.judge(TASK, conversation("Waves and salt."))
    assert result.error is None and 0.0 <= result.reward <= 1.0 and judge.source.endswith("+expected")
    client = openai.OpenAI(base_url=structured.base_url, api_key="EMPTY")
    response = client.chat.completions.create(
        model="judge", messages=[{"role": "user", "content": judge.prompt(TASK, conversation("Waves and salt."))}],
        temperature=0.0, max_tokens=rubric.max_tokens, logprobs=True, top_logprobs=20,
        extra_body={"structured_outputs": {"regex": _score_regex(0, 1)}})
    digit = [c for c in response.choices[0].logprobs.content if c.token.strip().isdigit()][-1]
    p = {t.token.strip(): math.exp(t.logprob) for t in digit.top_logprobs if t.token.strip() in ("0", "1")}
    assert result.reward == pytest.approx(p.get("1", 0.0) / (p.get("0", 0.0) + p.get("1", 0.0)), abs=1e-6)
    with pytest.raises(ValueError, match="range must lie in 0..9"):
        LLMJudge(structured, Rubric.criterion(None), score="expected")
