"""GRPOLoss equals TRL 1.16's GRPO loss (value and parameter gradients) on identical inputs.

A real ``trl.GRPOTrainer`` is built around the tiny Qwen2 checkpoint; its ``_compute_loss(model, inputs)`` runs
its own forward over the prompt + completion tokens, while ours scores the same tokens with
``token_logprobs`` and applies :class:`GRPOLoss`. Old, reference and engine log-probs, advantages and masks are
shared. TRL computes the vLLM importance-sampling ratio while generating (``_generate_and_score_completions``),
so for IS we pass our :func:`importance_sampling_weights` to it as ``inputs["importance_sampling_ratio"]`` (the
weights themselves are checked against TRL's formula in test_grpo_loss.py) and set ``trainer.use_vllm`` — the
flag ``_compute_loss`` reads — without starting a vLLM engine the loss never touches.
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

from gym_llm_adapters.logprobs import token_logprobs
from gym_llm_adapters.losses import GRPOLoss, GRPOLossConfig, group_advantages, importance_sampling_weights

pytestmark = pytest.mark.slow

B, P, C = 4, 5, 6  # sequences, prompt width (left-padded), completion width (right-padded)
AGGREGATION = {"grpo": "sequence_mean", "bnpo": "token_mean", "dapo": "token_mean", "dr_grpo": "dr_grpo"}


@pytest.fixture(scope="module")
def trl_setup(tmp_path_factory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer
    from gym_llm_adapters.models.tiny import tiny_model_dir

    path = tiny_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    dataset = Dataset.from_dict({"prompt": ["hi"] * B})
    out_dir = str(tmp_path_factory.mktemp("trl-parity"))

    def build(**options):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        args = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=B, num_generations=2,
                          max_completion_length=C, report_to=[], use_cpu=True, bf16=False,
                          **options)
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                              args=args, train_dataset=dataset, processing_class=tokenizer)
        trainer.current_gradient_accumulation_steps = 1  # what the training loop sets for one micro-batch
        return trainer

    return build


def make_inputs(model: torch.nn.Module, seed: int):
    """TRL's layout (left-padded prompts, right-padded completions) and the trainer's own log-probs."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, 500, (B, P), generator=g)
    prompt_mask = torch.ones(B, P, dtype=torch.long)
    for b, pad in enumerate([0, 2, 1, 0]):
        prompt_mask[b, :pad] = 0
        prompt_ids[b, :pad] = 0
    completion_ids = torch.randint(3, 500, (B, C), generator=g)
    completion_mask = torch.ones(B, C, dtype=torch.long)
    for b, n in enumerate([6, 3, 5, 1]):
        completion_mask[b, n:] = 0
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([prompt_mask, completion_mask], 1)
    policy_mask = torch.cat([torch.zeros_like(prompt_mask), completion_mask], 1).bool()
    with torch.no_grad():
        current = token_logprobs(model, input_ids, attention_mask, policy_mask)
    noise = lambda scale: scale * torch.randn(B, P + C, generator=g) * policy_mask  # noqa: E731
    old = current + noise(0.3)
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0])
    advantages = torch.from_numpy(group_advantages(rewards.numpy(), torch.tensor([0, 0, 1, 1]).numpy()))
    return dict(input_ids=input_ids, attention_mask=attention_mask, policy_mask=policy_mask,
                prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                completion_mask=completion_mask, old=old, engine=old + noise(0.2), ref=current + noise(0.5),
                advantages=advantages)


def trl_options(loss_type: str, beta: float, epsilon_high: float | None, importance: str, **extra) -> dict:
    options = dict(loss_type=loss_type, beta=beta, epsilon=0.2)
    options.update(extra)
    if epsilon_high is not None:
        options["epsilon_high"] = epsilon_high
    if importance != "none":
        options.update(vllm_importance_sampling_mode=importance, vllm_importance_sampling_clip_max=1.3,
                       vllm_importance_sampling_clip_min=0.8 if importance.endswith("mask") else None)
    return options


def our_config(options: dict) -> GRPOLossConfig:
    importance = options.get("vllm_importance_sampling_mode", "none")
    return GRPOLossConfig(
        epsilon=options["epsilon"], epsilon_high=options.get("epsilon_high"), beta=options["beta"],
        delta=options.get("delta"), ratio_level=options.get("importance_sampling_level", "token"),
        kl_importance_correction=options.get("use_bias_correction_kl", True),
        aggregation=AGGREGATION[options["loss_type"]], max_completion_length=C, importance_sampling=importance,
        importance_sampling_clip_min=options.get("vllm_importance_sampling_clip_min"),
        importance_sampling_clip_max=options.get("vllm_importance_sampling_clip_max", 3.0))


def run_both(trainer, options: dict, seed: int = 0):
    model = trainer.model
    x = make_inputs(model, seed)
    cfg = our_config(options)
    mask = x["policy_mask"]
    num_items = mask.sum().float()
    inputs = dict(prompt_ids=x["prompt_ids"], prompt_mask=x["prompt_mask"], completion_ids=x["completion_ids"],
                  completion_mask=x["completion_mask"], advantages=x["advantages"],
                  old_per_token_logps=x["old"][:, P:], ref_per_token_logps=x["ref"][:, P:],
                  num_items_in_batch=num_items)
    if cfg.importance_sampling != "none":
        weights = importance_sampling_weights(x["old"], x["engine"], mask, cfg.importance_sampling,
                                              clip_min=cfg.importance_sampling_clip_min,
                                              clip_max=cfg.importance_sampling_clip_max)
        inputs["importance_sampling_ratio"] = weights if weights.shape[1] == 1 else weights[:, P:]
        trainer.use_vllm = True
    model.zero_grad()
    trl_loss = trainer._compute_loss(model, inputs)
    trl_loss.backward()
    trl_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logprobs = token_logprobs(model, x["input_ids"], x["attention_mask"], mask)
    out = GRPOLoss(cfg)(logprobs, mask=mask, advantages=x["advantages"], old_logprobs=x["old"],
                        engine_logprobs=x["engine"], ref_logprobs=x["ref"],
                        num_items=num_items if options["loss_type"] == "dapo" else None)
    out.loss.backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    # The inputs exercise the options: some tokens are clipped, some weights truncated or masked.
    assert float(out.clip_low_fraction + out.clip_high_fraction) > 0
    if cfg.delta is not None:
        assert float(((logprobs - x["old"]).exp()[mask] > cfg.delta).float().mean()) > 0
    if cfg.importance_sampling.endswith("truncate"):
        assert float(out.is_weight_max) == pytest.approx(cfg.importance_sampling_clip_max)
    elif cfg.importance_sampling.endswith("mask"):
        assert float(out.is_weight_min) == 0.0
    return trl_loss.detach(), out, trl_grads, ours


def assert_grads_close(ours: dict, theirs: dict) -> None:
    """Per parameter: equal up to float32 noise relative to that gradient's scale."""
    for name, grad in theirs.items():
        scale = float(grad.abs().max())
        assert scale > 0 or name.endswith("bias"), f"{name}: TRL's gradient is all zero"
        torch.testing.assert_close(ours[name], grad, rtol=1e-4, atol=1e-4 * scale + 1e-9,
                                   msg=lambda m, name=name: f"{name}: {m}")


GRID = list(itertools.product(["grpo", "bnpo", "dapo", "dr_grpo"], [0.0, 0.1], [None, 0.28],
                              ["none", "token_truncate"]))


@pytest.mark.parametrize("loss_type, beta, epsilon_high, importance", GRID)
def test_equals_trl_grid(trl_setup, loss_type, beta, epsilon_high, importance) -> None:
    options = trl_options(loss_type, beta, epsilon_high, importance)
    trl_loss, out, trl_grads, ours = run_both(trl_setup(**options), options)
    torch.testing.assert_close(out.loss.detach(), trl_loss, rtol=1e-5, atol=1e-6)
    assert_grads_close(ours, trl_grads)


@pytest.mark.parametrize(
    "extra",
    [
        dict(importance="token_mask"),
        dict(importance="sequence_truncate"),
        dict(importance="sequence_mask", loss_type="grpo"),
        dict(delta=1.4, beta=0.05),
        dict(importance_sampling_level="sequence", loss_type="grpo", beta=0.05, epsilon=0.02, epsilon_high=0.03),
        dict(use_bias_correction_kl=False, beta=0.2, importance="token_truncate"),
    ],
    ids=["token_mask", "sequence_truncate", "sequence_mask", "delta", "gspo", "no_kl_correction"],
)
def test_equals_trl_other_options(trl_setup, extra) -> None:
    extra = dict(extra)
    base = dict(loss_type=extra.pop("loss_type", "bnpo"), beta=extra.pop("beta", 0.0),
                epsilon_high=extra.pop("epsilon_high", 0.28),
                importance=extra.pop("importance", "none"))
    options = trl_options(**base, **extra)
    trl_loss, out, trl_grads, ours = run_both(trl_setup(**options), options, seed=1)
    torch.testing.assert_close(out.loss.detach(), trl_loss, rtol=1e-5, atol=1e-6)
    assert_grads_close(ours, trl_grads)
