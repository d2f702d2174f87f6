"""gym_llm envs under TorchRL: batched text, tokens and hashing envs through gym_llm_adapters.torchrl.GymLLMEnv give
the native vector env's observations and rewards; a single env also works under TorchRL's own GymWrapper."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from torchrl.envs import GymWrapper
from torchrl.envs.utils import check_env_specs

from gym_llm.envs.hashing.chain_hash import chain_hash
from gym_llm_adapters.torchrl import GymLLMEnv

ARITH = {"source": "arithmetic"}


def native(env_id: str, n: int, **kwargs):
    return gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point",
                        autoreset_mode=gym.vector.AutoresetMode.DISABLED, **kwargs)


def answers(prompts, right) -> list[str]:
    """The scripted policy: the right sum for sub-envs where ``right[i]``, a wrong one elsewhere."""
    out = []
    for prompt, ok in zip(prompts, right, strict=True):
        a, b = map(int, re.search(r"What is (\d+) \+ (\d+)\?", prompt).groups())
        out.append(f"{a} + {b} = {a + b}\n#### {a + b if ok else a + b + 1}")
    return out


def test_text_vector_env_steps_and_resets_like_the_native_one():
    env, ref = GymLLMEnv("LLMGSM8K-v0", num_envs=4, **ARITH), native("LLMGSM8K-v0", 4, **ARITH)
    env.set_seed(0)
    td = env.reset()
    obs, _ = ref.reset(seed=0)
    assert list(td["observation"]) == list(obs) and td.batch_size == (4,)
    right = [True, False, True, False]
    td["action"] = answers(list(td["observation"]), right)
    out = env.step(td)
    _, reward, terminated, truncated, _ = ref.step(tuple(answers(list(obs), right)))
    assert out["next", "reward"].shape == (4, 1) and out["next", "reward"][:, 0].tolist() == reward.tolist() == \
        [1.0, 0.0, 1.0, 0.0]
    assert out["next", "done"][:, 0].tolist() == (terminated | truncated).tolist() == [True] * 4

    def policy(td):  # single-turn: every step ends every episode, and TorchRL resets them through "_reset"
        td["action"] = answers(list(td["observation"]), [True] * 4)
        return td

    rollout = env.rollout(3, policy, break_when_any_done=False)
    assert rollout["next", "reward"].sum().item() == 12.0
    prompts = [list(rollout[:, t]["observation"]) for t in range(3)]
    assert prompts[0] != prompts[1] != prompts[2]  # new tasks after each reset
    check_env_specs(env)
    env.close()


def test_tokens_vector_env_gives_token_ids_not_one_hot(tiny_tok):
    kwargs = {**ARITH, "mode": "tokens", "tokenizer": tiny_tok, "max_seq_len": 128, "max_action_tokens": 24}
    env, ref = GymLLMEnv("LLMGSM8K-v0", num_envs=3, **kwargs), native("LLMGSM8K-v0", 3, **kwargs)
    env.set_seed(0)
    td = env.reset()
    obs, _ = ref.reset(seed=0)
    assert td["input_ids"].shape == (3, 128) and td["input_ids"].dtype == torch.int64
    assert np.array_equal(td["input_ids"].numpy(), obs["input_ids"])
    assert np.array_equal(td["attention_mask"].numpy(), obs["attention_mask"])
    prompts = [tiny_tok.decode(ids[mask == 1]) for ids, mask in zip(obs["input_ids"], obs["attention_mask"])]
    ids = np.zeros((3, 24), dtype=np.int64)
    mask = np.zeros((3, 24), dtype=np.int8)
    for i, text in enumerate(answers(prompts, [True, True, False])):
        tokens = tiny_tok.encode(text + "<|im_end|>", add_special_tokens=False)
        ids[i, :len(tokens)], mask[i, :len(tokens)] = tokens, 1
    td["action", "input_ids"], td["action", "attention_mask"] = torch.from_numpy(ids), torch.from_numpy(mask)
    out = env.step(td)
    reward = ref.step({"input_ids": ids, "attention_mask": mask})[1]
    assert out["next", "reward"][:, 0].tolist() == reward.tolist() == [1.0, 1.0, 0.0]
    check_env_specs(env)
    env.rollout(2, break_when_any_done=False)  # random token actions, resets included
    env.close()


def test_hashing_env_keeps_its_64_bit_hashes_and_resets_finished_chains(tiny_tok):
    kwargs = {"tokenizer": tiny_tok, "max_seq_len": 64, "max_new_tokens": 5}
    env, ref = GymLLMEnv("LLMHashing-v0", num_envs=2, **kwargs), native("LLMHashing-v0", 2, **kwargs)
    env.set_seed(0)
    td = env.reset()
    obs, _ = ref.reset(seed=0)
    assert td["hash"].shape == (2, 1) and td["hash"].dtype == torch.int64
    assert td["hash"].numpy().view(np.uint64).tolist() == obs["hash"].tolist()  # the same 64 bits
    prompt_lengths = {int(n) for seed in range(8) for n in ref.reset(seed=seed)[0]["attention_mask"].sum(-1)}
    tokens = torch.tensor([[5, 9, 11, 13, 17, 19, 23]] * 2).T  # (steps, N)
    chains = [list(ids[mask == 1]) for ids, mask in zip(obs["input_ids"], obs["attention_mask"])]
    for t in range(5):
        td["action"] = tokens[t]
        out = env.step(td)
        td = out["next"]
        for i in range(2):
            chains[i].append(int(tokens[t, i]))
            assert int(td["hash"][i, 0]) & (2**64 - 1) == chain_hash(chains[i])
    assert td["done"][:, 0].tolist() == [True, True]  # max_new_tokens
    rollout = env.rollout(12, break_when_any_done=False)  # random tokens; finished chains reset to their prompt
    done = rollout["next", "done"][..., 0]
    assert done.any() and rollout["next", "reward"].shape == (2, 12, 1)
    after = rollout[:, 1:][done[:, :-1]]  # the first step after each end starts from a fresh prompt
    assert set(after["attention_mask"].sum(-1).tolist()) <= set(prompt_lengths)
    check_env_specs(env)
    env.close()


def test_bad_input_says_what_was_expected():
    with pytest.raises(ValueError, match="autoreset_mode=DISABLED"):
        GymLLMEnv(gym.make_vec("LLMGSM8K-v0", num_envs=2, vectorization_mode="vector_entry_point", **ARITH))
    with pytest.raises(TypeError, match="apply to an env id"):
        GymLLMEnv(native("LLMGSM8K-v0", 2, **ARITH), source="arithmetic")
    env = GymLLMEnv("LLMGSM8K-v0", num_envs=2, **ARITH)
    td = env.reset()
    td["action"] = torch.tensor([1, 2])  # token ids where the text env takes strings
    with pytest.raises(TypeError, match=r"expected 2 strings .* got Tensor"):
        env.step(td)
    td["action"] = ["#### 1", "#### 2"]  # the env still works
    assert env.step(td)["next", "reward"].shape == (2, 1)
    env.close()


def test_a_single_env_under_torchrls_own_gym_wrapper(tiny_tok):
    """The plain wrapper suffices for one text env. In tokens mode it puts the action's input_ids/attention_mask at the
    root beside the observation's (the action's overwrite them in a rollout), and LLMHashing-v0's uint64 hash has no
    TorchRL dtype: what GymLLMEnv is for (it works with num_envs=1 too)."""
    text = GymWrapper(gym.make("LLMGSM8K-v0", **ARITH))
    td = text.reset()
    td["action"] = answers([td["observation"]], [True])[0]
    assert text.step(td)["next", "reward"].item() == 1.0
    tokens = GymWrapper(gym.make("LLMGSM8K-v0", **ARITH, mode="tokens", tokenizer=tiny_tok, max_seq_len=128,
                                 max_action_tokens=16), categorical_action_encoding=True)
    assert tokens.observation_spec["input_ids"].shape == (128,)  # not one-hot, with categorical_action_encoding
    assert tokens.rollout(2)["input_ids"].shape[-1] == 16  # the (16,) action's ids, not the (128,) observation's
    ours = GymLLMEnv("LLMGSM8K-v0", num_envs=1, **ARITH, mode="tokens", tokenizer=tiny_tok, max_seq_len=128,
                     max_action_tokens=16)
    rollout = ours.rollout(2)
    assert rollout["input_ids"].shape[-1] == 128 and rollout["action", "input_ids"].shape[-1] == 16
    with pytest.raises(KeyError, match="uint64"):
        GymWrapper(gym.make("LLMHashing-v0", tokenizer=tiny_tok), categorical_action_encoding=True)


def test_info_entries_ride_along_as_tensors(tiny_tok):
    kwargs = {**ARITH, "mode": "tokens", "tokenizer": tiny_tok, "max_seq_len": 128, "max_action_tokens": 16}
    env = GymLLMEnv("LLMGSM8K-v0", num_envs=2, group_size=2, info_keys=("policy_mask", "task_id", "group_id"),
                    **kwargs)
    ref = native("LLMGSM8K-v0", 2, group_size=2, **kwargs)
    env.set_seed(0)
    td = env.reset()
    _, info = ref.reset(seed=0)
    assert td["policy_mask"].shape == (2, 128) and td["policy_mask"].dtype == torch.int8
    assert td["task_id"][:, 0].tolist() == info["task_id"].tolist() and td["group_id"][:, 0].tolist() == [0, 0]
    action = env.rand_action(td)
    out = env.step(action)
    step_info = ref.step({k: action["action", k].numpy() for k in ("input_ids", "attention_mask")})[4]
    assert np.array_equal(out["next", "policy_mask"].numpy(), step_info["policy_mask"])  # the sampled tokens' mask
    assert out["next", "policy_mask"].sum() > 0
    check_env_specs(env)
    with pytest.raises(ValueError, match=r"'correct' is not a numeric per-sub-env entry .* expected one of"):
        GymLLMEnv("LLMGSM8K-v0", num_envs=2, info_keys=("correct",), **kwargs)  # only in a step's info
