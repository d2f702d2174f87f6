"""LoRA in the built-in trainer (``TrainConfig.lora_rank``) on the tiny model: only the adapter trains, the base never
changes, the engine serves every pushed adapter, the reference is the base with the adapter off (or the warm-started
adapter), a Ctrl-C leaves a checkpoint that PEFT loads, a resume continues bit for bit, and export merges exactly."""

from __future__ import annotations

import json
import os
import shutil
import signal

import numpy as np
import pytest
import torch

import gym_llm  # noqa: F401
from gym_llm_adapters.lora import LoraSettings
from gym_llm_adapters.rollout_io import read_rollouts
from gym_llm_adapters.training import TrainConfig, Trainer
from gym_llm_adapters.training import lora_run
from gym_llm_adapters.training.checkpoint import latest_checkpoint, load_trainer_state, read_saved_state

# a format reward gives a warm-started tiny model's groups different rewards (so GRPO steps move the adapter)
ENV = {"source": "arithmetic", "max_operand": 9, "prompt_template": "{question}", "format_reward": 0.5}


def config(tmp_path, **overrides) -> TrainConfig:
    settings = dict(algorithm="grpo", env_id="LLMGSM8K-v0", env_kwargs=ENV, model="tiny", out_dir=tmp_path / "run",
                    engine="hf", device="cpu", sft_warmup_steps=4, sft_learning_rate=3e-3, sft_batch_size=16,
                    learning_rate=3e-3, steps=4, num_tasks=2, group_size=4, max_new_tokens=16, max_seq_len=128,
                    eval_every=2, eval_episodes=8, save_every=100, beta=0.01, progress=False, lora_rank=4)
    settings.update(overrides)
    return TrainConfig(**settings)


def base_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The policy's base weights under their names in the model's own checkpoint (PEFT's ``base_layer`` dropped)."""
    return {name.replace(".base_layer.", "."): p.detach().clone() for name, p in trainer.policy.named_parameters()
            if "lora_" not in name}


def adapter_weights(trainer: Trainer, name: str = "default") -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if "lora_" in n and f".{name}." in n}


def as_trained(saved_name: str) -> str:
    """A PEFT file's tensor name as the trained adapter's parameter is called on the wrapped model:
    ``base_model.model.X.lora_A.weight`` -> ``X.lora_A.default.weight``."""
    return saved_name.removeprefix("base_model.model.").replace(".weight", ".default.weight")


def fixed_sequence(tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tokenize=True,
                                        add_generation_prompt=True, return_dict=False)
    prompt = len(ids)
    ids = torch.tensor([list(ids) + tokenizer.encode("3 + 4 = 7\n#### 7", add_special_tokens=False)])  # (1, T)
    mask = torch.zeros_like(ids)
    mask[:, prompt:] = 1
    return ids, torch.ones_like(ids), mask


def logprobs_of(model, tokenizer) -> torch.Tensor:
    from gym_llm_adapters.logprobs import token_logprobs

    ids, attention, mask = fixed_sequence(tokenizer)
    with torch.no_grad():
        return token_logprobs(model, ids, attention, mask)[mask.bool()]  # (n,)


# ---------------------------------------------------------------------------------------------- settings (fast)
def test_lora_settings_are_checked_before_anything_loads(tmp_path):
    with pytest.raises(ValueError, match="lora_alpha set without lora_rank"):
        config(tmp_path, lora_rank=None, lora_alpha=8.0)
    with pytest.raises(ValueError, match="rank must be an int >= 1, got 0: use e.g. 16"):
        config(tmp_path, lora_rank=0)
    cfg = config(tmp_path, lora_target_modules=["q_proj", "v_proj"])
    assert cfg.lora == LoraSettings(rank=4, target_modules=("q_proj", "v_proj")) and cfg.lora.scale_alpha == 8.0
    assert json.loads(json.dumps(cfg.to_json()))["lora_target_modules"] == ["q_proj", "v_proj"]
    # the tiny model's narrowest layer is k_proj/v_proj: 128 -> 64 (one KV head of 64)
    with pytest.raises(ValueError, match=r"rank 65 is above the narrowest targeted layer's width \(64\).*--lora-rank 16"):
        lora_run.check_model(LoraSettings(rank=65), "tiny")
    lora_run.check_model(LoraSettings(rank=64), "tiny")
    with pytest.raises(ValueError, match=r"\['qkv_proj'\] are not linear layers of this model; its linear layers are "
                                         r"\['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', "
                                         r"'v_proj'\]"):
        lora_run.check_model(LoraSettings(rank=4, target_modules=("qkv_proj",)), "tiny")
    lora_run.check_engine("hf", 4)
    with pytest.raises(ValueError, match="needs an engine that serves adapters"):
        lora_run.check_engine("server", 4)


def test_a_resume_with_other_lora_settings_is_refused(tmp_path):
    record = lora_run.lora_record(LoraSettings(rank=8), base_model="tiny", base_path="/x")
    run = tmp_path / "run"
    lora_run.check_resume(LoraSettings(rank=8, alpha=16), "tiny", record, run=run)  # alpha 16 = the default 2 r
    lora_run.check_resume(None, "tiny", None, run=run)
    with pytest.raises(ValueError, match="is a full fine-tune .* got --lora-rank 8 .* --model .*run --lora-rank 8"):
        lora_run.check_resume(LoraSettings(rank=8), "tiny", None, run=run)
    with pytest.raises(ValueError, match="is a LoRA run \\(--lora-rank 8 --lora-alpha 16 .*\\), got no --lora-rank"):
        lora_run.check_resume(None, "tiny", record, run=run)
    with pytest.raises(ValueError, match="with --lora-rank 8 .* got --lora-rank 4 .* cannot change its shape"):
        lora_run.check_resume(LoraSettings(rank=4), "tiny", record, run=run)
    with pytest.raises(ValueError, match="--lora-target-modules q_proj"):
        lora_run.check_resume(LoraSettings(rank=8, target_modules=("q_proj",)), "tiny", record, run=run)
    with pytest.raises(ValueError, match="belongs to --model tiny, got --model smollm2"):
        lora_run.check_resume(LoraSettings(rank=8), "smollm2", record, run=run)


def test_the_reference_scope_scores_the_base_on_the_policy_itself(tiny_model_path):
    """ReferenceKL(policy, scope=disable_adapter): the base's log-probs, no copy of a weight, the policy's mode kept."""
    from transformers import AutoModelForCausalLM

    from gym_llm_adapters.kl import ReferenceKL
    from gym_llm_adapters.lora import add_lora
    from gym_llm_adapters.models.tokenizers import tiny_tokenizer

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    expected = logprobs_of(base, tiny_tokenizer())
    peft = add_lora(base, LoraSettings(rank=4, dropout=0.1))
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # an adapter that changes the model
    policy = peft.get_base_model().train()
    reference = ReferenceKL(policy, scope=peft.disable_adapter)
    ids, attention, mask = fixed_sequence(tiny_tokenizer())
    got = reference.ref_logprobs(ids, attention, mask)[mask.bool()]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert policy.training and (logprobs_of(policy, tiny_tokenizer()) - expected).abs().max() > 1e-2


def test_export_of_a_full_fine_tune_writes_its_model_without_the_trainer_state(tmp_path, tiny_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gym_llm_adapters.cli.export import export
    from gym_llm_adapters.training.checkpoint import TrainState, save_checkpoint

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)
    state = TrainState(step=1, phase="grpo", version=1, rollout_records=0, reference=None, config={})
    save_checkpoint(tmp_path / "run", state, model=model, tokenizer=AutoTokenizer.from_pretrained(tiny_model_path),
                    optimizer=optimizer, scheduler=scheduler, keep=1)
    out = export(tmp_path / "run", tmp_path / "out", merge=True)  # nothing to merge: the model as it is
    assert not {"trainer_state.json", "optimizer.pt", "rng.pt"} & {f.name for f in out.iterdir()}
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


# ---------------------------------------------------------------------------------------------- training (slow)
@pytest.mark.slow
def test_lora_run_trains_the_adapter_only_stops_on_ctrl_c_and_resumes_bit_for_bit(tmp_path, tiny_model_path):
    from safetensors.torch import load_file

    original = load_file(str(tiny_model_path / "model.safetensors"))
    at_rl_start = {}

    def callback(step, metrics):
        if step == 4 and "sft/loss" in metrics:  # the adapter the warm start leaves: RL's reference
            at_rl_start.update(adapter_weights(trainer))
        if step == 6 and "train/loss" in metrics:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: the step finishes, a checkpoint is saved

    cfg = config(tmp_path, steps=4)
    trainer = Trainer(cfg, callbacks=[callback])
    with trainer:
        initial = adapter_weights(trainer)
        result = trainer.run()
        assert result.interrupted and result.steps == 6
        # the base never changed, bit for bit; the adapter did; AdamW holds the adapter's parameters only
        base = base_weights(trainer)
        assert base.keys() == original.keys() and all(torch.equal(base[k], original[k]) for k in original)
        trained = adapter_weights(trainer)
        assert any(not torch.equal(trained[k], initial[k]) for k in initial)
        params = trainer.optimizer.param_groups[0]["params"]
        # 2 layers x rank 4 x (in + out) of q and o (128 -> 128), k and v (128 -> 64), gate, up and down (128 <-> 256)
        assert sum(p.numel() for p in params) == sum(t.numel() for t in trained.values()) == 2 * 4 * (
            2 * (128 + 128) + 2 * (128 + 64) + 3 * (128 + 256))
        engine_version, policy_logprobs = trainer.engine.version, logprobs_of(trainer.policy, trainer.tokenizer)
        with trainer.peft_model.disable_adapter():
            base_logprobs = logprobs_of(trainer.policy, trainer.tokenizer)
    rows = [json.loads(line) for line in (cfg.out_dir / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in grpo] == [5, 6]
    # RL's reference is the warm-started adapter: the policy equals it at RL start (KL 0), then moves away
    assert grpo[0]["train/kl"] < 1e-6 and grpo[1]["train/kl"] > 1e-4, grpo
    reference = load_file(str(cfg.out_dir / "checkpoints" / "reference" / "adapter_model.safetensors"))
    assert {as_trained(k): v for k, v in reference.items()}.keys() == at_rl_start.keys()
    assert all(torch.equal(v, at_rl_start[as_trained(k)]) for k, v in reference.items())
    # the engine sampled from the trainer's adapter every step (HF engine: the same float ops)
    assert all(r["train/engine_log_ratio_abs_max"] < 1e-5 for r in grpo)
    versions = [int(r["train/version"]) for r in grpo]
    assert versions == [versions[0], versions[0] + 1]
    trajectories = read_rollouts(cfg.out_dir / "rollouts.jsonl")
    assert [t.versions[0] for t in trajectories[::8]] == [v - 1 for v in versions]  # the adapter that sampled each
    evals = sorted(p.name for p in (cfg.out_dir / "eval").glob("step-*.jsonl"))
    assert evals == ["step-000000.jsonl", "step-000002.jsonl", "step-000004.jsonl", "step-000006.jsonl"]
    eval_versions = [read_rollouts(cfg.out_dir / "eval" / e)[0].versions[0] for e in evals]
    assert eval_versions == sorted(eval_versions) and eval_versions[0] == 0 and len(set(eval_versions)) == 4

    # the Ctrl-C checkpoint: the adapter in PEFT's format, loadable on the base; AdamW state of the adapter only
    checkpoint = latest_checkpoint(cfg.out_dir)
    assert checkpoint.name == "step-000006" and lora_run.is_lora_checkpoint(checkpoint)
    assert not (checkpoint / "model.safetensors").exists() and (checkpoint / "tokenizer.json").is_file()
    state = load_trainer_state(checkpoint)
    assert state.version == engine_version and state.lora["rank"] == 4 and state.lora["base_model"] == "tiny"
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_path), checkpoint)
    torch.testing.assert_close(logprobs_of(loaded.get_base_model(), trainer.tokenizer), policy_logprobs,
                               rtol=0, atol=1e-5)
    assert (policy_logprobs - base_logprobs).abs().max() > 1e-3  # the adapter is not a no-op
    saved = read_saved_state(checkpoint)
    assert len(saved.optimizer["optimizer"]["state"]) == len(trained)

    # resume two copies of the stopped run: each starts exactly where the checkpoint is, and both go on identically
    copy = tmp_path / "copy"
    shutil.copytree(cfg.out_dir, copy)
    finals = []
    for out in (cfg.out_dir, copy):
        resumed_cfg = config(tmp_path, steps=5, out_dir=out)
        with Trainer(resumed_cfg, resume=True) as resumed:
            assert resumed.engine.version == engine_version and resumed.engine.adapter is not None
            assert all(torch.equal(resumed_at, trained[k]) for k, resumed_at in adapter_weights(resumed).items())
            resumed._start_phase("grpo")  # what run() does first: the saved AdamW state applied
            state_now = resumed.optimizer.state_dict()["state"]
            for i, values in saved.optimizer["optimizer"]["state"].items():
                assert all(torch.equal(values[key], state_now[i][key]) for key in values)
            result = resumed.run()
            assert result.steps == 9 and not result.interrupted
            finals.append(adapter_weights(resumed))
            assert all(torch.equal(v, original[k]) for k, v in base_weights(resumed).items())
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        grpo = [r for r in rows if "train/loss" in r]
        assert [r["step"] for r in grpo] == [5, 6, 7, 8, 9]
        assert grpo[2]["train/version"] == engine_version + 1  # the next push after the resumed version
        # the resumed engine served the saved adapter from its first request, not the base model
        assert all(r["train/engine_log_ratio_abs_max"] < 1e-5 for r in grpo[2:])
    assert finals[0].keys() == finals[1].keys() and all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


@pytest.mark.slow
def test_grpo_without_warm_start_uses_the_base_with_the_adapter_off_as_reference(tmp_path):
    cfg = config(tmp_path, sft_warmup_steps=0, steps=2, eval_every=0, learning_rate=2e-2, lora_dropout=0.1,
                 lora_target_modules=("q_proj", "v_proj"), env_kwargs={**ENV, "format_reward": 0.0})
    with Trainer(cfg) as trainer:
        result = trainer.run()
        assert trainer.state.reference is None and not (cfg.out_dir / "checkpoints" / "reference").exists()
        assert trainer.reference.scope == trainer.peft_model.disable_adapter
        assert trainer.policy.training  # the reference forward put the shared model back in train mode (dropout on)
        names = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in adapter_weights(trainer)}
        assert names == {"q_proj", "v_proj"}
    assert result.steps == 2
    rows = [json.loads(line) for line in (cfg.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert abs([r["train/kl"] for r in rows if "train/kl" in r][0]) < 1e-9  # a fresh adapter (B = 0) is the base


@pytest.mark.slow
def test_export_writes_the_adapter_or_a_merged_model_with_the_same_logprobs(tmp_path, tiny_model_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gym_llm_adapters.cli import main

    cfg = config(tmp_path, sft_warmup_steps=3, steps=1, eval_every=0)
    with Trainer(cfg) as trainer:
        trainer.run()
        expected = logprobs_of(trainer.policy, trainer.tokenizer)
        tokenizer = trainer.tokenizer
    merged_dir, adapter_dir = tmp_path / "merged", tmp_path / "adapter"
    assert main(["export", str(cfg.out_dir), "--merge", "--out", str(merged_dir)]) == 0
    assert (merged_dir / "config.json").is_file() and not (merged_dir / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)  # a plain model: no PEFT
    torch.testing.assert_close(logprobs_of(merged, tokenizer), expected, rtol=0, atol=1e-5)
    assert AutoTokenizer.from_pretrained(merged_dir).encode("3 + 4") == tokenizer.encode("3 + 4")

    assert main(["export", str(cfg.out_dir / "checkpoints" / "step-000004"), "--out", str(adapter_dir)]) == 0
    note = json.loads((adapter_dir / "base_model.json").read_text())
    assert note["base_model"] == str(tiny_model_path) and note["base_model_spec"] == "tiny"
    assert not (adapter_dir / "optimizer.pt").exists() and not (adapter_dir / "trainer_state.json").exists()
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(note["base_model"]), adapter_dir)
    torch.testing.assert_close(logprobs_of(loaded.get_base_model(), tokenizer), expected, rtol=0, atol=1e-5)
    assert main(["export", str(cfg.out_dir), "--out", str(adapter_dir)]) == 2  # nothing is overwritten
    assert "exists and is not an empty folder" in capsys.readouterr().err


@pytest.mark.slow
def test_lora_run_on_vllm_serves_every_pushed_adapter_and_vllm_loads_the_merged_export(tmp_path):
    pytest.importorskip("vllm")
    from gym_llm_adapters.engines import VLLMEngine
    from gym_llm_adapters.training.setup import build_engine

    cfg = config(tmp_path, engine="vllm", sft_warmup_steps=3, steps=3, eval_every=0)
    with Trainer(cfg) as trainer:
        assert isinstance(trainer.engine, VLLMEngine) and trainer.engine.serves_adapters
        result = trainer.run()
        assert trainer.engine.adapter.version == trainer.engine.version == int(trainer.metrics.series(
            "train/version")[1][-1])
        expected = logprobs_of(trainer.policy, trainer.tokenizer)
        ids, _, mask = fixed_sequence(trainer.tokenizer)
        served = torch.from_numpy(trainer.engine.logprobs([ids[0].numpy()])[0])[mask[0].bool()]
        torch.testing.assert_close(served, expected, rtol=0, atol=1e-4)  # vLLM serves the trainer's adapter
    assert result.steps == 6
    rows = [json.loads(line) for line in (cfg.out_dir / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if "train/loss" in r]
    # each step's episodes came from the adapter the trainer had: vLLM's log-probs of them match the trainer's
    assert all(r["train/engine_log_ratio_abs_max"] < 1e-3 for r in grpo), [r["train/engine_log_ratio_abs_max"]
                                                                           for r in grpo]
    assert grpo[0]["train/kl"] < 1e-6  # RL starts at its reference (the warm-started adapter)
    trajectories = read_rollouts(cfg.out_dir / "rollouts.jsonl")
    assert [t.versions[0] for t in trajectories[::8]] == [int(r["train/version"]) - 1 for r in grpo]

    # a resumed vLLM engine starts on the saved adapter at the saved version, and the run goes on from it
    with Trainer(config(tmp_path, engine="vllm", sft_warmup_steps=3, steps=4, eval_every=0), resume=True) as resumed:
        assert resumed.engine.version == trajectories[-1].versions[0] + 1 and resumed.engine.adapter is not None
        assert resumed.run().steps == 7
        expected = logprobs_of(resumed.policy, resumed.tokenizer)  # what the run's last checkpoint holds
    last = [json.loads(line) for line in (cfg.out_dir / "metrics.jsonl").read_text().splitlines()][-2]
    assert last["step"] == 7 and last["train/engine_log_ratio_abs_max"] < 1e-3, last

    from gym_llm_adapters.cli.export import export

    merged = export(cfg.out_dir, tmp_path / "merged", merge=True)
    engine = build_engine("vllm", merged, device="cpu", dtype="float32", max_model_len=128)  # a plain model, no LoRA
    try:
        served = torch.from_numpy(engine.logprobs([ids[0].numpy()])[0])[mask[0].bool()]
    finally:
        engine.close()
    torch.testing.assert_close(served, expected, rtol=0, atol=1e-4)


@pytest.mark.slow
def test_lora_with_bf16_autocast_and_micro_batches_keeps_a_bf16_base_and_an_fp32_adapter(tmp_path, tiny_model_path):
    from safetensors.torch import load_file

    original = load_file(str(tiny_model_path / "model.safetensors"))
    cfg = config(tmp_path, sft_warmup_steps=2, steps=2, eval_every=0, dtype="bfloat16", micro_batch_size=3)
    with Trainer(cfg) as trainer:
        result = trainer.run()
        base = base_weights(trainer)
        # the frozen base in the compute dtype (it never steps: nothing to round away), the adapter and AdamW in fp32
        assert all(t.dtype == torch.bfloat16 and torch.equal(t, original[k].to(torch.bfloat16)) for k, t in base.items())
        assert all(t.dtype == torch.float32 for t in adapter_weights(trainer).values())
        assert all(v.dtype == torch.float32 for s in trainer.optimizer.state.values() for v in s.values()
                   if torch.is_tensor(v) and v.dim() > 0)
    assert result.steps == 4
    rows = [json.loads(line) for line in (cfg.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(np.isfinite(r["train/loss"]) and r["train/engine_log_ratio_abs_max"] < 0.1 for r in rows
               if "train/loss" in r)
