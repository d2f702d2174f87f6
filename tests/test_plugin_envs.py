"""Envs from other packages (docs/adding_an_env.md, "In your own package"): the page's package, written as the page
shows it, is installed with pip into a folder of its own; a program that imports gym_llm finds its env
(``gym.make``, ``gym.make_vec``), ``gym-llm list`` shows it with its package, ``gym-llm play`` and ``eval`` take it.
Beside it, a broken plugin package (one entry point raises after registering an id, one names a module, one replaces
a gym-llm id) must not break ``import gym_llm``: each is a warning naming the package and the fix."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "adding_an_env.md"

BROKEN_TOML = """\
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "broken-envs"
version = "0.0.1"

[project.entry-points."gym_llm.envs"]
raises = "broken_envs:register"
module_only = "broken_envs"
hijack = "broken_envs:hijack"
"""

BROKEN_MODULE = """\
import gymnasium as gym


def register():
    gym.register("BrokenPartial-v0", entry_point="broken_envs:Nope")
    raise RuntimeError("the dataset server is down")


def hijack():
    gym.register("LLMChat-v0", entry_point="broken_envs:Nope")
"""

CHECKS = textwrap.dedent("""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import gymnasium as gym
        import gym_llm
    from gym_llm.registration import plugin_envs, registered_envs

    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 3, messages
    raises, module_only, hijack = (next(m for m in messages if key in m) for key in
                                   ("raises = ", "module_only = ", "hijack = "))
    for message in messages:
        assert "of package broken-envs" in message and "pip uninstall broken-envs" in message, message
    assert "RuntimeError: the dataset server is down" in raises and "not loaded" in raises
    assert "names a module, not a function" in module_only
    assert "gym-llm's own id(s) LLMChat-v0" in hijack
    assert "BrokenPartial-v0" not in gym.registry  # what the failed plugin registered is removed
    assert gym.registry["LLMChat-v0"].entry_point == "gym_llm.envs.chat:LLMChatEnv"  # gym-llm's id is kept

    assert [(e.id, e.package) for e in plugin_envs()] == [("MyReverse-v0", "my-envs")]
    assert registered_envs()[-1].id == "MyReverse-v0"
    env = gym.make("MyReverse-v0")
    obs, info = env.reset(seed=0)
    task = env.unwrapped.episode.task
    assert env.step(f"<answer>{task.answer}</answer>")[1] == 1.0
    envs = gym.make_vec("MyReverse-v0", num_envs=4, group_size=2, vectorization_mode="vector_entry_point")
    assert type(envs).__name__ == "LLMReverseVectorEnv" and len(envs.reset(seed=0)[0]) == 4
    print("ALL CHECKS PASSED")
""")


def fenced_blocks(text: str, language: str) -> list[str]:
    return [textwrap.dedent(b) for b in re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder holding the doc's package and the broken one, installed by pip from their sources (no index)."""
    root = tmp_path_factory.mktemp("plugins")
    text = DOC.read_text()
    module = next(b for b in fenced_blocks(text, "python") if "class LLMReverseEnv(LLMEnv, build=build_reverse)" in b)
    registration = next(b for b in fenced_blocks(text, "python") if "register_env(" in b)
    toml = next(b for b in fenced_blocks(text, "toml") if '"gym_llm.envs"' in b)
    sources = {"my-envs": {"pyproject.toml": toml, "my_envs/__init__.py": "", "my_envs/reverse.py": module,
                           "my_envs/registration.py": registration},
               "broken-envs": {"pyproject.toml": BROKEN_TOML, "broken_envs/__init__.py": BROKEN_MODULE}}
    for name, files in sources.items():
        for path, content in files.items():
            (root / "src" / name / path).parent.mkdir(parents=True, exist_ok=True)
            (root / "src" / name / path).write_text(content)
    target = root / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(target), str(root / "src" / "my-envs"),
                           str(root / "src" / "broken-envs")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert len(list(target.glob("*.dist-info/entry_points.txt"))) == 2
    return target


def run(site: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO), str(REPO / "adapters")])}
    return subprocess.run([sys.executable, *args], env=env, input=stdin, capture_output=True, text=True, timeout=300,
                          cwd=site.parent)


def test_an_installed_package_s_env_is_found_and_a_broken_one_only_warns(site):
    done = run(site, "-c", CHECKS)
    assert done.returncode == 0 and "ALL CHECKS PASSED" in done.stdout, done.stderr[-4000:]


def test_gym_llm_list_shows_it_with_its_package_and_play_takes_it(site):
    listed = run(site, "-m", "gym_llm_adapters.cli", "list")
    assert listed.returncode == 0, listed.stderr[-4000:]
    assert "MyReverse-v0  (from my-envs)\n  spell a word backwards" in listed.stdout
    assert "(10 from gym-llm, 1 from my-envs)" in listed.stdout
    rows = json.loads(run(site, "-m", "gym_llm_adapters.cli", "list", "--json").stdout)
    assert rows[-1]["id"] == "MyReverse-v0" and rows[-1]["package"] == "my-envs"
    assert {row["package"] for row in rows[:-1]} == {"gym-llm"}
    # the page's tasks: task 0 of the seed-0 order is some word; a wrong reply pays 0, the reversed word pays 1
    played = run(site, "-m", "gym_llm_adapters.cli", "play", "MyReverse-v0", "--episodes", "1",
                 stdin="<answer>nope</answer>\n.\n")
    assert played.returncode == 0, played.stderr[-4000:]
    assert "Spell '" in played.stdout and "reward 0  terminated True" in played.stdout
    word = re.search(r"Spell '(\w+)' backwards", played.stdout).group(1)
    played = run(site, "-m", "gym_llm_adapters.cli", "play", "MyReverse-v0",
                 stdin=f"<answer>{word[::-1]}</answer>\n.\n")
    assert "reward 1  terminated True" in played.stdout, played.stdout + played.stderr[-2000:]


@pytest.mark.slow
def test_gym_llm_eval_takes_it(site):
    done = run(site, "-m", "gym_llm_adapters.cli", "eval", "MyReverse-v0", "--model", "tiny", "--engine", "hf",
               "--n", "2", "--max-new-tokens", "8")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "MyReverse-v0" in done.stdout + done.stderr


def test_the_servers_and_integrations_know_it(site):
    """OpenEnv's server (`gym-llm serve`), SkyRL's registry and verifiers' env list read the same registry as
    `gym-llm list`: a plugin's env is servable and registered there too."""
    code = textwrap.dedent("""
        import gym_llm
        from gym_llm.integrations._openenv_server import _check_servable
        from gym_llm.integrations.verifiers import _registered_ids
        _check_servable("MyReverse-v0", {})
        assert "MyReverse-v0" in _registered_ids()
        print("SERVABLE")
    """)
    done = run(site, "-c", code)
    assert done.returncode == 0 and "SERVABLE" in done.stdout, done.stderr[-4000:]
