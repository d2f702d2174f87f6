"""The built-in training loop on the tiny model: it learns, checkpoints, stops on request and resumes exactly."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

import gym_llm  # noqa: F401
from gym_llm_adapters.rollout_io import read_rollouts
from gym_llm_adapters.training import TrainConfig, Trainer
from gym_llm_adapters.training.checkpoint import latest_checkpoint, load_trainer_state

pytestmark = pytest.mark.slow

ENV = {"source": "arithmetic", "max_operand": 9, "prompt_template": "{question}"}


def config(tmp_path, **overrides) -> TrainConfig:
    settings = dict(algorithm="grpo", env_id="LLMGSM8K-v0", env_kwargs=ENV, model="tiny", out_dir=tmp_path / "run",
                    engine="hf", device="cpu", sft_warmup_steps=60, sft_learning_rate=2e-3, learning_rate=3e-4,
                    lr_warmup_steps=5, steps=6, num_tasks=4, group_size=4, max_new_tokens=16, max_seq_len=128,
                    eval_every=0, eval_episodes=40, save_every=100, progress=False)
    settings.update(overrides)
    return TrainConfig(**settings)


def test_sft_warm_start_then_grpo_learns_and_leaves_a_loadable_run(tmp_path):
    cfg = config(tmp_path)
    with Trainer(cfg) as trainer:
        result = trainer.run()
    assert not result.interrupted and result.steps == 66
    first, last = result.evals[0][1], result.evals[-1][1]
    assert first.reward_mean == 0.0  # a random-init model
    assert last.reward_mean >= 0.25, [s.reward_mean for _, s in result.evals]  # it learned arithmetic
    run = cfg.out_dir
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "sft/loss" in r] == list(range(1, 61))
    grpo = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in grpo] == list(range(61, 67))
    assert all(np.isfinite(r["train/kl"]) and r["train/kl"] >= 0 for r in grpo)
    versions = [r["train/version"] for r in grpo]
    assert versions == sorted(versions) and len(set(versions)) == 6  # one weight push per GRPO step
    # where each step's time went: the phases are disjoint parts of the step (the rest is metric bookkeeping)
    phases = ("rollout", "reference", "policy", "optimizer", "sync", "write")
    for r in grpo:
        assert all(r[f"time/{p}_s"] >= 0 for p in phases)
        parts = sum(r[f"time/{p}_s"] for p in phases)
        # the phases cover the step: the rest (bookkeeping) is small — 10%, or 50 ms on a loaded machine, where a
        # tiny model's 90 ms step once left 9 ms to it
        assert parts <= r["train/step_s"] and r["train/step_s"] - parts < max(0.1 * r["train/step_s"], 0.05), (parts, r)
        assert r["time/rollout_generate_s"] + r["time/rollout_env_s"] <= r["time/rollout_s"]
        assert r["time/rollout_generate_s"] > 0 and r["time/policy_s"] > 0
    assert set(result.step_time) == {*phases, "rollout_generate", "rollout_env"}
    assert result.step_time["policy"] == pytest.approx(np.mean([r["time/policy_s"] for r in grpo]))
    sft_losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    assert np.mean(sft_losses[-5:]) < 0.5 * np.mean(sft_losses[:5])
    # every GRPO step's episodes were written, whole groups, token-exact, tagged with the pushing version
    trajectories = read_rollouts(run / "rollouts.jsonl")
    assert len(trajectories) == 6 * 16
    assert {t.versions[0] for t in trajectories} == {int(v) - 1 for v in versions}
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    checkpoint = latest_checkpoint(run)
    assert checkpoint is not None and checkpoint.name == "step-000066"
    state = load_trainer_state(checkpoint)
    assert state.rollout_records == 96 and state.reference is not None  # RL's reference = the warm-started policy
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), trainer.policy.state_dict().values()))


def test_stop_then_resume_continues_where_the_checkpoint_is(tmp_path):
    stops = []

    def stop_at_step_3(step, metrics):
        if step == 3 and "train/loss" in metrics:
            stops.append(step)
            trainer.request_stop()

    cfg = config(tmp_path, sft_warmup_steps=0, steps=5, num_tasks=2, group_size=4, tensorboard=True,
                 lr_warmup_steps=1, lr_schedule="linear")
    trainer = Trainer(cfg, callbacks=[stop_at_step_3])
    with trainer:
        result = trainer.run()
    assert stops == [3] and result.interrupted and result.steps == 3
    assert list((cfg.out_dir / "tensorboard").glob("events.out.tfevents.*"))  # metrics also went to TensorBoard
    checkpoint = latest_checkpoint(cfg.out_dir)
    assert checkpoint.name == "step-000003"
    assert load_trainer_state(checkpoint).rollout_records == 3 * 8
    # a crash after the next batch was written but before its checkpoint: the resume cuts it off again
    extra = read_rollouts(cfg.out_dir / "rollouts.jsonl")[:8]
    from gym_llm_adapters.rollout_io import RolloutWriter

    with RolloutWriter(cfg.out_dir / "rollouts.jsonl") as writer:
        writer.write(extra)
    with open(cfg.out_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "train/loss": 123.0}) + "\n")

    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(cfg)
    with Trainer(cfg, resume=True) as resumed:
        assert resumed.engine.version == 3 and resumed.state.step == 3
        result = resumed.run()
    assert result.steps == 5 and not result.interrupted
    rows = [json.loads(line) for line in (cfg.out_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "train/loss" in r]
    assert steps == [1, 2, 3, 4, 5]  # the stale step-4 row of the crashed run is gone
    assert all(r.get("train/loss") != 123.0 for r in rows)
    # the resumed run continues the learning-rate schedule (1 warm-up step, then linear decay to 0 after step 5)
    lrs = [r["train/lr"] for r in rows if "train/loss" in r]
    np.testing.assert_allclose(lrs, [3e-4 * f for f in (0.5, 1.0, 0.75, 0.5, 0.25)], rtol=1e-6)
    trajectories = read_rollouts(cfg.out_dir / "rollouts.jsonl")
    assert len(trajectories) == 5 * 8
    assert [t.versions[0] for t in trajectories[::8]] == [0, 1, 2, 3, 4]


def test_bad_settings_say_what_to_change(tmp_path):
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        config(tmp_path, group_size=1)
    with pytest.raises(ValueError, match="set by the training loop"):
        config(tmp_path, env_kwargs={**ENV, "max_seq_len": 64})
    with pytest.raises(ValueError, match="max_new_tokens .* must be <= max_seq_len"):
        config(tmp_path, max_new_tokens=512, max_seq_len=128)
    with pytest.raises(ValueError, match="have no worked solutions"):
        cfg = config(tmp_path, algorithm="sft", sft_warmup_steps=0, env_id="LLMChat-v0", env_kwargs={})
        with Trainer(cfg) as trainer:
            trainer.run()


def test_sft_on_selected_rollouts(tmp_path, tiny_tok):
    """`train sft --sft-data rollouts.jsonl --sft-min-reward 1`: rejection sampling from a rollout file."""
    from gym_llm_adapters.rollout_io import RolloutWriter
    from gym_llm_adapters.training.sft_data import reference_trajectories, rollout_trajectories

    good = reference_trajectories("LLMGSM8K-v0", ENV, tiny_tok, max_seq_len=128, max_new_tokens=16, max_examples=24)
    assert all(t.reward == 1.0 for t in good)  # the env rewards its own worked answers
    bad = [dataclasses.replace(t, rewards=[0.0]) for t in good[:8]]
    path = tmp_path / "rollouts.jsonl"
    with RolloutWriter(path) as writer:
        writer.write(good + bad)
    assert len(rollout_trajectories(path, min_reward=1.0)) == 24
    with Trainer(config(tmp_path, algorithm="sft", sft_warmup_steps=0, steps=30, sft_data=str(path),
                        sft_min_reward=1.0, learning_rate=2e-3, sft_batch_size=8)) as trainer:
        assert len(trainer.evaluator.task_ids) == 40
        result = trainer.run()
        assert len(trainer._sft_examples) == 24
    losses = trainer.metrics.series("sft/loss")[1]
    assert len(losses) == 30 and np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert result.evals[-1][1].reward_mean > result.evals[0][1].reward_mean
    with pytest.raises(ValueError, match="no trajectory .* passes the selection"):
        rollout_trajectories(path, min_reward=2.0)


def _a_reward(task, messages):
    return 0.0


def test_settings_with_a_function_or_object_still_save(tmp_path):
    """env_kwargs may hold what gym.make takes but JSON cannot (a reward_fn, a tokenizer): the settings saved with
    each checkpoint name it (a function by its import path) instead of failing at the first save."""
    cfg = TrainConfig(algorithm="grpo", env_id="LLMChat-v0", model="tiny", out_dir=tmp_path,
                      env_kwargs={"prompts": ["x"], "reward_fn": _a_reward, "extra": {"obj": object()}})
    saved = json.loads(json.dumps(cfg.to_json()))
    assert saved["env_kwargs"]["reward_fn"] == {"python": f"{__name__}:_a_reward"}
    assert saved["env_kwargs"]["extra"]["obj"].startswith("<object object at")
    assert saved["env_kwargs"]["prompts"] == ["x"] and saved["out_dir"] == str(tmp_path)


def _length_reward(task, messages) -> float:
    return float(len(messages[-1].content) % 5)


def test_several_passes_per_batch_take_the_old_log_probs_once(tmp_path):
    """num_iterations=2 (GRPO's mu): one step is two AdamW updates on the same batch, the second's ratio against the
    policy's log-probs from before the first (pi_old, taken once), the schedule moved once. Replayed here by hand from
    the step's own batch, starting from the same weights."""
    import copy

    from gym_llm_adapters.losses import AdvantageConfig, GRPOLoss, GRPOLossConfig, MCAdvantage
    from gym_llm_adapters.logprobs import token_logprobs
    from gym_llm_adapters.types import RolloutBatch

    cfg = config(tmp_path, sft_warmup_steps=0, steps=3, num_iterations=2, learning_rate=5e-3, lr_warmup_steps=0,
                 lr_schedule="linear", log_kl=False, beta=0.0, temperature=1.0, env_id="LLMChat-v0",
                 env_kwargs={"prompts": ["Say something.", "Name a colour."], "max_turns": 1,
                             "reward_fn": _length_reward})
    with Trainer(cfg) as trainer:
        trainer._start_phase("grpo")
        start = copy.deepcopy(trainer.policy).eval()
        seen = []
        real = trainer.collector.next_batch
        trainer.collector.next_batch = lambda: seen.append(real()) or seen[-1]
        metrics = trainer._grpo_step()
        after = {k: v.detach().clone() for k, v in trainer.policy.named_parameters()}
        lr_now = trainer.scheduler.get_last_lr()[0]
        trainer.close()
    assert lr_now == pytest.approx(cfg.learning_rate * 2 / 3)  # linear decay over 3 steps, moved once (not twice)
    assert metrics["train/reward_std"] > 0  # something to learn from: the two passes move the weights
    assert metrics["perf/policy_tokens_per_s"] > 0 and metrics["perf/policy_mfu"] > 0  # both passes' tokens, per s
    assert metrics["perf/generate_tokens_per_s"] > 0 and "perf/reference_mfu" not in metrics  # no reference: log_kl off
    batch = MCAdvantage(AdvantageConfig(group_size=cfg.group_size))(RolloutBatch.from_trajectories(seen[0], pad_id=0))
    t = batch.to_torch()
    loss_fn = GRPOLoss(GRPOLossConfig(beta=0.0, epsilon=cfg.epsilon, aggregation=cfg.aggregation,
                                      importance_sampling=cfg.importance_sampling, stale_tokens=cfg.stale_tokens))
    policy = start.train()
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.learning_rate,
                                  weight_decay=cfg.weight_decay)
    old = None
    for _ in range(2):
        logprobs = token_logprobs(policy, t["input_ids"], t["attention_mask"], t["policy_mask"], temperature=1.0,
                                  top_p=1.0, share_prefix=cfg.share_prefix, max_tokens_per_forward=8192)
        out = loss_fn.from_batch(logprobs, batch, old_logprobs=old, current_version=0,
                                 num_items=max(loss_fn.counted_tokens(batch, current_version=0), 1))
        old = logprobs.detach() if old is None else old
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(list(policy.parameters()), cfg.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad()
    for name, value in policy.named_parameters():
        torch.testing.assert_close(value.detach(), after[name], rtol=1e-4, atol=1e-6)
