"""The trainer's side of the never-stale LoRA tests (one per engine): the tiny policy with a PEFT adapter, trained a
real optimizer step at a time, its own log-probs with the adapter on and off, and the checks an engine must pass.

An engine serves the current adapter when its teacher-forced log-probs of a fixed sequence equal the trainer's with
the adapter on (max abs diff < :data:`TOLERANCE`, float32) and are clearly not the base model's (mean abs diff >
:data:`CLEARLY_DIFFERENT`). One Adam step at ``lr=0.01`` on the tiny model moves the log-probs by ~2 nats per token on
average (measured: vLLM and transformers agree with PEFT to ~4e-6), so a stale or missing adapter cannot pass.
"""

from __future__ import annotations

import numpy as np
import torch

TOLERANCE = 1e-3
"""Max abs diff (nats per token, float32) between an engine's and the trainer's log-probs for the same adapter."""
CLEARLY_DIFFERENT = 10 * TOLERANCE
"""Mean abs diff above which two sets of log-probs come from different adapters (or none)."""
RANK = 8
LR = 0.01


class LoraPolicy:
    """The tiny checkpoint wrapped with a rank-:data:`RANK` LoRA adapter (``add_lora``), trained with Adam.

    Args:
        model_path: the tiny checkpoint folder.
        rank: the adapter's rank.
        seed: seeds the adapter's ``A`` init.
    """

    def __init__(self, model_path, *, rank: int = RANK, seed: int = 0):
        from transformers import AutoModelForCausalLM

        from gym_llm_adapters.lora import LoraSettings, add_lora

        torch.manual_seed(seed)
        self.model = add_lora(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32),
                              LoraSettings(rank=rank))
        self.model.eval()
        self.optimizer = torch.optim.Adam([p for p in self.model.parameters() if p.requires_grad], lr=LR)

    def step(self, tokens) -> float:
        """One optimizer step on the next-token loss of ``tokens`` (1-D ids); returns the loss."""
        ids = torch.as_tensor(np.asarray(tokens), dtype=torch.long)[None]  # (1, S)
        self.model.train()
        self.optimizer.zero_grad()
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.optimizer.step()
        self.model.eval()
        return float(loss.detach())

    def frozen(self, *, adapter: bool = True) -> "_Frozen":
        """The policy as it is now (a copy), with an engine's ``logprobs(sequences)``: adapter on, or the base."""
        import copy

        return _Frozen(copy.deepcopy(self), adapter)

    def logprobs(self, sequences, *, adapter: bool = True) -> list[np.ndarray]:
        """Teacher-forced log-probs as engines return them (``out[0] = 0``), adapter on or off (the base model)."""
        out = []
        for seq in sequences:
            ids = torch.as_tensor(np.asarray(seq), dtype=torch.long)
            with torch.no_grad():
                if adapter:
                    logits = self.model(input_ids=ids[None]).logits[0].float()  # (S, V)
                else:
                    with self.model.disable_adapter():
                        logits = self.model(input_ids=ids[None]).logits[0].float()
            logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]  # (S-1,)
            out.append(np.concatenate([[0.0], logp.numpy()]).astype(np.float32))
        return out


class _Frozen:
    def __init__(self, policy: LoraPolicy, adapter: bool):
        self.policy, self.adapter = policy, adapter

    def logprobs(self, sequences) -> list[np.ndarray]:
        return self.policy.logprobs(sequences, adapter=self.adapter)


def sequences(num: int = 3, length: int = 70, seed: int = 0) -> list[np.ndarray]:
    """Fixed token sequences, longer than two 32-token KV-cache blocks (so prompts fill the prefix cache)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 500, size=length) for _ in range(num)]


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(max(np.abs(x - y).max() for x, y in zip(a, b, strict=True)))


def mean_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(np.mean(np.concatenate([np.abs(x - y)[1:] for x, y in zip(a, b, strict=True)])))


def assert_serves(engine_logprobs: list[np.ndarray], trainer_on: list[np.ndarray], others: dict[str, list[np.ndarray]]):
    """The engine's log-probs are the trainer's (adapter on) and clearly none of ``others`` (name -> log-probs: the
    base model, an older adapter). Returns the measured max diff to the trainer."""
    diff = max_diff(engine_logprobs, trainer_on)
    assert diff < TOLERANCE, f"the engine's log-probs miss the trainer's adapter by up to {diff:.2e} nats"
    for name, other in others.items():
        apart = mean_diff(engine_logprobs, other)
        assert apart > CLEARLY_DIFFERENT, f"the engine's log-probs are within {apart:.2e} nats (mean) of the {name}'s"
    return diff


def assert_sampled_by_current_adapter(completions, policy: LoraPolicy, version: int) -> float:
    """Completions carry ``version`` and their sampled log-probs are the trainer's teacher-forced ones (adapter on),
    which a stale prefix-cache block (KV of an older adapter) would break. Returns the max diff."""
    assert [c.version for c in completions] == [version] * len(completions)
    full = [np.concatenate([c.prompt_ids, c.token_ids]) for c in completions]
    theirs = policy.logprobs(full)
    diff = float(max(np.abs(c.logprobs - t[len(c.prompt_ids):]).max() for c, t in zip(completions, theirs)))
    assert diff < TOLERANCE, f"sampled log-probs miss the trainer's adapter by up to {diff:.2e} nats"
    return diff


def corrupted_adapter(policy: LoraPolicy, folder, *, version: int, run_id: str = "corrupt"):
    """An :class:`~gym_llm_adapters.lora.Adapter` of ``version`` whose weights file is garbage (a push that fails)."""
    from gym_llm_adapters.lora import ADAPTER_WEIGHTS, Adapter, save_adapter

    save_adapter(policy.model, folder)
    (folder / ADAPTER_WEIGHTS).write_bytes(b"not a safetensors file" * 8)
    return Adapter.from_folder(folder, version=version, run_id=run_id)
