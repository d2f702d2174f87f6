"""Data-parallel training under torchrun (2 gloo ranks on this CPU): the replicas stay identical, and after K steps
their weights are those one process reaches on the same global batches (each step's rollouts, as rank 0 wrote them,
fed to a single-process Trainer from the same start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import gym_llm  # noqa: F401
from gym_llm_adapters.rollout_io import read_rollouts
from gym_llm_adapters.training import Trainer
from gym_llm_adapters.training.distributed import DataParallelError, check_data_parallel
from tests.adapters.training.dp_run import dp_config

ROOT = Path(__file__).resolve().parents[3]
TORCHRUN = Path(sys.executable).parent / "torchrun"


def _torchrun(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([str(TORCHRUN), "--nproc-per-node", "2", "--master-port", str(_free_port()), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _check_against_one_process(tmp_path: Path, *, steps: int, aggregation: str, lora: bool = False) -> None:
    """The ranks' weights equal each other's bitwise, and one process's on the same global batches within the stated
    tolerance; the run folder has one writer's files."""
    ranks = [torch.load(tmp_path / f"rank-{r}.pt") for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2] and [r["steps"] for r in ranks] == [steps, steps]
    assert ranks[0]["weights"] and ranks[0]["weights"].keys() == ranks[1]["weights"].keys()
    for name, value in ranks[0]["weights"].items():  # one all-reduced gradient, one AdamW step: bitwise equal
        assert torch.equal(value, ranks[1]["weights"][name]), name
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in grpo] == list(range(1, steps + 1))  # one writer: each step logged once
    # each rank's engine samples with the weights the trainer has (after step 1: the pushed ones, gathered whole under
    # FSDP2): the trainer's log-probs of the sampled tokens equal the engine's (the max over both ranks)
    assert all(r["train/engine_log_ratio_abs_max"] < 1e-3 for r in grpo), [r["train/engine_log_ratio_abs_max"] for r in grpo]
    records = read_rollouts(run / "rollouts.jsonl")
    per_step = 4 * 4  # num_tasks x group_size: the global batch, both ranks' halves
    assert len(records) == steps * per_step
    for s in range(steps):
        batch = records[s * per_step:(s + 1) * per_step]
        assert sorted({t.group_id for t in batch}) == [0, 1, 2, 3]  # rank 1's groups numbered after rank 0's
        assert all(sum(t.group_id == g for t in batch) == 4 for g in range(4))  # whole groups, none split or lost
        assert grpo[s]["train/reward_mean"] == pytest.approx(np.mean([t.reward for t in batch]))  # global metrics
    assert any(np.std([t.reward for t in records[:per_step] if t.group_id == g]) > 0 for g in range(4))
    assert Path(ranks[0]["checkpoint"]).is_dir()

    # one process, from the same start, on the same global batches (rank 0's file, in rank order)
    single = dp_config(tmp_path / "single", steps=steps, aggregation=aggregation, lora=lora)
    with Trainer(single) as trainer:
        trainer._start_phase("grpo")
        initial = {k: v.detach().clone() for k, v in trainer.policy.named_parameters() if v.requires_grad}
        batches = iter([records[s * per_step:(s + 1) * per_step] for s in range(steps)])
        trainer.collector.next_batch = lambda: next(batches)
        for _ in range(steps):
            metrics = trainer._grpo_step()
            trainer.state.step += 1
        after = {k: v.detach().clone() for k, v in trainer.policy.named_parameters() if v.requires_grad}
    assert after.keys() == ranks[0]["weights"].keys()
    assert metrics["train/loss"] == pytest.approx(grpo[-1]["train/loss"], rel=1e-4, abs=1e-6)
    assert metrics["train/kl"] == pytest.approx(grpo[-1]["train/kl"], rel=1e-4, abs=1e-7)
    assert metrics["train/grad_norm"] == pytest.approx(grpo[-1]["train/grad_norm"], rel=1e-5)
    # The stated tolerance. AdamW moves each element by about lr per step whatever the size of its gradient, so an
    # element whose gradient is near 0 (below Adam's eps: rounding noise decides its direction) moves differently under
    # two summation orders (8 + 8 rows all-reduced vs 16 rows). Such elements are rare: all but 0.1% of the weights
    # agree within 1e-6, and none differs by more than one step's size (lr). Measured here: max 1.5% of lr, 0.01-0.05%
    # of elements over 1e-6. A wrong normalisation (a rank's mean instead of the global one) moves every element.
    lr = single.learning_rate
    diffs = torch.cat([(ranks[0]["weights"][k] - v).abs().reshape(-1) for k, v in after.items()])
    assert float(diffs.max()) <= lr, float(diffs.max())
    assert float((diffs > 1e-6).float().mean()) <= 1e-3, float((diffs > 1e-6).float().mean())
    # the weights did move: the comparison is not of two untouched models
    assert max(float((after[k] - initial[k]).abs().max()) for k in after) > 1e-3


@pytest.mark.slow
def test_two_lora_ranks_reach_the_weights_of_one_process_on_the_same_global_batches(tmp_path):
    """A LoRA adapter's gradients all-reduced, under the sequence mean (each rank's rows weighted by its share)."""
    done = _torchrun("-m", "tests.adapters.training.dp_run", str(tmp_path), "2", "sequence_mean", "lora")
    assert done.returncode == 0, done.stderr[-4000:]
    _check_against_one_process(tmp_path, steps=2, aggregation="sequence_mean", lora=True)


@pytest.mark.slow
def test_two_fsdp2_ranks_push_the_gathered_weights_and_reach_one_process(tmp_path):
    """Two FSDP2 steps in one process, sequence mean: step 2 samples from each rank's engine after step 1's push of the
    gathered weights (the engine/trainer log-prob check in _check_against_one_process fails if that push is skipped),
    and the weights equal one process's on the same global batches."""
    done = _torchrun("-m", "tests.adapters.training.dp_run", str(tmp_path), "2", "sequence_mean", "fsdp")
    assert done.returncode == 0, done.stderr[-4000:]
    assert torch.load(tmp_path / "rank-0.pt")["parameter_type"] == "DTensor"
    _check_against_one_process(tmp_path, steps=2, aggregation="sequence_mean")


@pytest.mark.slow
def test_a_run_stopped_under_ddp_and_resumed_under_fsdp2_reaches_the_weights_of_one_process(tmp_path):
    """Full fine-tuning, token mean: step 1 under DDP (whole replicas), stopped (checkpoint: weights, AdamW state,
    schedule), and step 2 resumed by both ranks under FSDP2 (each holds half of every weight and moment: the
    checkpoint's whole moments cut to shards); the two steps' global batches, replayed by one process without a stop,
    give the same weights. A checkpoint does not depend on the sharding that wrote it."""
    first = _torchrun("-m", "tests.adapters.training.dp_run", str(tmp_path), "1", "token_mean", "ddp")
    assert first.returncode == 0, first.stderr[-4000:]
    assert torch.load(tmp_path / "rank-0.pt")["strategy"] == "ddp"
    resumed = _torchrun("-m", "tests.adapters.training.dp_run", str(tmp_path), "2", "token_mean", "resume")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    saved = [torch.load(tmp_path / f"rank-{r}.pt") for r in range(2)]
    assert [(r["strategy"], r["parameter_type"]) for r in saved] == [("fsdp", "DTensor")] * 2  # auto: FSDP2
    _check_against_one_process(tmp_path, steps=2, aggregation="token_mean")
    step2 = Path(saved[0]["checkpoint"])  # step 2, written from the shards: whole, one process loads it
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(step2)
    moments = torch.load(step2 / "optimizer.pt")["optimizer"]["state"]  # AdamW's, keyed by parameter index
    params = list(loaded.parameters())
    assert len(moments) == len(params) and all(moments[i]["exp_avg"].shape == p.shape for i, p in enumerate(params))
    loaded = dict(loaded.named_parameters())
    for name, value in saved[0]["weights"].items():
        assert torch.equal(loaded[name].detach(), value), name


@pytest.mark.slow
def test_the_cli_under_torchrun_trains_with_one_writer_and_refuses_what_the_ranks_cannot_run(tmp_path):
    """docs/cli.md's command, as written (with --out in tmp_path and no progress bar)."""
    import re
    import shlex

    block = next(b for b in re.findall(r"```bash\n(.*?)```", (ROOT / "docs" / "cli.md").read_text(), flags=re.S)
                 if b.startswith("torchrun --nproc-per-node 2 -m gym_llm_adapters.cli train"))
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:3] == ["torchrun", "--nproc-per-node", "2"] and argv[-2:] == ["--out", "runs/dp"]
    out = tmp_path / "run"
    args = [*argv[3:-1], str(out)]
    args.insert(-2, "--no-progress")
    done = _torchrun(*args)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("done after 2 steps") == 1, done.stdout  # rank 0 alone says what the run did
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r or "train/reward_failed" in r] == [1, 2]
    assert len(read_rollouts(out / "rollouts.jsonl")) == 2 * 2 * 2
    said = done.stdout + done.stderr + "".join(p.read_text() for p in out.glob("train*.log"))
    assert "FSDP2: each rank holds 1/2 of the weights" in said  # a full fine-tune: sharded by default

    args[args.index("--num-tasks") + 1] = "3"
    args[-1] = str(tmp_path / "refused")
    refused = _torchrun(*args, timeout=120)
    # torchrun exits 1 when a rank fails; the ranks themselves exit 2 (a usage error), before any model loads
    assert refused.returncode != 0 and "exitcode: 2" in refused.stderr, (refused.returncode, refused.stderr[-3000:])
    assert "--num-tasks divisible by 2" in refused.stderr and "Use --num-tasks 2 or 4" in refused.stderr
    assert not (tmp_path / "refused").exists()  # nothing started


class _Config:
    def __init__(self, **kw):
        self.__dict__.update(dict(num_tasks=4, algorithm="grpo", sft_warmup_steps=0, sft_batch_size=8, device="cpu"))
        self.__dict__.update(kw)


@pytest.mark.parametrize("kw, world, local, expected", [
    (dict(num_tasks=3), 2, 2, "--num-tasks divisible by 2"),
    (dict(sft_warmup_steps=5, sft_batch_size=3), 2, 2, "--sft-batch-size divisible by 2"),
    (dict(device="mps"), 2, 2, "--device mps has neither backend"),
    (dict(device="cuda:1"), 2, 2, None),  # refused either way: no GPU here, or one GPU named for every rank
])
def test_set_ups_the_ranks_cannot_run_are_refused_with_the_fix(kw, world, local, expected):
    with pytest.raises(DataParallelError) as e:
        check_data_parallel(_Config(**kw), world=world, local_world=local)
    if expected is not None:
        assert expected in str(e.value)
    check_data_parallel(_Config(), world=2, local_world=2)  # the same with shapes that divide: accepted
