"""A newcomer's mistakes, each in a subprocess as a user would run it: exit status 2, no traceback, a message that
names the fix, and no engine (or trainable model) started for bad input.

The command runs through ``gym_llm_adapters.cli.main`` in a fresh interpreter where starting an engine or loading a
policy aborts with ``ENGINE STARTED`` — so a check that runs too late fails loudly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import shared_data_dir

REPO = Path(__file__).resolve().parents[2]
GSM8K = str(shared_data_dir() / "gsm8k" / "test.jsonl")

GUARDED = """
import sys
import gym_llm_adapters.training.setup as setup
import gym_llm_adapters.training.trainer as trainer  # bound setup's names when training/__init__ imported it
def forbidden(*args, **kwargs):
    print("ENGINE STARTED", file=sys.stderr)
    raise SystemExit(99)
setup.build_engine = setup.load_policy = trainer.build_engine = trainer.load_policy = forbidden
from gym_llm_adapters.cli import main
sys.exit(main(sys.argv[1:]))
"""


def gym_llm(*argv: str, cwd: Path | None = None, guarded: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", GUARDED, *argv] if guarded else [sys.executable, "-m", "gym_llm_adapters.cli", *argv]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


@pytest.fixture
def in_process(monkeypatch, capsys):
    """``main(argv)`` in this process (fast), with starting an engine or loading a policy forbidden; returns
    ``(exit status, stderr)``."""
    import gym_llm_adapters.training.setup as setup
    import gym_llm_adapters.training.trainer as trainer
    from gym_llm_adapters.cli import main

    def forbidden(*args, **kwargs):
        raise AssertionError("ENGINE STARTED")

    for module in (setup, trainer):  # the trainer bound setup's names when training/__init__ imported it
        monkeypatch.setattr(module, "build_engine", forbidden)
        monkeypatch.setattr(module, "load_policy", forbidden)

    def run(*argv: str) -> tuple[int, str]:
        try:
            status = main(list(argv))
        except SystemExit as e:  # argparse's own errors exit 2 with a usage line
            status = e.code
        return status, capsys.readouterr().err

    return run


def assert_user_error(done: subprocess.CompletedProcess, *fragments: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr and "ENGINE STARTED" not in done.stderr, done.stderr[-2000:]
    last = [line for line in done.stderr.strip().splitlines() if line.strip()][-1]
    for fragment in fragments:
        assert fragment in done.stderr, (fragment, done.stderr[-1500:])
    return last


# ---------------------------------------------------------------------------- 1. defaults fit the model
def test_the_simplest_eval_runs_with_the_tiny_model(tmp_path):
    done = gym_llm("eval", "LLMGSM8K-v0", "--model", "tiny", "--n", "2", "--data-files", GSM8K, "--engine", "hf",
                   "--max-new-tokens", "8", "--no-progress", "--out", str(tmp_path / "e.jsonl"), guarded=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "pass rate" in done.stdout
    assert "the longest sequence this model takes" in done.stderr  # 4096 clamped to the tiny model's 2048, said


# ---------------------------------------------------------------------------- 2./3. bad input, found first
@pytest.mark.parametrize("argv,fragments", [
    (["eval", "LLMGSM8k-v0"], ["unknown env id 'LLMGSM8k-v0'", "did you mean 'LLMGSM8K-v0'"]),
    (["train", "grpo", "--env", "LLMChatt-v0"], ["unknown env id", "did you mean 'LLMChat-v0'"]),
    (["play", "NoSuchEnv-v9"], ["unknown env id", "gym-llm list"]),
    (["train", "grpo"], ["which env?", "--env"]),
    (["eval", "LLMGSM8K-v0", "--n", "0"], ["--n", "expected a whole number >= 1"]),
    (["eval", "LLMGSM8K-v0", "--top-p", "1.5"], ["--top-p", "(0, 1]"]),
    (["eval", "LLMGSM8K-v0", "--temperature", "hot"], ["--temperature", "expected a number"]),
    (["train", "grpo", "--env", "LLMGSM8K-v0", "--steps", "-3"], ["--steps", ">= 1"]),
    (["train", "grpo", "--env", "LLMGSM8K-v0", "--group-size", "1", "--source", "arithmetic", "--model", "tiny",
      "--max-new-tokens", "8"], ["group_size must be >= 2"]),
    (["eval", "LLMGSM8K-v0", "--model", "no-such-model", "--source", "arithmetic"], ["--model 'no-such-model'",
                                                                                     "embedded models"]),
    (["eval", "LLMGSM8K-v0", "--source", "arithmetic", "--max-seq-len", "99999"], ["--max-seq-len 99999",
                                                                                   "2048 or less"]),
    (["eval", "LLMGSM8K-v0", "--source", "arithmetic", "--env-arg", "max_turnz=2"], ["cannot be made",
                                                                                      "max_turnz"]),
])
def test_bad_input_is_one_clear_line_before_any_engine(in_process, argv, fragments):
    status, err = in_process(*argv)
    assert status == 2 and "Traceback" not in err and "ENGINE STARTED" not in err, err[-2000:]
    for fragment in fragments:
        assert fragment in err, (fragment, err[-1500:])


def test_bad_input_as_a_user_runs_it():
    """One of the above in a real subprocess: what the terminal shows."""
    last = assert_user_error(gym_llm("eval", "LLMGSM8k-v0", "--n", "2"), "did you mean 'LLMGSM8K-v0'")
    assert last.startswith("gym-llm eval: error: unknown env id")


def test_a_typo_in_data_files_is_found_before_the_engine():
    last = assert_user_error(gym_llm("eval", "LLMGSM8K-v0", "--data-files", "../shared/data/gsm8k/tset.jsonl"),
                             "no such file", "--source arithmetic")
    assert last.startswith("gym-llm eval: error: --data-files")


@pytest.mark.parametrize("content,fragments", [
    ("learning_rat = 1e-4\n", ["unknown key 'learning_rat'", "did you mean 'learning_rate'"]),
    ("steps = \n", ["not valid TOML"]),
    ("steps = 'many'\n", ["steps = 'many'", "whole number"]),
    ("lr_schedule = 'cosin'\n", ["lr_schedule", "not one of"]),
])
def test_bad_toml_is_named_with_the_closest_key(in_process, tmp_path, content, fragments):
    config = tmp_path / "bad.toml"
    config.write_text('env = "LLMGSM8K-v0"\n' + content)
    status, err = in_process("train", "grpo", "--config", str(config), "--out", str(tmp_path / "run"))
    assert status == 2 and "Traceback" not in err, err[-2000:]
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_bad_toml_as_a_user_runs_it(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('env = "LLMGSM8K-v0"\nlearning_rat = 1e-4\n')
    assert_user_error(gym_llm("train", "grpo", "--config", str(config)), "did you mean 'learning_rate'")


# ---------------------------------------------------------------------------- 4. every env for every command
def test_commands_refuse_envs_they_cannot_run_saying_why(in_process, capsys):
    last = assert_user_error(gym_llm("eval", "LLMHashing-v0", "--n", "2"), "token-level env")
    assert "gym-llm play LLMHashing-v0" in last
    status, err = in_process("train", "grpo", "--env", "LLMHashing-v0")
    assert status == 2 and "token-level env" in err
    from gym_llm_adapters.cli import main

    assert main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    commands = {e["id"]: e["commands"] for e in listing}
    assert commands["LLMHashing-v0"] == ["play"] and commands["LLMGSM8K-v0"] == ["play", "eval", "train"]


# ---------------------------------------------------------------------------- 5. runs never mix
def test_eval_out_refuses_an_existing_file_and_appends_with_fresh_group_ids(tmp_path, capsys):
    from gym_llm_adapters.cli import main
    from gym_llm_adapters.rollout_io import read_rollouts

    out = tmp_path / "eval.jsonl"
    common = ["eval", "LLMGSM8K-v0", "--model", "tiny", "--engine", "hf", "--n", "4", "--batch", "2",
              "--source", "arithmetic", "--max-new-tokens", "4", "--no-progress", "--out", str(out)]
    assert main(common) == 0  # the runs themselves in this process (fast); the refusal as a user sees it
    first = read_rollouts(out)
    assert_user_error(gym_llm(*common), "already exists", "--overwrite", "--append")
    assert main([*common, "--append"]) == 0
    both = read_rollouts(out)
    assert len(both) == 2 * len(first)
    old, new = {t.group_id for t in both[: len(first)]}, {t.group_id for t in both[len(first):]}
    assert old and new and not old & new  # appended groups never collide with the earlier run's
    assert main([*common, "--overwrite"]) == 0
    assert len(read_rollouts(out)) == len(first)


def test_train_out_holding_a_run_needs_resume(in_process, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step-000002").mkdir(parents=True)
    (run / "checkpoints" / "step-000002" / "trainer_state.json").write_text("{}")
    base = ["train", "grpo", "--env", "LLMGSM8K-v0", "--source", "arithmetic", "--model", "tiny"]
    assert_user_error(gym_llm(*base, "--out", str(run)), "already holds a run", "--resume")
    for argv, fragment in (([*base, "--out", str(tmp_path / "new"), "--resume"], "no run to continue"),
                           ([*base, "--out", str(tmp_path / "junk")], "other files in it")):
        (tmp_path / "junk").mkdir(exist_ok=True)
        (tmp_path / "junk" / "notes.txt").write_text("mine")
        status, err = in_process(*argv)
        assert status == 2 and fragment in err, err


def test_a_warm_start_with_nothing_to_learn_is_a_user_error_not_a_bug(tmp_path, in_process):
    """Every worked answer is longer than --max-new-tokens: known once the env's tasks are read with the model's
    tokenizer, which a fresh run does before any model or engine loads (guarded: loading one fails the test): one
    clear line and status 2, not an 'internal error' after the step-0 evaluation."""
    result = gym_llm("train", "grpo", "--env", "LLMGSM8K-v0", "--source", "arithmetic", "--model", "tiny",
                     "--engine", "hf", "--device", "cpu", "--sft-warmup-steps", "1", "--steps", "1",
                     "--max-new-tokens", "2", "--eval-every", "0", "--eval-episodes", "1", "--no-progress",
                     "--out", str(tmp_path / "run"))
    assert_user_error(result, "the SFT warm start has no data", "longer than max_new_tokens=2", "raise max_new_tokens")
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["train.log"]
    # the same folder again (the failed start left only its log): the same error, not "other files in it"
    status, err = in_process(*result.args[3:])
    assert status == 2 and "longer than max_new_tokens=2" in err and "other files" not in err, err


# ---------------------------------------------------------------------------- LoRA settings, found first
NEEDS_VLLM = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
LORA = ["train", "grpo", "--env", "LLMGSM8K-v0", "--source", "arithmetic", "--model", "tiny", "--max-new-tokens", "8"]


@pytest.mark.parametrize("argv,fragments", [
    ([*LORA, "--lora-rank", "0"], ["--lora-rank", "expected a whole number >= 1 (the LoRA adapter's rank"]),
    ([*LORA, "--lora-rank", "65", "--engine", "hf"],  # the tiny model's k_proj and v_proj are 128 -> 64
     ["LoRA rank 65 is above the narrowest targeted layer's width (64)", "--lora-rank 16"]),
    ([*LORA, "--lora-rank", "8", "--engine", "hf", "--lora-target-modules", "qkv_proj"],
     ["['qkv_proj'] are not linear layers of this model", "'q_proj'", "--lora-target-modules down_proj gate_proj"]),
    ([*LORA, "--lora-alpha", "16"], ["lora_alpha set without lora_rank", "--lora-rank R"]),
    pytest.param([*LORA, "--lora-rank", "1024", "--engine", "vllm"],
                 ["--engine vllm cannot serve this adapter", "above the largest rank vLLM serves (512)", "--engine hf"],
                 marks=NEEDS_VLLM),
    pytest.param([*LORA, "--lora-rank", "8", "--engine", "vllm", "--vllm-arg", "enable_lora=false"],
                 ["--vllm-arg enable_lora", "--lora-rank 8 sets vLLM's LoRA switches itself", "drop the --vllm-arg"],
                 marks=NEEDS_VLLM),
])
def test_bad_lora_settings_are_one_clear_line_before_any_engine(in_process, argv, fragments):
    status, err = in_process(*argv)
    assert status == 2 and "Traceback" not in err and "ENGINE STARTED" not in err, err[-2000:]
    for fragment in fragments:
        assert fragment in err, (fragment, err[-1500:])


def _run_folder(path: Path, lora: dict | None) -> Path:
    """A run folder whose newest checkpoint says what it trained (all a resume reads before the model loads)."""
    folder = path / "checkpoints" / "step-000003"
    folder.mkdir(parents=True)
    state = {"step": 3, "phase": "grpo", "version": 3, "rollout_records": 0, "reference": None, "config": {},
             "lora": lora}
    (folder / "trainer_state.json").write_text(json.dumps(state))
    return path


def test_a_resume_that_does_not_fit_the_run_is_refused_before_any_engine(in_process, tmp_path):
    from gym_llm_adapters.lora import LoraSettings
    from gym_llm_adapters.training.lora_run import lora_record

    full = _run_folder(tmp_path / "full", None)
    lora = _run_folder(tmp_path / "lora", lora_record(LoraSettings(rank=8), base_model="tiny", base_path="/x"))
    for argv, fragments in (
            ([*LORA, "--out", str(full), "--resume", "--lora-rank", "8"],
             ["is a full fine-tune", "Resume it without the --lora-* options", f"--model {full} --lora-rank 8"]),
            ([*LORA, "--out", str(lora), "--resume"],
             ["is a LoRA run (--lora-rank 8 --lora-alpha 16", "Resume it with its settings"]),
            ([*LORA, "--out", str(lora), "--resume", "--lora-rank", "4", "--engine", "hf"],
             ["trained an adapter with --lora-rank 8", "got --lora-rank 4", "cannot change its shape"])):
        status, err = in_process(*argv)
        assert status == 2 and "Traceback" not in err and "ENGINE STARTED" not in err, err[-2000:]
        for fragment in fragments:
            assert fragment in err, (fragment, err[-1500:])
    # a LoRA run's folder is not a model: the message says how to make one
    status, err = in_process("eval", "LLMGSM8K-v0", "--model", str(lora), "--source", "arithmetic")
    assert status == 2 and "holds a LoRA adapter" not in err  # no adapter files in this stand-in folder
    (lora / "checkpoints" / "step-000003" / "adapter_config.json").write_text("{}")
    (lora / "checkpoints" / "step-000003" / "adapter_model.safetensors").write_bytes(b"")
    status, err = in_process("eval", "LLMGSM8K-v0", "--model", str(lora), "--source", "arithmetic")
    assert status == 2 and "holds a LoRA adapter, not a whole model" in err
    assert f"gym-llm export {lora} --merge --out MERGED_DIR" in err


# ---------------------------------------------------------------------------- internal errors still say so
def test_an_internal_error_shows_its_traceback_and_where_to_report_it(tmp_path):
    script = ("import sys\nimport gym_llm_adapters.cli.list_envs as l\n"
              "def boom(args):\n    raise RuntimeError('a bug')\n"
              "l.run = boom\nfrom gym_llm_adapters.cli import main\nsys.exit(main(['list']))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters")])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and "Traceback" in done.stderr and "RuntimeError: a bug" in done.stderr
    assert "report it at" in done.stderr


def test_debug_shows_the_traceback_of_a_user_error(in_process):
    status, err = in_process("--debug", "eval", "NoSuchEnv-v0")
    assert status == 2 and "Traceback" in err and "UsageError" in err


JUDGED = ["train", "grpo", "--env", "LLMChat-v0", "--model", "tiny", "--max-new-tokens", "8"]


@pytest.mark.parametrize("argv,fragments", [
    ([*JUDGED, "--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "j"],
     ["judge endpoint http://127.0.0.1:9/v1 is unreachable", "start the server"]),
    ([*JUDGED, "--judge-url", "http://127.0.0.1:9/v1"], ["--judge-url", "--judge-model"]),
    ([*JUDGED, "--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "j", "--judge-mode", "pairs"],
     ["--judge-mode", "invalid choice"]),
    ([*JUDGED, "--eval-env", "LLMIFEvall-v0"], ["unknown env id 'LLMIFEvall-v0'", "did you mean 'LLMIFEval-v0'"]),
])
def test_a_judge_that_cannot_work_is_one_clear_line_before_any_engine(in_process, argv, fragments):
    import time

    start = time.monotonic()
    status, err = in_process(*argv)
    assert status == 2 and "Traceback" not in err and "ENGINE STARTED" not in err, err[-2000:]
    for fragment in fragments:
        assert fragment in err, (fragment, err[-1500:])
    assert time.monotonic() - start < 30


def test_a_config_file_may_not_send_an_environment_variable_to_its_judge(in_process, tmp_path):
    """judge_key_env names a variable whose value goes to judge_url: a file naming both could send any secret (a cloud
    key) to any host, so it needs --trust-file or the user's own flag."""
    config = tmp_path / "c.toml"
    config.write_text('env = "LLMChat-v0"\nmodel = "tiny"\njudge_url = "http://127.0.0.1:9/v1"\njudge_model = "j"\n'
                      'judge_key_env = "AWS_SECRET_ACCESS_KEY"\n')
    status, err = in_process("train", "grpo", "--config", str(config))
    assert status == 2 and "judge_key_env = 'AWS_SECRET_ACCESS_KEY'" in err and "--trust-file" in err, err[-1500:]
