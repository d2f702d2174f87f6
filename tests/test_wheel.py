"""The distribution: ``python -m build`` makes an sdist and a wheel (the wheel built from the sdist), the wheel holds
every module and package file of the checkout, and installed in a fresh virtual environment — the base
dependencies and the light ``code`` extra (its sandboxes), no torch — it serves, from a folder outside the checkout,
``gym-llm list`` and every env id: made with its defaults, or refused with the clear error that says what to install or pass (never a
missing file of the package)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

import gym_llm

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"gym_llm": REPO / "gym_llm", "gym_llm_adapters": REPO / "adapters" / "gym_llm_adapters",
            "gym_llm_verifiers": REPO / "gym_llm_verifiers"}
WORKS_BY_DEFAULT = {"LLMChat-v0", "LLMCountdown-v0", "LLMCode-v0", "LLMTokens-v0"}
"""Envs whose defaults need nothing beyond the base dependencies and the code extra (the others need a data source,
an extra, or a vocabulary)."""

MAKE_EVERY_ENV = textwrap.dedent("""
    import json, sys
    import gymnasium as gym
    import gym_llm
    from gym_llm.core.extras import MissingExtraError

    assert "site-packages" in gym_llm.__file__, gym_llm.__file__
    out = {}
    for info in gym_llm.ENVS:
        try:
            env = gym.make(info.id)
            env.reset(seed=0)
            env.close()
            out[info.id] = "ok"
        except Exception as e:
            out[info.id] = f"{type(e).__name__}: {e}"
    env = gym.make("LLMHashing-v0", vocab_size=16, prompts=[[1, 2, 3]])  # a vocabulary and prompts: nothing to default
    env.reset(seed=0)
    out["LLMHashing-v0 vocab_size=16"] = "ok"
    # the package's own files at work: HumanEval's first task solved, graded by the sandbox's programs
    env = gym.make("LLMCode-v0", task_order="sequential")
    env.reset(seed=0, options={"task_id": 0})
    _, reward, terminated, _, info = env.step(env.unwrapped.episode.task.data["solution"])
    out["LLMCode-v0 solved"] = [reward, bool(terminated)]
    env.close()
    from gym_llm.envs.code_tasks import codeio_subset  # gym_llm/data/codeio_subset.json (the tasks: reasoning_gym)

    out["codeio subset"] = len(codeio_subset()["train"])
    print(json.dumps(out))
""")


def package_files() -> set[str]:
    """The checkout's files that belong in the wheel: every file of the import packages (no caches)."""
    return {f"{package}/{path.relative_to(root).as_posix()}" for package, root in PACKAGES.items()
            for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts}


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return out


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel and its code extra; returns its bin folder."""
    root = tmp_path_factory.mktemp("fresh")
    venv.create(root / "venv", with_pip=True)
    wheel = next(dist.glob("gym_llm-*.whl"))
    done = subprocess.run([str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet",
                           f"{wheel}[code]"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return root / "venv" / "bin"


def run_outside(bin_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """Run from the fresh environment's folder (not the checkout), without the checkout on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
    return subprocess.run(list(args), cwd=bin_dir.parent.parent, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_build_makes_an_sdist_and_a_wheel_with_every_package_file(dist):
    wheel = next(dist.glob("gym_llm-*-py3-none-any.whl"))
    sdist = next(dist.glob("gym_llm-*.tar.gz"))
    with zipfile.ZipFile(wheel) as z:
        names = {n for n in z.namelist() if ".dist-info/" not in n}
        entry_points = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    expected = package_files()
    assert {"gym_llm/data/chat_prompts.jsonl", "gym_llm/data/codeio_subset.json", "gym_llm/py.typed",
            "gym_llm/tools/sandbox/server.py", "gym_llm/envs/code_runtime.py", "gym_llm/envs/mlgym/runtime.py",
            "gym_llm/tasks/larkspur.py"} <= expected
    assert names == expected, (f"missing from the wheel: {sorted(expected - names)}; "
                               f"not in the checkout: {sorted(names - expected)}")
    assert "gym-llm = gym_llm_adapters.cli:main" in entry_points
    with tarfile.open(sdist) as tar:
        in_sdist = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    assert {"pyproject.toml", "README.md", "gym_llm/data/codeio_subset.json",
            "adapters/gym_llm_adapters/cli/__init__.py"} <= in_sdist


@pytest.mark.slow
def test_the_wheel_in_a_fresh_venv_lists_and_makes_every_env(installed):
    listed = run_outside(installed, "gym-llm", "list", "--json")
    assert listed.returncode == 0, listed.stderr[-4000:]
    assert [row["id"] for row in json.loads(listed.stdout)] == [info.id for info in gym_llm.ENVS]
    assert run_outside(installed, "python", "-c", "import importlib.util as u; print(u.find_spec('torch'))"
                       ).stdout.strip() == "None"  # the env package's dependencies, not torch
    done = run_outside(installed, "python", "-c", MAKE_EVERY_ENV)
    assert done.returncode == 0, done.stderr[-4000:]
    made = json.loads(done.stdout.strip().splitlines()[-1])
    for env_id, outcome in made.items():
        if env_id in WORKS_BY_DEFAULT or " " in env_id:
            continue
        assert "No such file" not in outcome and not outcome.startswith("FileNotFoundError"), (env_id, outcome)
        if env_id == "LLMHashing-v0":
            assert outcome.startswith("ValueError: LLMHashing needs tokenizer= or vocab_size="), outcome
        else:  # an extra to install, or a data source to choose: said with the command that fixes it
            assert "pip install 'gym-llm[" in outcome, (env_id, outcome)
    assert {env_id for env_id, outcome in made.items() if outcome == "ok"} >= WORKS_BY_DEFAULT
    assert made["LLMHashing-v0 vocab_size=16"] == "ok"
    assert made["LLMCode-v0 solved"] == [1.0, True]
    assert made["codeio subset"] > 0
