"""docs/adding_an_env.md, followed as written: its module in a fresh package, registered as it says, is a full env."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "adding_an_env.md"

CHECKS = textwrap.dedent("""
    import pickle
    import gymnasium as gym
    from gymnasium.utils.env_checker import check_env
    from gymnasium.vector import SyncVectorEnv
    # REGISTER
    from my_envs.reverse import LLMReverseEnv, LLMReverseVectorEnv
    from gym_llm_adapters.models.tokenizers import tiny_tokenizer

    check_env(gym.make("LLMReverse-v0").unwrapped, skip_render_check=True)
    check_env(gym.make("LLMReverse-v0", mode="tokens", tokenizer=tiny_tokenizer(), max_seq_len=256,
                       max_action_tokens=16).unwrapped, skip_render_check=True)
    envs = gym.make_vec("LLMReverse-v0", num_envs=4, group_size=2, vectorization_mode="vector_entry_point",
                        format_reward=0.1)
    assert type(envs) is LLMReverseVectorEnv is LLMReverseEnv.Vector
    obs, info = envs.reset(seed=0)
    assert info["task_id"][0] == info["task_id"][1] and info["task_id"][2] == info["task_id"][3]  # GRPO groups
    tasks = [envs.unwrapped.episodes[i].task for i in range(4)]
    replies = [f"<answer>{t.answer}</answer>" if i % 2 == 0 else "<answer>nope</answer>" for i, t in enumerate(tasks)]
    _, rewards, terminated, _, info = envs.step(replies)
    assert rewards.tolist() == [1.1, 0.1, 1.1, 0.1] and terminated.all()
    assert info["final_info"]["correct"].tolist() == [True, False, True, False]
    copy = pickle.loads(pickle.dumps(envs))
    assert type(copy) is LLMReverseVectorEnv and copy.reset(seed=0)[0] == obs  # made again from its arguments
    sync = SyncVectorEnv([lambda: gym.make("LLMReverse-v0") for _ in range(2)])
    native = gym.make_vec("LLMReverse-v0", num_envs=2, vectorization_mode="vector_entry_point")
    assert list(sync.reset(seed=7)[0]) == list(native.reset(seed=7)[0])
    print("ALL CHECKS PASSED")
""")


def python_blocks(text: str) -> list[str]:
    return [textwrap.dedent(b) for b in re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)]


def test_the_doc_s_env_module_registered_as_it_says_is_a_full_env(tmp_path):
    blocks = python_blocks(DOC.read_text())
    module = next(b for b in blocks if "class LLMReverseEnv(LLMEnv, build=build_reverse)" in b)
    register = next(b for b in blocks if "gym.register(" in b)
    package = tmp_path / "my_envs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "reverse.py").write_text(module)
    script = CHECKS.replace("# REGISTER", register.strip())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), str(REPO / "adapters")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0 and "ALL CHECKS PASSED" in done.stdout, done.stderr[-4000:]


def test_the_doc_s_registration_line_is_a_valid_entry():
    from gym_llm.registration import EnvInfo

    line = next(b for b in python_blocks(DOC.read_text()) if b.lstrip().startswith("EnvInfo("))
    info = eval(line.strip().rstrip(","), {"EnvInfo": EnvInfo})  # the doc's own line, as the registry reads it
    assert info.vector_entry_point == "gym_llm.envs.reverse:LLMReverseVectorEnv"
