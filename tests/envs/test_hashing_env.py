"""LLMHashing-v0: chain hash, incremental text, state save/restore, scalar and vector env semantics."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gym_llm  # noqa: F401  (registers the ids)
from gym_llm.core.spaces import unpack_tokens
from gym_llm.envs.hashing.chain_hash import HASH_SEED, chain_hash, chain_hash_batch, chain_step
from gym_llm.envs.hashing import LLMHashingEnv, LLMHashingVectorEnv

from .vector_checks import assert_same, without

V = 50
PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]


def _ends_reward(task, token_ids, prompt_length):
    if "token_ids" in task.data:
        assert token_ids[:prompt_length].tolist() == PROMPTS[task.task_id]
    return float(len(token_ids)) + 0.5 * task.task_id + 0.01 * prompt_length


SMALL = dict(prompts=PROMPTS, vocab_size=V, max_seq_len=10, max_new_tokens=5, eos_token_ids=[0], reward_fn=_ends_reward)


def _chain(obs, row=None):
    packed = obs if row is None else {k: obs[k][row] for k in ("input_ids", "attention_mask")}
    return unpack_tokens(packed)


# ------------------------------------------------------------------------------------- hash
@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**20), max_size=40), st.integers(0, 2**64 - 1))
def test_python_and_numpy_hashes_agree(tokens, seed):
    h = np.array([seed], dtype=np.uint64)
    for t in tokens:
        h = chain_step(h, np.array([t]))
    assert int(h[0]) == chain_hash(tokens, seed)
    padded = np.zeros((2, 50), dtype=np.int64)
    padded[0, : len(tokens)] = tokens
    padded[1, :] = 7  # a longer row beside it changes nothing for row 0
    assert int(chain_hash_batch(padded, np.array([len(tokens), 50]), seed)[0]) == chain_hash(tokens, seed)


def test_known_values_and_sibling_uniqueness():
    assert chain_hash([]) == HASH_SEED
    assert chain_hash([1, 2, 3]) == chain_hash([3], seed=chain_hash([1, 2]))
    assert chain_hash([1, 2]) != chain_hash([2, 1])
    parent = np.full(100_000, chain_hash([5, 6]), dtype=np.uint64)
    children = chain_step(parent, np.arange(100_000))
    assert len(np.unique(children)) == 100_000  # H(h, .) is injective


def test_same_chain_same_hash_whatever_padding_or_prompt_split():
    a = LLMHashingEnv(prompts=[[1, 2, 3]], vocab_size=V, max_seq_len=8)
    b = LLMHashingEnv(prompts=[[1]], vocab_size=V, max_seq_len=64)
    a.reset(seed=0)
    b.reset(seed=0)
    obs_a = a.step(4)[0]
    for t in (2, 3, 4):
        obs_b = b.step(t)[0]
    assert obs_a["hash"] == obs_b["hash"] == chain_hash([1, 2, 3, 4])
    assert obs_a["hash"].dtype == np.uint64 and obs_a["hash"].shape == (1,)  # 1-d: what SB3 and TorchRL accept


# ------------------------------------------------------------------------------ Gymnasium
@pytest.mark.parametrize("text", [False, True])
def test_check_env_passes_with_warnings_as_errors(tiny_tok, text):
    kwargs = dict(tokenizer=tiny_tok, max_seq_len=48, text_output=True) if text else dict(SMALL)
    env = gym.make("LLMHashing-v0", **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


def test_episode_end_and_terminal_reward():
    env = LLMHashingEnv(**SMALL)
    obs, info = env.reset(seed=0, options={"task_id": 1})
    assert _chain(obs).tolist() == [4, 5] and info == {"steps": 0, "task_id": 1, "round": 0}
    rewards = [env.step(t)[1] for t in (11, 12, 13, 14)]
    assert rewards == [0.0] * 4
    obs, reward, terminated, truncated, info = env.step(15)  # max_new_tokens=5
    assert (terminated, truncated, reward, info["steps"]) == (False, True, 7 + 0.5 + 0.02, 5)
    env.reset(options={"task_id": 3})
    env.step(1)
    _, reward, terminated, truncated, _ = env.step(0)  # eos
    assert (terminated, truncated, reward) == (True, False, 6 + 1.5 + 0.04)
    env.reset(options={"task_id": 3})  # 4 prompt tokens + 6 = max_seq_len 10
    ends = [env.step(1)[2:4] for _ in range(5)]
    assert ends[-1] == (False, True)


def _sync(n, mode, **kwargs):
    return SyncVectorEnv([lambda: LLMHashingEnv(**kwargs)] * n, autoreset_mode=mode)


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP])
@pytest.mark.parametrize("text", [False, True])
def test_native_vector_equals_sync_vector_env(tiny_tok, mode, text):
    kwargs = dict(SMALL, tokenizer=tiny_tok, vocab_size=None, text_output=True, prompts=["Hi", "The fox", "Once"]) \
        if text else dict(SMALL)
    vocab = len(tiny_tok) if text else V
    n = 4
    native = LLMHashingVectorEnv(n, autoreset_mode=mode, **kwargs)
    sync = _sync(n, mode, **kwargs)
    assert native.metadata["autoreset_mode"] == mode
    obs_a, info_a = native.reset(seed=7)
    obs_b, info_b = sync.reset(seed=7)
    assert_same(obs_a, obs_b)
    assert_same(without(info_a, "group_id"), info_b)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(40):
        actions = np.where(rng.random(n) < 0.1, 0, rng.integers(1, vocab, size=n))
        out_a, out_b = native.step(actions), sync.step(actions)
        for a, b in zip(out_a[:4], out_b[:4]):
            assert_same(a, b)
        assert_same(without(out_a[4], "group_id"), out_b[4])
        ended += int((out_a[2] | out_a[3]).sum())
        hashes = [chain_hash(_chain(out_a[0], i)) for i in range(n)]
        assert out_a[0]["hash"].shape == (n, 1) and out_a[0]["hash"][:, 0].tolist() == hashes
    assert ended > 10  # terminations, truncations and autoresets were exercised


def test_groups_and_disabled_autoreset():
    envs = LLMHashingVectorEnv(4, group_size=2, autoreset_mode="Disabled", **SMALL)
    _, info = envs.reset(seed=3)
    assert info["task_id"][0] == info["task_id"][1] and info["task_id"][2] == info["task_id"][3]
    for _ in range(5):
        _, _, _, truncated, _ = envs.step(np.ones(4, dtype=np.int64))
    assert truncated.all()
    with pytest.raises(gym.error.ResetNeeded, match="autoreset is disabled"):
        envs.step(np.ones(4, dtype=np.int64))
    _, info = envs.reset(options={"reset_mask": np.array([True, True, False, False])})
    assert info["round"][:2].tolist() == [1, 1] and not info["_round"][2:].any()


def test_async_vector_env():
    envs = gym.make_vec("LLMHashing-v0", num_envs=2, vectorization_mode="async", **SMALL)
    obs, _ = envs.reset(seed=0)
    obs, reward, terminated, truncated, _ = envs.step(np.array([3, 4]))
    assert obs["hash"].dtype == np.uint64 and obs["hash"][:, 0].tolist() == [chain_hash(_chain(obs, i)) for i in range(2)]
    envs.close()


# ---------------------------------------------------------------------------------- text
@pytest.mark.parametrize("path", ["byte-level", "window"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.lists(st.integers(0, 511), min_size=1, max_size=40))
def test_incremental_text_equals_full_decode(tiny_tok, path, tokens):
    # the window path is what tokenizers without a byte-level decoder take (here: the same tokenizer, its
    # Rust backend hidden behind a wrapper)
    tok = tiny_tok if path == "byte-level" else _CountingTokenizer(tiny_tok, batch_backend=True)
    env = _TEXT_ENVS.get(path) or _TEXT_ENVS.setdefault(path, LLMHashingVectorEnv(
        2, prompts=["Grüße aus Köln", "The fox"], tokenizer=tok, max_seq_len=64, text_output=True, eos_token_ids=()))
    assert env.chains.decoder.byte_level == (path == "byte-level")
    obs, _ = env.reset(seed=0)
    for t in tokens:
        obs = env.step(np.array([t, t]))[0]
    for row in range(2):
        full = tiny_tok.decode(_chain(obs, row).tolist(), skip_special_tokens=False)
        text = obs["text"][row]
        # only an incomplete (or invalid) UTF-8 tail, which decodes to U+FFFD, may still be pending
        assert full.startswith(text) and set(full[len(text):]) <= {"\ufffd"}
        if not full.endswith("\ufffd"):
            assert text == full
        if path == "byte-level":  # exactly: the text, then the pending bytes of an unfinished character
            pending = env.get_state(row).text[2]
            assert len(pending) <= 3 and text + pending.decode("utf-8", "replace") == full


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.lists(st.integers(0, 151_645), min_size=1, max_size=30))
def test_incremental_text_equals_full_decode_qwen(qwen_tokenizer, tokens):
    env = _TEXT_ENVS.setdefault("qwen", LLMHashingVectorEnv(
        1, prompts=["Grüße, 世界"], tokenizer=qwen_tokenizer, max_seq_len=64, text_output=True, eos_token_ids=()))
    obs, _ = env.reset(seed=0)
    for t in tokens:
        obs = env.step(np.array([t]))[0]
    full = qwen_tokenizer.decode(_chain(obs, 0).tolist(), skip_special_tokens=False)
    assert full.startswith(obs["text"][0]) and set(full[len(obs["text"][0]):]) <= {"\ufffd"}
    assert obs["text"][0] + env.get_state(0).text[2].decode("utf-8", "replace") == full


def test_byte_level_table_decodes_like_the_tokenizer(qwen_tokenizer):
    from gym_llm.envs.detok import byte_level_table

    table = byte_level_table(qwen_tokenizer)
    assert len(table) == 151_646 and table[151_645] == b"<|im_end|>"
    rng = np.random.default_rng(0)
    single_bytes = np.array([i for i, b in enumerate(table) if len(b) == 1] + [151_643, 151_644, 151_645])
    for trial in range(200):  # random ids, and runs of single-byte tokens (split and invalid UTF-8) with specials
        pool = single_bytes if trial % 2 else np.arange(len(table))
        ids = rng.choice(pool, size=int(rng.integers(1, 50))).tolist()
        ours = b"".join(table[i] for i in ids).decode("utf-8", "replace")
        assert ours == qwen_tokenizer.decode(ids, skip_special_tokens=False)


def test_state_taken_in_the_middle_of_a_character_resumes_it(qwen_tokenizer):
    ids = qwen_tokenizer.encode("🙂", add_special_tokens=False)
    if len(ids) == 1:  # split the emoji's 4 bytes over byte tokens
        from gym_llm.envs.detok import byte_level_table

        table = byte_level_table(qwen_tokenizer)
        ids = [table.index(bytes([b])) for b in "🙂".encode()]
    env = LLMHashingEnv(prompts=["Hi "], tokenizer=qwen_tokenizer, max_seq_len=32, text_output=True)
    env.reset(seed=0)
    env.step(ids[0])
    node = env.get_state()
    finished = [env.step(t)[0]["text"] for t in ids[1:]][-1]
    env.set_state(node)
    assert [env.step(t)[0]["text"] for t in ids[1:]][-1] == finished == "Hi 🙂"


def test_incremental_text_with_qwen_multibyte(qwen_tokenizer):
    tok = qwen_tokenizer
    sentence = "Grüße, 世界! 🙂 naïve café — done."
    ids = tok.encode(sentence, add_special_tokens=False)
    env = LLMHashingEnv(prompts=["Say:"], tokenizer=tok, max_seq_len=64, text_output=True)
    obs, _ = env.reset(seed=0)
    texts = []
    for t in ids:
        obs = env.step(t)[0]
        texts.append(obs["text"])
    assert obs["text"] == "Say:" + sentence
    assert all("\ufffd" not in t for t in texts)  # half characters wait for their other bytes


class _CountingTokenizer:
    """A real tokenizer that records how many ids each decode call gets, on either decode path: the
    Rust backend's ``decode_batch`` (``batch_backend``) or the tokenizer's own ``decode``."""

    def __init__(self, tokenizer, batch_backend: bool):
        self._tokenizer = tokenizer
        self.decoded_lengths: list[int] = []
        self.backend_tokenizer = _CountingBackend(tokenizer.backend_tokenizer, self) if batch_backend else None

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)

    def __len__(self):
        return len(self._tokenizer)

    def decode(self, ids, **kwargs):
        self.decoded_lengths.append(len(ids))
        return self._tokenizer.decode(ids, **kwargs)


class _CountingBackend:
    def __init__(self, backend, counter: _CountingTokenizer):
        self._backend, self._counter = backend, counter

    def decode_batch(self, sequences, **kwargs):
        self._counter.decoded_lengths.extend(len(ids) for ids in sequences)
        return self._backend.decode_batch(sequences, **kwargs)


@pytest.mark.parametrize("batch_backend", [True, False], ids=["rust-batch", "decode"])
def test_text_output_decodes_only_a_bounded_window_per_step(tiny_tok, batch_backend):
    from gym_llm.envs.detok import _WINDOW_TOKENS

    tok = _CountingTokenizer(tiny_tok, batch_backend)
    generated = tiny_tok.encode("The quick brown fox jumps over the lazy dog. " * 12, add_special_tokens=False)[:200]
    assert len(generated) == 200
    envs = LLMHashingVectorEnv(2, prompts=["Once upon a time"], tokenizer=tok, max_seq_len=256, text_output=True,
                               eos_token_ids=())
    obs, _ = envs.reset(seed=0)
    per_step = []
    for t in generated:
        tok.decoded_lengths.clear()
        obs = envs.step(np.array([t, t]))[0]
        per_step.append(list(tok.decoded_lengths))
    assert _chain(obs, 0).size > 200
    # every step decodes a window of the newest ids (plus, now and then, a window restart), not the sequence
    assert all(0 < len(lengths) <= 4 for lengths in per_step)  # one or two ids lists per row
    assert max(max(lengths) for lengths in per_step) <= _WINDOW_TOKENS + 1
    assert max(max(lengths) for lengths in per_step[-50:]) == max(max(lengths) for lengths in per_step[:50])
    full = tiny_tok.decode(_chain(obs, 0).tolist(), skip_special_tokens=False)
    assert obs["text"] == (full, full)
    envs.close()


_TEXT_ENVS: dict = {}
_TEXT_ENVS: dict = {}


# ----------------------------------------------------------------------------- tree search
def test_get_and_set_state_branches_from_any_node(tiny_tok):
    env = LLMHashingEnv(prompts=["Once"], tokenizer=tiny_tok, max_seq_len=32, text_output=True)
    env.reset(seed=0)
    env.step(100)
    node = env.get_state()
    child_a = env.step(200)[0]
    state_a = env.get_state()
    env.set_state(node)
    again = env.step(200)[0]
    assert_same(again, child_a)
    child_b = env.step(201)[0]  # now a grandchild of node: different chain, different hash
    env.set_state(node)
    sibling = env.step(201)[0]
    assert len({int(child_a["hash"][0]), int(sibling["hash"][0]), int(child_b["hash"][0])}) == 3
    assert state_a.hash == int(child_a["hash"][0]) and state_a.token_ids[-1] == 200
    with pytest.raises(ValueError):
        state_a.token_ids[0] = 5  # states are read-only snapshots


def test_vector_set_state_and_terminal_states():
    envs = LLMHashingVectorEnv(2, autoreset_mode="NextStep", **SMALL)
    envs.reset(seed=0)
    envs.step(np.array([3, 3]))
    node = envs.get_state(0)
    envs.set_state(1, node)  # sub-env 1 continues from sub-env 0's node
    obs = envs.step(np.array([9, 9]))[0]
    assert_same(obs["input_ids"][0], obs["input_ids"][1])
    assert obs["hash"][0, 0] == obs["hash"][1, 0] == chain_hash(_chain(obs, 0))
    _, _, terminated, _, _ = envs.step(np.array([0, 4]))
    terminal = envs.get_state(0)
    assert terminated[0] and terminal.done
    single = LLMHashingEnv(**SMALL)
    single.reset(seed=0)
    single.set_state(terminal)
    with pytest.raises(gym.error.ResetNeeded):
        single.step(1)


def test_bad_input_raises_and_changes_nothing():
    env = LLMHashingEnv(**SMALL)
    env.reset(seed=0)
    before = env.get_state()
    for bad, error in (("a", TypeError), (1.5, TypeError), (True, TypeError), (V, ValueError), (-1, ValueError),
                       (np.array([1, 2]), TypeError)):
        with pytest.raises(error):
            env.step(bad)
    other = LLMHashingEnv(prompts=PROMPTS, vocab_size=V + 1, max_seq_len=10)
    other.reset(seed=0)
    with pytest.raises(ValueError, match="vocab_size, max_seq_len"):
        env.set_state(other.get_state())
    with pytest.raises(TypeError, match="HashingState"):
        env.set_state("state")
    after = env.get_state()
    assert np.array_equal(before.token_ids, after.token_ids) and before.hash == after.hash

    envs = LLMHashingVectorEnv(3, **SMALL)
    obs, _ = envs.reset(seed=0)
    for bad, error, match in ((np.array([1, 2]), ValueError, r"shape \(3,\)"),
                              (np.array([1.0, 2.0, 3.0]), TypeError, "integers"),
                              (np.array([1, V, 2]), ValueError, "sub-env 1"),
                              (np.array([1, 2, -4]), ValueError, "sub-env 2"),
                              ("abc", ValueError, "shape")):
        with pytest.raises(error, match=match):
            envs.step(bad)
    assert_same(envs.chains.batch_observation(), obs)
    with pytest.raises(ValueError, match="index"):
        envs.get_state(3)
    with pytest.raises(ValueError, match="eos token id"):
        LLMHashingEnv(prompts=PROMPTS, vocab_size=V, eos_token_ids=[V])
    with pytest.raises(ValueError, match="max_seq_len"):
        LLMHashingEnv(prompts=[[1] * 10], vocab_size=V, max_seq_len=10)
    with pytest.raises(ValueError, match="tokenizer"):
        LLMHashingEnv(vocab_size=V)


@settings(max_examples=40, deadline=None)
@given(actions=st.lists(st.lists(st.integers(0, V - 1), min_size=3, max_size=3), min_size=1, max_size=25),
       seed=st.integers(0, 2**31 - 1))
def test_random_actions_property(actions, seed):
    envs = _TEXT_ENVS.setdefault("small", LLMHashingVectorEnv(3, **SMALL))
    obs, _ = envs.reset(seed=seed)
    for step in actions:
        obs, reward, terminated, truncated, info = envs.step(np.array(step))
        assert envs.observation_space.contains(obs)
        lengths = obs["attention_mask"].sum(1)
        assert (lengths <= 10).all() and (info["steps"] <= 5).all()
        assert obs["hash"][:, 0].tolist() == [chain_hash(_chain(obs, i)) for i in range(3)]
        ended = terminated | truncated
        assert (reward[~ended] == 0).all() and not (terminated & truncated).any()
        assert (terminated == (np.array(step) == 0)).all()
        for i in np.flatnonzero(ended):
            final = info["final_obs"][i]
            task = envs.parts.tasks[info["final_info"]["task_id"][i]]
            assert reward[i] == _ends_reward(task, _chain(final), len(PROMPTS[task.task_id]))


def test_text_limit_chat_template_and_views(tiny_tok):
    env = LLMHashingEnv(prompts=["The fox"], tokenizer=tiny_tok, max_seq_len=32, text_output=True, max_text_chars=12)
    obs, _ = env.reset(seed=0)
    space = env.observation_space
    ends = []
    for t in tiny_tok.encode(" jumps over", add_special_tokens=False):
        obs, _, terminated, truncated, _ = env.step(t)
        assert space.contains(obs)
        ends.append(truncated)
        if truncated:
            break
    assert ends[-1] and not any(ends[:-1]) and len(obs["text"]) == 12
    with pytest.raises(ValueError, match="max_text_chars"):
        LLMHashingEnv(prompts=["A long prompt here"], tokenizer=tiny_tok, text_output=True, max_text_chars=5)

    chat = LLMHashingEnv(prompts=["Hi there"], tokenizer=tiny_tok, max_seq_len=64, apply_chat_template=True)
    obs, _ = chat.reset(seed=0)
    rendered = tiny_tok.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False,
                                            add_generation_prompt=True)
    assert _chain(obs).tolist() == tiny_tok.encode(rendered, add_special_tokens=False)

    envs = LLMHashingVectorEnv(2, copy=False, **SMALL)
    obs, _ = envs.reset(seed=0)
    step_obs = envs.step(np.array([3, 4]))[0]
    assert np.shares_memory(step_obs["input_ids"], envs.chains.ids)  # views, overwritten by the next step
    copied = LLMHashingVectorEnv(2, **SMALL)
    copied.reset(seed=0)
    assert not np.shares_memory(copied.step(np.array([3, 4]))[0]["input_ids"], copied.chains.ids)
