"""UnicodeText and the token spaces behave like Gymnasium spaces, with batching."""

from __future__ import annotations

import pytest
from gymnasium import spaces
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate
from hypothesis import given, settings, strategies as st

from gym_llm.core.spaces import UnicodeText, pack_tokens, token_space, unpack_tokens


@given(st.text(max_size=40))
def test_unicode_text_admits_any_string_up_to_max(text):
    space = UnicodeText(max_length=40)
    assert space.contains(text)
    assert not space.contains(text + "x" * (41 - len(text)))


def test_unicode_text_rejects_non_strings_and_respects_min_length():
    space = UnicodeText(10, min_length=2)
    assert not space.contains(b"bytes")
    assert not space.contains(5)
    assert not space.contains("a")
    assert space.contains("ab")
    # Gymnasium's own Text would reject these characters
    assert space.contains("é 世 🙂\n") and not spaces.Text(10).contains("é 世 🙂\n")


def test_unicode_text_sample_is_seeded_and_valid():
    a, b = UnicodeText(64, seed=3), UnicodeText(64, seed=3)
    samples = [a.sample() for _ in range(50)]
    assert samples == [b.sample() for _ in range(50)]
    assert all(a.contains(s) for s in samples)
    assert any(ord(c) > 127 for s in samples for c in s)  # multi-byte characters show up
    for s in samples:
        s.encode("utf-8")  # never a lone surrogate
    masked = a.sample(mask=(5, None))
    assert len(masked) == 5


def test_unicode_text_equality_and_hash():
    assert UnicodeText(5) == UnicodeText(5)
    assert UnicodeText(5) != UnicodeText(6)
    assert UnicodeText(5) != UnicodeText(5, min_length=1)
    assert UnicodeText(5) != spaces.Text(5)
    assert len({UnicodeText(5), UnicodeText(5)}) == 1


def test_unicode_text_batching_round_trip():
    space = UnicodeText(20)
    batched = batch_space(space, 3)
    assert isinstance(batched, spaces.Tuple) and all(s == space for s in batched.spaces)
    items = ["a", "ü世", ""]
    out = concatenate(space, items, create_empty_array(space, 3))
    assert out == tuple(items)
    assert list(iterate(batched, out)) == items
    assert batched.contains(out)


@pytest.mark.parametrize("bad", [-1, 1.5, "3"])
def test_unicode_text_bad_arguments(bad):
    with pytest.raises(ValueError, match="max_length"):
        UnicodeText(bad)


def test_token_space_pack_unpack_and_batch():
    space = token_space(vocab_size=100, max_length=8)
    packed = pack_tokens([5, 0, 99], 8)
    assert space.contains(packed)
    assert unpack_tokens(packed).tolist() == [5, 0, 99]  # id 0 is real where the mask says so
    assert packed["attention_mask"].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    batched = batch_space(space, 4)
    assert batched["input_ids"].shape == (4, 8) and batched["attention_mask"].shape == (4, 8)
    sample = space.sample()
    assert unpack_tokens(sample).tolist() == sample["input_ids"][sample["attention_mask"] == 1].tolist()
    with pytest.raises(ValueError, match="at most 8"):
        pack_tokens(list(range(9)), 8)


def test_token_space_validates_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        token_space(0, 4)
    with pytest.raises(ValueError, match="max_length"):
        token_space(10, 0)


@given(st.text(max_size=30))
@settings(max_examples=50)
def test_unicode_text_flatten_round_trip(text):
    from gymnasium.spaces.utils import flatten, unflatten

    space = UnicodeText(30)
    assert unflatten(space, flatten(space, text)) == text


@pytest.mark.parametrize("copy", [True, False])
def test_async_vector_env_with_shared_memory_returns_every_steps_text(copy):
    """Gymnasium's AsyncVectorEnv reads its shared buffer once and returns that object after every reset and step: a
    text batch must be a live view of the buffer (a plain tuple of it when copied), not the strings of the moment it
    was made (which were empty: every observation came back as NUL characters)."""
    import copy as copying

    import gymnasium as gym

    import gym_llm  # noqa: F401

    kwargs = {"source": "arithmetic"}
    envs = gym.make_vec("LLMGSM8K-v0", num_envs=2, vectorization_mode="async", vector_kwargs={"copy": copy}, **kwargs)
    ref = gym.make_vec("LLMGSM8K-v0", num_envs=2, vectorization_mode="sync", **kwargs)
    try:
        obs, _ = envs.reset(seed=0)
        want, _ = ref.reset(seed=0)
        assert tuple(obs) == tuple(want) and "What is" in obs[0]
        first = tuple(obs)
        obs, reward, *_ = envs.step(("#### 1", "#### 2"))
        want, want_reward, *_ = ref.step(("#### 1", "#### 2"))
        assert tuple(obs) == tuple(want) and obs[1].endswith("#### 2") and reward.tolist() == want_reward.tolist()
        assert type(copying.deepcopy(obs)) is tuple and copying.deepcopy(obs) == tuple(want)
        assert isinstance(obs, tuple) == copy and tuple(obs) != first
    finally:
        envs.close()
        ref.close()
