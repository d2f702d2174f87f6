"""Files someone sends you: a crafted rollout file, run folder or config must not run code on this host.

Each attack below worked before the fix (issue 45, item 4): ``gym-llm replay`` made the env from the recorded
arguments, so a file could switch the Python tool's sandbox off and have its recorded action run as a plain host
process, or name any installed module as a recorded function and have it imported; ``gym-llm train --resume`` (or a
config with ``resume = true``) unpickled the checkpoint's optimizer and RNG state. Each test plants a marker-writing
payload and checks that the marker is not created, that the refusal names what was refused and the opt-in, and — for
the replay — that the opt-in (``--trust-file`` / ``trust_file=True``) still does what it did (the attack is real).

The same tests run again as an unprivileged user (uid/gid 65534, the way ``tests/tools/test_sandbox_unprivileged.py``
does): an attacker's code runs as whoever replays or resumes, and must not run for either.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import gym_llm
from gym_llm_adapters.cli import main
from gym_llm_adapters.env_spec import RecordedEnvSpec, decode_kwargs, register_spec, tokenizer_record
from gym_llm_adapters.replay import replay
from gym_llm_adapters.rollout_io import RolloutWriter
from gym_llm_adapters.types import StepRecord
from tests import background
from tests.tools import unprivileged

REPO = Path(__file__).resolve().parents[2]


def crafted_file(path: Path, tok, env_id: str, env_kwargs: dict, completion: str, prompt: str = "") -> RecordedEnvSpec:
    """A rollout file holding one env spec (``env_kwargs`` as a file holds them) and one text-mode step that feeds
    ``completion``, conditioned on ``prompt`` (the env's opening observation, so that a replay feeds the action)."""
    spec = RecordedEnvSpec(env_id=env_id, env_kwargs=env_kwargs, mode="text", action_length=4096,
                           gym_llm_version=gym_llm.__version__, gymnasium_version=gym.__version__,
                           tokenizer=tokenizer_record(tok))
    register_spec(spec)  # the writer writes the spec of the records it is given
    ids = np.asarray(tok.encode(prompt, add_special_tokens=False), dtype=np.int64)
    completion_ids = np.asarray(tok.encode(completion, add_special_tokens=False), dtype=np.int64)
    step = StepRecord(env_index=0, task_id=0, group_id=0, round=0, turn=1, prompt_ids=ids,
                      completion_ids=completion_ids, logprobs=np.zeros(len(completion_ids), dtype=np.float32),
                      reward=0.0, terminated=False, truncated=False, version=0, prompt_text=prompt,
                      completion_text=completion, env_id=env_id, spec_id=spec.spec_id)
    with RolloutWriter(path) as writer:
        writer.write([step])
    return spec


def replay_error(path: Path, **options) -> Exception | None:
    try:
        replay(path, **options)
    except Exception as e:  # noqa: BLE001  (the refusal's type is checked by the caller)
        return e
    return None


# ------------------------------------------------------------------------------ replay: the sandbox switched off
SANDBOX_OFF = {"source": "arithmetic", "sandbox": {"isolation": "none", "min_idle": 0}}


def test_crafted_rollout_cannot_switch_the_python_sandbox_off(tmp_path, tiny_tok, capsys):
    marker = tmp_path / "ran-on-host"
    code = f"```python\nopen({str(marker)!r}, 'w').write('outside the sandbox')\n```"
    env = gym.make("LLMPythonTool-v0", **decode_kwargs(SANDBOX_OFF, tokenizer=None))  # what the attacker ran
    try:
        prompt, _ = env.reset(options={"task_id": 0})
    finally:
        env.close()
    path = tmp_path / "crafted.jsonl"
    crafted_file(path, tiny_tok, "LLMPythonTool-v0", SANDBOX_OFF, code, prompt)

    error = replay_error(path)
    assert not marker.exists(), "the recorded action ran as a plain host process"
    assert error is not None and type(error).__name__ == "UntrustedFileError", error
    message = str(error)
    assert "sandbox.isolation" in message and "'none'" in message and "--trust-file" in message
    assert "trust_file=True" in message
    assert main(["replay", str(path), "--no-progress"]) == 2  # the command says the same, exit status 2
    err = capsys.readouterr().err
    assert "gym-llm replay: error:" in err and "sandbox.isolation" in err and "--trust-file" in err
    assert not marker.exists()

    # the user's own arguments are the user's choice: the sandbox settings given at replay time replace the file's
    report = replay(path, env_kwargs={"sandbox": {"min_idle": 0}})
    assert not marker.exists() and len(report.episodes) == 1

    # the opt-in replays the file as before: the action runs where the file says (here, on the host)
    replay(path, trust_file=True)
    assert marker.read_text() == "outside the sandbox"


# ------------------------------------------------------------------------------ replay: a module named as code
EVIL_MODULE = """\
from pathlib import Path
Path({marker!r}).write_text("imported")

def score(task, messages):
    Path({marker!r}).write_text("called")
    return 0.0
"""


def test_crafted_rollout_cannot_import_a_module_it_names(tmp_path, tiny_tok, monkeypatch, capsys):
    marker = tmp_path / "imported"
    package = tmp_path / "site"
    package.mkdir()
    name = f"gym_llm_evil_{os.getpid()}"
    (package / f"{name}.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(package))  # an installed module: importable by name
    kwargs = {"reward_fn": {"$callable": f"{name}:score"}, "reward_timeout_s": None}
    path = tmp_path / "crafted.jsonl"
    crafted_file(path, tiny_tok, "LLMChat-v0", kwargs, "Hello.")

    error = replay_error(path)
    assert not marker.exists() and name not in sys.modules, "the file's module was imported"
    assert error is not None and type(error).__name__ == "UntrustedFileError", error
    assert "reward_fn" in str(error) and f"{name}:score" in str(error) and "--trust-file" in str(error)
    assert main(["replay", str(path), "--no-progress"]) == 2
    assert "reward_fn" in capsys.readouterr().err and not marker.exists()

    replay(path, trust_file=True)  # the opt-in imports it, as before
    assert marker.exists()
    sys.modules.pop(name, None)


# ------------------------------------------------------------------------------ a run folder's pickled state
class Payload:
    """Unpickles by calling ``open(marker, "w")``: any code would run the same way."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def crafted_run(run: Path, model_dir: Path, marker: Path, poisoned: str) -> None:
    """A run folder whose one checkpoint is the tiny model with its trainer state, and ``poisoned`` (``"rng.pt"`` or
    ``"optimizer.pt"``) a pickle that writes ``marker`` when loaded (the other state file is a clean one)."""
    step = run / "checkpoints" / "step-000001"
    shutil.copytree(model_dir, step)
    config = {"algorithm": "grpo", "env_id": "LLMGSM8K-v0"}
    state = {"step": 1, "phase": "grpo", "version": 1, "rollout_records": 0, "reference": None, "config": config}
    (step / "trainer_state.json").write_text(json.dumps(state))
    (run / "checkpoints" / "LATEST").write_text("step-000001")
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    clean = {"optimizer.pt": {"optimizer": optimizer.state_dict(),
                              "scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0).state_dict()},
             # as the trainer wrote it before the fix (numpy's state an array): old run folders still resume
             "rng.pt": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                        "cuda": None}}
    for name, saved in clean.items():
        torch.save({"payload": Payload(marker)} if name == poisoned else saved, step / name)


TRAIN = ["train", "grpo", "--env", "LLMGSM8K-v0", "--source", "arithmetic", "--model", "tiny", "--engine", "hf",
         "--device", "cpu", "--steps", "2", "--num-tasks", "1", "--group-size", "2", "--max-new-tokens", "4",
         "--max-seq-len", "128", "--eval-every", "0", "--eval-episodes", "2", "--no-progress"]


@pytest.mark.parametrize("poisoned", ["rng.pt", "optimizer.pt"])
def test_crafted_run_folder_is_not_unpickled_on_resume(tmp_path, tiny_model_path, poisoned, capsys):
    marker, run = tmp_path / "unpickled", tmp_path / "run"
    crafted_run(run, tiny_model_path, marker, poisoned)
    status = main([*TRAIN, "--out", str(run), "--resume"])
    assert not marker.exists(), f"resuming unpickled {poisoned}"
    err = capsys.readouterr().err
    assert status == 2, err[-3000:]
    assert poisoned in err and "weights_only" in err and "--model" in err, err[-3000:]


@pytest.mark.parametrize("poisoned", ["rng.pt", "optimizer.pt"])
def test_crafted_config_resuming_a_crafted_run_folder_runs_nothing(tmp_path, tiny_model_path, poisoned, capsys):
    marker, run = tmp_path / "unpickled", tmp_path / "run"
    crafted_run(run, tiny_model_path, marker, poisoned)
    config = tmp_path / "crafted.toml"
    config.write_text(f'env = "LLMGSM8K-v0"\nsource = "arithmetic"\nmodel = "tiny"\nengine = "hf"\ndevice = "cpu"\n'
                      f'out = {json.dumps(str(run))}\nresume = true\nsteps = 2\nnum_tasks = 1\ngroup_size = 2\n'
                      'max_new_tokens = 4\nmax_seq_len = 128\neval_every = 0\neval_episodes = 2\nno_progress = true\n')
    status = main(["train", "grpo", "--config", str(config)])
    assert not marker.exists(), f"a config's resume unpickled {poisoned}"
    err = capsys.readouterr().err
    assert status == 2 and poisoned in err, err[-3000:]


# ------------------------------------------------------------------------------ the same, as uid 65534
def _unprivileged_command(out_dir: Path) -> tuple[list[str], dict[str, str], Path]:
    home = out_dir / "home"
    home.mkdir()
    out_dir.chmod(0o777)
    home.chmod(0o777)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(out_dir / "t"),
            "-o", "addopts=--strict-markers", __file__, "-k", "not unprivileged"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")]), "OMP_NUM_THREADS": "1",
           "TMPDIR": str(out_dir)}
    if os.geteuid() != 0:
        return argv, env, REPO
    return unprivileged.command(argv, needed=[str(REPO), sys.prefix], stash=str(out_dir / "stash")), env, REPO


background.register("test_hostile_files_run_nothing_as_an_unprivileged_user", _unprivileged_command)


@pytest.mark.slow
def test_hostile_files_run_nothing_as_an_unprivileged_user():
    done = background.result("test_hostile_files_run_nothing_as_an_unprivileged_user", timeout_s=600)
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    summary = done.stdout.strip().splitlines()[-1]
    assert "6 passed" in summary and "skipped" not in summary and "failed" not in summary, summary
