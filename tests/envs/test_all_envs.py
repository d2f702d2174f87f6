"""Every registered env id: check_env, spaces, vector parity, bad input, and random-action properties."""

from __future__ import annotations

import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings, strategies as st

import gym_llm
from tests.envs.cases import CASES, env_cases, make_kwargs
from tests.envs.vector_checks import assert_same, without

CASE_IDS = [f"{i}-{n}" for i, n in env_cases()]


def test_every_registered_id_is_covered_and_every_override_is_registered():
    registered = {info.id for info in gym_llm.ENVS}
    assert {env_id for env_id, _ in env_cases()} == registered  # the cases come from the registry
    assert set(CASES) <= registered, "tests/envs/cases.py overrides an env id that is not registered"
    assert all(env_id in gym.registry for env_id in registered)


def test_import_is_light():
    code = ("import sys, gym_llm; heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'transformers', 'vllm', 'datasets', 'math_verify', 'sympy')]; print(heavy)")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("env_id,case", env_cases(), ids=CASE_IDS)
def test_check_env_passes_with_warnings_as_errors(env_id, case):
    env = gym.make(env_id, **make_kwargs(env_id, case))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


@pytest.mark.parametrize("env_id,case", env_cases(), ids=CASE_IDS)
def test_vector_entry_point_matches_sync(env_id, case):
    kwargs = make_kwargs(env_id, case)
    native = gym.make_vec(env_id, num_envs=3, vectorization_mode="vector_entry_point", **kwargs)
    sync = gym.make_vec(env_id, num_envs=3, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, **kwargs)
    native.action_space.seed(0)
    obs_n, info_n = native.reset(seed=11)
    obs_s, info_s = sync.reset(seed=11)
    assert_same(obs_n, obs_s)
    assert_same(without(info_n, "group_id"), info_s)  # group_id: only the native env has groups
    for _ in range(6):
        actions = native.action_space.sample()
        out_n, out_s = native.step(actions), sync.step(actions)
        assert_same(out_n[0], out_s[0])
        for a, b in zip(out_n[1:4], out_s[1:4]):
            np.testing.assert_array_equal(a, b)
        assert_same(without(out_n[4], "group_id"), out_s[4])
    native.close(), sync.close()


def _state(env):
    episode = env.unwrapped.episode
    return episode.render(), getattr(episode, "turn", None), getattr(episode, "steps", None)


BAD_ACTIONS = st.one_of(
    st.none(), st.integers(), st.floats(allow_nan=True), st.binary(max_size=8),
    st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=3),
    st.lists(st.integers(min_value=-(2**40), max_value=-1), min_size=1, max_size=3),
    st.lists(st.integers(min_value=10**7, max_value=2**40), min_size=1, max_size=3),
    st.dictionaries(st.sampled_from(["input_ids", "mask", "x"]), st.integers(), max_size=2),
)


@pytest.mark.parametrize("env_id,case", env_cases(), ids=CASE_IDS)
def test_random_actions_property(env_id, case):
    env = gym.make(env_id, **make_kwargs(env_id, case))
    text_mode = isinstance(env.action_space, gym_llm.UnicodeText)

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(seed=st.integers(0, 2**31 - 1), text=st.text(max_size=200), bad=BAD_ACTIONS, use_text=st.booleans())
    def run(seed, text, bad, use_text):
        obs, info = env.reset(seed=seed)
        assert env.observation_space.contains(obs)
        before = _state(env)
        if not (text_mode and isinstance(bad, str)) and not env.action_space.contains(bad):
            with pytest.raises((TypeError, ValueError)):
                env.step(bad)
            assert _state(env) == before  # a rejected action changes nothing
        env.action_space.seed(seed)
        action = text if (text_mode and use_text) else env.action_space.sample()
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs)
        assert isinstance(reward, float) and np.isfinite(reward)
        assert isinstance(terminated, bool) and isinstance(truncated, bool)
        assert info["task_id"] >= 0 and info["round"] == 0

    run()
    env.close()


@pytest.mark.parametrize("env_id,case", [c for c in env_cases() if c[1] == "text"], ids=lambda c: str(c))
def test_text_mode_rejects_over_long_action(env_id, case):
    env = gym.make(env_id, **make_kwargs(env_id, case))
    env.reset(seed=0)
    limit = env.action_space.max_length
    with pytest.raises(ValueError, match=f"at most {limit}"):
        env.step("x" * (limit + 1))


def _token_dict_cases():
    cases = []
    for env_id, case in env_cases():
        space = gym.make(env_id, **make_kwargs(env_id, case)).action_space
        if isinstance(space, gym.spaces.Dict):
            cases.append((env_id, case))
    return cases


@pytest.mark.parametrize("env_id,case", _token_dict_cases(), ids=lambda c: str(c))
def test_tokens_mode_rejects_bad_ids(env_id, case):
    env = gym.make(env_id, **make_kwargs(env_id, case))
    env.reset(seed=0)
    vocab = int(env.action_space["input_ids"].nvec[0])
    limit = env.action_space["input_ids"].shape[0]
    with pytest.raises(ValueError, match=f"Token id {vocab} is outside the vocabulary"):
        env.step([1, vocab])
    with pytest.raises(ValueError, match=f"at most {limit}"):
        env.step([1] * (limit + 1))
    with pytest.raises(TypeError, match="not text"):
        env.step("text")
    with pytest.raises(TypeError, match="integers"):
        env.step(np.array([1.5, 2.0]))


@pytest.mark.parametrize("env_id,case", env_cases(), ids=CASE_IDS)
def test_step_before_reset_raises(env_id, case):
    env = gym.make(env_id, **make_kwargs(env_id, case)).unwrapped
    with pytest.raises(gym.error.ResetNeeded, match="reset"):
        env.step(env.action_space.sample())


def _bad_per_env_actions(space) -> list:
    """Bad single actions for one sub-env: bool, NaN, out of range, wrong shape/dtype, bytes, None."""
    common = [None, b"bytes", True, float("nan"), [[1, 2], [3, 4]], {"x": 1}]
    if isinstance(space, gym_llm.UnicodeText):
        return common + [5, ["a list"], "x" * (space.max_length + 1)]
    if isinstance(space, gym.spaces.Dict):
        vocab = int(space["input_ids"].nvec[0])
        return common + ["text", [True, 1], [1.5, 2.0], [vocab], [-1], [1] * (space["input_ids"].shape[0] + 1)]
    vocab = int(space.n)
    return common + ["x", 1.5, -1, vocab, np.float32(2.0)]


def _bad_batched_actions(space, n: int) -> list:
    """Bad whole-batch actions for a native vector env: the wrong number of actions, and (tokens mode) a batched dict
    of the wrong shape or dtype, NaN ids, or a mask that is not 0/1."""
    bad: list = [[], [space.sample() for _ in range(n + 1)], None]
    if isinstance(space, gym.spaces.Dict):
        length = space["input_ids"].shape[0]
        ids, mask = np.zeros((n, length), np.int64), np.ones((n, length), np.int64)
        bad += [{"input_ids": ids[: n - 1], "attention_mask": mask[: n - 1]},
                {"input_ids": ids.astype(bool), "attention_mask": mask},
                {"input_ids": np.full((n, length), np.nan), "attention_mask": mask},
                {"input_ids": ids, "attention_mask": mask * 2},
                {"input_ids": ids}]
    return bad


@pytest.mark.parametrize("env_id,case", env_cases(), ids=CASE_IDS)
def test_vector_and_scalar_reject_the_same_bad_inputs_naming_the_sub_env(env_id, case):
    """Every bad action (bool, NaN, out of range, wrong shape/dtype, bytes, None, ...) at the first, the middle and
    the last sub-env of a native vector env: a TypeError/ValueError naming that sub-env, its task and group; no
    sub-env changes (a twin env that never saw it then steps identically). The scalar env rejects the same input with
    the same kind of error and the same message (less the sub-env), and is unchanged too (its twin steps identically).
    Bad whole-batch actions (wrong count; tokens mode: a batched dict of the wrong shape, dtype or mask) are rejected
    with the envs unchanged as well."""
    n = 3
    kwargs = make_kwargs(env_id, case)
    envs, twin = (gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point", **make_kwargs(env_id, case))
                  for _ in range(2))
    scalar, scalar_twin = gym.make(env_id, **kwargs), gym.make(env_id, **make_kwargs(env_id, case))
    space = envs.single_action_space
    bad_inputs = _bad_per_env_actions(space)
    text = isinstance(space, gym_llm.UnicodeText)

    def same(a, b):
        for x, y in zip(a, b):
            assert_same(without(x, "elapsed_s") if isinstance(x, dict) else x,
                        without(y, "elapsed_s") if isinstance(y, dict) else y)

    try:
        for k, bad in enumerate(bad_inputs):
            for position in range(n):
                seed = 100 * k + position
                _, infos = envs.reset(seed=seed)
                twin.reset(seed=seed)
                space.seed(seed)
                valid = [space.sample() for _ in range(n)]
                actions = list(valid)
                actions[position] = bad
                with pytest.raises((TypeError, ValueError)) as vector_error:
                    envs.step(tuple(actions) if text else actions)
                where = (f"sub-env {position} (task {int(infos['task_id'][position])}, "
                         f"group {int(infos['group_id'][position])})")
                message = str(vector_error.value)
                assert where in message, message
                scalar.reset(seed=seed)
                scalar_twin.reset(seed=seed)
                with pytest.raises((TypeError, ValueError)) as scalar_error:
                    scalar.step(bad)
                assert type(scalar_error.value) is type(vector_error.value), (scalar_error.value, vector_error.value)
                assert str(scalar_error.value) in message, (str(scalar_error.value), message)  # the same words
                step = tuple(valid) if text else valid
                same(envs.step(step), twin.step(step))
                same(scalar.step(valid[position]), scalar_twin.step(valid[position]))
        for k, bad in enumerate(_bad_batched_actions(space, n)):
            envs.reset(seed=7 + k)
            twin.reset(seed=7 + k)
            space.seed(k)
            with pytest.raises((TypeError, ValueError)):
                envs.step(bad)
            valid = [space.sample() for _ in range(n)]
            step = tuple(valid) if text else valid
            same(envs.step(step), twin.step(step))
    finally:
        for env in (envs, twin, scalar, scalar_twin):
            env.close()


@pytest.mark.parametrize("env_id,module,extra", [("LLMIFEval-v0", "if_verifiable", "ifeval"),
                                                 ("LLMIFEval-v0", "langdetect", "ifeval"),
                                                 ("LLMBrowser-v0", "playwright", "browser"),
                                                 ("LLMPythonTool-v0", "pyseccomp", "tools")])
def test_a_missing_extra_is_named_when_the_env_is_made(env_id, module, extra):
    """Without the optional dependency, gym.make fails at once with the extra to install (a fresh process where the
    module is blocked, as if it were not installed)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    kwargs = make_kwargs(env_id, "text")
    script = (f"import sys; sys.modules[{module!r}] = None\n"
              "import gymnasium as gym, gym_llm\n"
              f"gym.make({env_id!r}, **{kwargs!r})\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": f"{repo}:{repo / 'adapters'}", "PATH": "/usr/bin:/bin"})
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("gym_llm.core.extras.MissingExtraError") and f"pip install 'gym-llm[{extra}]'" in last, last
    assert module in last and env_id in last
