"""The ``gym-llm`` command: list, play, eval, and train interrupted by a real Ctrl-C then resumed."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

import gym_llm
from gym_llm_adapters.cli import main
from gym_llm_adapters.cli.play import play
from gym_llm_adapters.rollout_io import read_rollouts

REPO = Path(__file__).resolve().parents[3]
ARITHMETIC = ["--source", "arithmetic", "--env-arg", "max_operand=9", "--env-arg", "prompt_template={question}"]


def test_list_shows_every_env_with_spaces_and_rewards(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    for env in gym_llm.ENVS:
        assert env.id in text and env.reward_range in text
    assert main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [e.id for e in gym_llm.ENVS]
    assert all(r["action"] and r["observation"] for r in rows)


def test_play_shows_the_task_takes_typed_replies_and_reports_rewards():
    env = gym.make("LLMGSM8K-v0", source="arithmetic", max_operand=9)
    env.reset(seed=0)
    first = env.unwrapped.episode.task
    env.reset()
    second = env.unwrapped.episode.task
    replies = f"Let me see.\nThe sum is {first.answer}.\n#### {first.answer}\n.\n#### {int(second.answer) + 1}\n.\n"
    out = io.StringIO()
    returns = play(env, episodes=2, seed=0, raw=False, stream=io.StringIO(replies), out=out)
    assert returns == [1.0, 0.0]
    text = out.getvalue()
    assert first.data["question"] in text and second.data["question"] in text
    assert '"correct": true' in text and '"correct": false' in text
    env.close()


def test_play_multi_turn_chat_shows_follow_ups_and_survives_bad_actions():
    env = gym.make("LLMHashing-v0", vocab_size=50, prompts=[[1, 2, 3]], max_new_tokens=2)
    out = io.StringIO()
    assert play(env, episodes=1, seed=0, raw=True, stream=io.StringIO("999\n7\n8\n"), out=out) == [0.0]
    assert "rejected:" in out.getvalue()  # 999 is outside the vocabulary; the env asked again
    env = gym.make("LLMChat-v0", prompts=[{"prompt": "Hi!", "follow_ups": ["Tell me more."]}], max_turns=2)
    out = io.StringIO()
    play(env, episodes=1, seed=0, raw=False, stream=io.StringIO("Hello.\n.\nMore.\n.\n"), out=out)
    text = out.getvalue()
    assert text.index("Hi!") < text.index("Tell me more.") < text.index("=== return")


def test_console_script_plays_from_a_pipe():
    script = Path(sys.executable).with_name("gym-llm")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "gym_llm_adapters.cli"]
    out = subprocess.run([*command, "play", "LLMGSM8K-v0", "--source", "arithmetic"], input="#### 0\n.\n",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "What is" in out.stdout and "mean return" in out.stdout


@pytest.mark.slow
def test_eval_writes_rollouts_summary_and_histogram(tmp_path, capsys):
    out = tmp_path / "eval.jsonl"
    code = main(["eval", "LLMGSM8K-v0", *ARITHMETIC, "--model", "tiny", "--engine", "hf", "--n", "12",
                 "--batch", "5", "--max-new-tokens", "8", "--max-seq-len", "128", "--out", str(out), "--no-progress"])
    assert code == 0
    trajectories = read_rollouts(out)
    assert len(trajectories) == 12
    env = gym.make("LLMGSM8K-v0", source="arithmetic", max_operand=9)
    assert [t.task_id for t in trajectories] == list(range(12))  # the first n tasks, one episode each
    summary = json.loads((tmp_path / "eval.summary.json").read_text())
    assert summary["episodes"] == 12
    assert summary["reward_mean"] == pytest.approx(sum(t.reward for t in trajectories) / 12)
    assert (tmp_path / "eval.rewards.png").read_bytes()[:4] == b"\x89PNG"
    assert "pass rate" in capsys.readouterr().out
    shuffled = tmp_path / "shuffled.jsonl"
    assert main(["eval", "LLMGSM8K-v0", *ARITHMETIC, "--model", "tiny", "--engine", "hf", "--n", "6", "--shuffle",
                 "--seed", "3", "--max-new-tokens", "8", "--max-seq-len", "128", "--out", str(shuffled),
                 "--no-progress"]) == 0
    ids = [t.task_id for t in read_rollouts(shuffled)]
    assert len(set(ids)) == 6 and ids != list(range(6))  # a seeded sample of distinct tasks
    env.close()


@pytest.mark.slow
def test_ctrl_c_leaves_a_consistent_run_that_resumes(tmp_path):
    """A real SIGINT mid-run: the step finishes, a checkpoint matches the rollout file, --resume completes."""
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "gym_llm_adapters.cli", "train", "grpo", "--env", "LLMGSM8K-v0", *ARITHMETIC,
            "--model", "tiny", "--engine", "hf", "--steps", "400", "--num-tasks", "2", "--group-size", "4",
            "--max-new-tokens", "8", "--max-seq-len", "128", "--eval-every", "0", "--eval-episodes", "8",
            "--save-every", "1000", "--out", str(run), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "adapters"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    metrics = run / "metrics.jsonl"
    while time.monotonic() < deadline and proc.poll() is None:  # wait until a few steps are done
        if metrics.exists() and sum(1 for line in metrics.read_text().splitlines() if "train/loss" in line) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 130, output[-3000:]
    assert "interrupted after" in output
    from gym_llm_adapters.training.checkpoint import latest_checkpoint, load_trainer_state

    state = load_trainer_state(latest_checkpoint(run))
    assert 3 <= state.step < 400
    assert len(read_rollouts(run / "rollouts.jsonl")) == state.rollout_records == state.step * 8
    resumed = subprocess.run([*argv[:argv.index("--steps") + 1], str(state.step + 2),
                              *argv[argv.index("--steps") + 2:], "--resume"],
                             env=env, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert load_trainer_state(latest_checkpoint(run)).step == state.step + 2
    assert len(read_rollouts(run / "rollouts.jsonl")) == (state.step + 2) * 8


def test_config_file_gives_defaults_that_flags_override(tmp_path):
    from gym_llm_adapters.cli import parse_args
    from gym_llm_adapters.cli.train import config_from_args

    toml = tmp_path / "run.toml"
    toml.write_text('env = "LLMGSM8K-v0"\nsteps = 7\nlearning-rate = 0.001\n[env_args]\nmax_operand = 4\n')
    config = config_from_args(parse_args(["train", "grpo", "--config", str(toml), "--steps", "3", "--engine", "hf"]))
    assert (config.env_id, config.steps, config.learning_rate) == ("LLMGSM8K-v0", 3, 0.001)
    assert config.env_kwargs == {"max_operand": 4}
    toml.write_text("stepz = 7\n")
    from gym_llm_adapters.cli.errors import UsageError

    with pytest.raises(UsageError, match="unknown key 'stepz' \\(did you mean 'steps'\\?\\)"):  # exit 2 via main()
        parse_args(["train", "grpo", "--config", str(toml)])


def test_config_file_gives_the_lora_settings(tmp_path):
    from gym_llm_adapters.cli import parse_args
    from gym_llm_adapters.cli.train import config_from_args
    from gym_llm_adapters.lora import LoraSettings

    toml = tmp_path / "run.toml"
    toml.write_text('env = "LLMGSM8K-v0"\nlora_rank = 8\nlora-alpha = 32\nlora_target_modules = ["q_proj", "v_proj"]\n')
    config = config_from_args(parse_args(["train", "grpo", "--config", str(toml), "--engine", "hf"]))
    assert config.lora == LoraSettings(rank=8, alpha=32.0, target_modules=("q_proj", "v_proj"))
    toml.write_text('env = "LLMGSM8K-v0"\nlora_rank = 8\nlora_target_modules = "all-linear"\n')
    config = config_from_args(parse_args(["train", "grpo", "--config", str(toml), "--lora-dropout", "0.05"]))
    assert config.lora == LoraSettings(rank=8, dropout=0.05) and config.lora.scale_alpha == 16.0
    config = config_from_args(parse_args(["train", "grpo", "--env", "LLMGSM8K-v0", "--lora-rank", "4",
                                          "--lora-target-modules", "o_proj"]))
    assert config.lora_target_modules == ("o_proj",)
    assert config_from_args(parse_args(["train", "grpo", "--env", "LLMGSM8K-v0"])).lora is None


@pytest.mark.slow
def test_lora_run_from_the_command_line_then_view_replay_export_and_eval(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "grpo", "--env", "LLMGSM8K-v0", *ARITHMETIC, "--model", "tiny", "--engine", "hf",
                 "--lora-rank", "4", "--lora-target-modules", "q_proj", "v_proj", "--steps", "2", "--num-tasks", "2",
                 "--group-size", "4", "--branch-turn", "1", "--max-new-tokens", "8", "--max-seq-len", "128",
                 "--eval-every", "0", "--eval-episodes", "4", "--out", str(run), "--no-progress"]) == 0
    assert "done after 2 steps" in capsys.readouterr().out
    checkpoint = run / "checkpoints" / "step-000002"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert json.loads((checkpoint / "adapter_config.json").read_text())["target_modules"] in (
        ["q_proj", "v_proj"], ["v_proj", "q_proj"])
    assert main(["view", str(run)]) == 0 and (run / "report.html").is_file()
    assert main(["replay", str(run / "rollouts.jsonl"), "--no-progress"]) == 0
    assert "16 episodes (16 steps): 16 exact, 0 differ" in capsys.readouterr().out
    # a LoRA run is not a model for --model: the error says how to make one, and export makes it
    assert main(["eval", "LLMGSM8K-v0", *ARITHMETIC, "--model", str(run), "--engine", "hf", "--n", "2"]) == 2
    assert f"gym-llm export {run} --merge --out MERGED_DIR" in capsys.readouterr().err
    merged = tmp_path / "merged"
    assert main(["export", str(run), "--merge", "--out", str(merged)]) == 0
    out = tmp_path / "eval.jsonl"
    assert main(["eval", "LLMGSM8K-v0", *ARITHMETIC, "--model", str(merged), "--engine", "hf", "--n", "2",
                 "--max-new-tokens", "8", "--max-seq-len", "128", "--out", str(out), "--no-progress"]) == 0
    assert len(read_rollouts(out)) == 2
