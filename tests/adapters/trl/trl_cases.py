"""Shared settings of the TRL tests (imported by conftest.py and the tests): real GSM8K tasks, a tool env, and the
episodes that teach the tiny model to use the tool (see conftest.py)."""

from __future__ import annotations

import numpy as np

from gym_llm_adapters.types import Trajectory

TASK = 305  # GSM8K test row: "John arm wrestles 20 people.  He beats 80%.  How many people did he lose to?" -> 4
CODE_REPLY = "```python\nprint(20-16)\n```<|im_end|>"
ANSWER_REPLIES = ("#### 4<|im_end|>", "Not sure.<|im_end|>")
PLAIN_CHATML = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
                "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
"""ChatML without a tools section in the system prompt: keeps the test episodes short (~120 tokens)."""
TRAINING_CHATML = ("{%- for m in messages %}{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
                   "{% generation %}{{- m.content + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}"
                   "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
                   "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
"""``PLAIN_CHATML`` with ``{% generation %}`` markers around assistant turns (what SFT's assistant_only_loss needs)."""
TOOL_ENV = dict(max_turns=3, system_prompt="Run code.", prompt_template="{question}\nUse python.",
                chat_template=PLAIN_CHATML, sandbox={"timeout_s": 10.0})
"""``LLMPythonTool-v0`` arguments of the tests (besides ``data_files``)."""


def _ids(obs):
    return obs["input_ids"][obs["attention_mask"] == 1].tolist()


def teaching_episodes(tokenizer, data_files) -> list[tuple[list[int], list[int]]]:
    """``(token_ids, loss_mask)`` of the episodes to learn, recorded from the envs themselves."""
    import gymnasium as gym

    import gym_llm  # noqa: F401

    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    tokens = dict(mode="tokens", tokenizer=tokenizer, max_seq_len=512, max_action_tokens=64, data_files=data_files)
    episodes = []
    gsm8k = gym.make("LLMGSM8K-v0", **tokens)
    prompt = _ids(gsm8k.reset(options={"task_id": TASK})[0])
    for reply in ANSWER_REPLIES:
        episodes.append((prompt + encode(reply), [0] * len(prompt) + [1] * len(encode(reply))))
    tool = gym.make("LLMPythonTool-v0", **tokens, **TOOL_ENV)
    tool.reset(options={"task_id": TASK})
    obs, _, terminated, _, info = tool.step(np.asarray(encode(CODE_REPLY)))
    assert not terminated and '"status": "ok"' in info["tool_calls"], info
    so_far, mask = _ids(obs), info["policy_mask"][: len(_ids(obs))].tolist()
    for reply in ANSWER_REPLIES:
        episodes.append((so_far + encode(reply), mask + [1] * len(encode(reply))))
    tool.close()
    gsm8k.close()
    return episodes


def env_spans(trajectory: Trajectory) -> list[tuple[int, int]]:
    """``[start, stop)`` of the tokens the env appended between turns, read off the observations: turn ``k+1``'s
    observation is turn ``k``'s observation + its sampled ids + what the env added."""
    spans = []
    for before, after in zip(trajectory.steps, trajectory.steps[1:]):
        start = len(before.prompt_ids) + len(before.completion_ids)
        assert after.prompt_ids[:start].tolist() == before.prompt_ids.tolist() + before.completion_ids.tolist()
        spans.append((start, len(after.prompt_ids)))
    return spans


def check_trl_fields(fields: dict, trajectories: list[Trajectory], tokenizer) -> int:
    """The TRL fields are the trajectories, token-exact, with ``env_mask == 0`` exactly on env tokens; returns how
    many env tokens were masked."""
    masked = 0
    for i, t in enumerate(trajectories):
        P = len(t.steps[0].prompt_ids)
        last = t.steps[-1]
        full = last.prompt_ids.tolist() + last.completion_ids.tolist()  # what the env saw, in the end
        assert fields["prompt_ids"][i] == full[:P] and fields["prompt_ids"][i] + fields["completion_ids"][i] == full
        expected_mask = np.ones(len(full) - P, dtype=int)
        for start, stop in env_spans(t):
            expected_mask[start - P: stop - P] = 0
            masked += stop - start
            env_text = tokenizer.decode(full[start:stop])
            assert "<|im_start|>tool\n" in env_text and env_text.endswith("<|im_start|>assistant\n"), env_text
        assert fields["env_mask"][i] == expected_mask.tolist()
        sampled = np.concatenate([s.logprobs for s in t.steps]).tolist()
        logprobs = np.asarray(fields["logprobs"][i])
        assert logprobs[expected_mask == 1].tolist() == sampled and (logprobs[expected_mask == 0] == 0).all()
        assert fields["env_reward"][i] == sum(s.reward for s in t.steps) and fields["num_turns"][i] == len(t.steps)
    return masked


PEFT_LORA = dict(r=8, lora_alpha=16, target_modules="all-linear")
"""``LoraConfig`` of the PEFT tests: rank 8 on every linear layer but the output head (PEFT's ``"all-linear"``),
scale ``alpha / r = 2``."""


def check_tight_sampling_logs(logs: list[dict]) -> None:
    """TRL's per-step vLLM-vs-trainer metrics, for an fp32 engine (``colocated_vllm_fp32``): the log-probs vLLM
    sampled with equal the trainer's within float32 rounding (seen: max 1.7e-6 a token), so each step's generation
    ran on the weights the trainer had then. An engine one optimizer step behind is off by ~0.1-1 nats a token."""
    for step, entry in enumerate(logs):
        assert entry["sampling/sampling_logp_difference/max"] < 1e-3, (step, entry)
        # per sequence: exp of the summed token differences (TRL's default "sequence_mask" mode)
        assert abs(entry["sampling/importance_sampling_ratio/min"] - 1) < 0.01, (step, entry)
        assert abs(entry["sampling/importance_sampling_ratio/max"] - 1) < 0.01, (step, entry)


def check_kl_reference_is_the_base(trainer, logs: list[dict]) -> None:
    """``beta > 0`` with ``peft_config``: TRL builds no reference model and computes the reference with the adapter
    disabled. LoRA's ``B`` starts at 0, so the policy equals that reference at the first step (KL 0), not after."""
    assert trainer.ref_model is None
    assert abs(logs[0]["kl"]) < 1e-6 and logs[1]["kl"] > 1e-4, [entry["kl"] for entry in logs]


def sync_and_compare_to_peft(trainer, sequences: list[np.ndarray], checkpoint) -> dict[str, float]:
    """Sync TRL's colocated (fp32) engine after the last optimizer step and check that it serves the trained
    adapter, merged:

    * the engine's teacher-forced log-probs of ``sequences`` equal the trained PEFT model's (adapter on) within 1e-4
      nats a token on average (1e-3 at most) and are far from the base's (adapter off); before this sync they were
      far from the adapter's too (the last step moved it: a skipped sync could not pass unseen);
    * TRL's walk pushed exactly the checkpoint's tensors under the checkpoint's names (PEFT's ``base_model.model.``
      prefix and ``.base_layer`` stripped, the ``lora_`` tensors left out): a full push of merged weights;
    * afterwards the trainer's model is unmerged: no layer merged, base weights as before within fp32 rounding
      (``merge_adapter`` adds ``scale * B @ A`` in place, ``unmerge_adapter`` subtracts it), far below that delta.

    Returns the measured gaps (nats a token) and sizes.
    """
    import torch
    from peft.tuners.lora import LoraLayer
    from safetensors import safe_open

    from gym_llm_adapters.engines import HFEngine, VLLMEngine

    model, generation = trainer.model, trainer.vllm_generation
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        checkpoint_names = sorted(f.keys())
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    with torch.no_grad():
        delta = max(float(m.get_delta_weight("default").abs().max()) for m in model.modules()
                    if isinstance(m, LoraLayer))
    engine = VLLMEngine(llm=generation.llm)
    stale = engine.logprobs(sequences)  # the engine has the adapter of the step before the last
    pushed, walk = [], generation._iter_named_params

    def recorded_walk():
        for name, tensor in walk():
            pushed.append(name)
            yield name, tensor

    generation._iter_named_params = recorded_walk
    try:
        generation.sync_weights()
    finally:
        del generation._iter_named_params
    hf = HFEngine(model, tokenizer=trainer.processing_class)
    with torch.no_grad():
        adapter_on = hf.logprobs(sequences)
        with model.disable_adapter():
            adapter_off = hf.logprobs(sequences)
    synced = engine.logprobs(sequences)
    gap = lambda a, b: np.concatenate([np.abs(x - y) for x, y in zip(a, b)])  # noqa: E731
    to_on, to_off, stale_to_on = gap(synced, adapter_on), gap(synced, adapter_off), gap(stale, adapter_on)
    drift = max(float((p.detach() - base_before[n]).abs().max()) for n, p in model.named_parameters()
                if "lora_" not in n)
    measured = dict(to_adapter_mean=float(to_on.mean()), to_adapter_max=float(to_on.max()),
                    to_base_mean=float(to_off.mean()), stale_to_adapter_mean=float(stale_to_on.mean()),
                    base_drift=drift, delta_max=delta)
    assert to_on.mean() < 1e-4 and to_on.max() < 1e-3 and to_off.mean() > 0.1, measured
    assert stale_to_on.mean() > 0.1, measured
    assert sorted(pushed) == checkpoint_names, pushed
    assert not any(m.merged for m in model.modules() if isinstance(m, LoraLayer))
    assert drift <= 1e-6 and delta >= 1e-3, measured
    return measured
