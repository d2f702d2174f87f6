"""Durable rollout files: exact round trips, and what an interrupted write leaves behind."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gym_llm_adapters.rollout_io import RolloutWriter, read_rollouts
from gym_llm_adapters.types import StepRecord, Trajectory


def step(i: int) -> StepRecord:
    return StepRecord(env_index=i, task_id=3, group_id=1, round=2, turn=1, prompt_ids=np.array([1, 2], dtype=np.int64),
                      completion_ids=np.array([3], dtype=np.int64), logprobs=np.array([-0.1234567], dtype=np.float32),
                      reward=0.5, terminated=True, truncated=False, version=4, prompt_text="p ü", completion_text="c",
                      finish_reason="stop", info={"correct": True, "answer": "42", "score": 0.25})


def trajectory(i: int) -> Trajectory:
    return Trajectory(task_id=3, group_id=1, round=2, token_ids=np.array([1, 2, 3], dtype=np.int64),
                      policy_mask=np.array([0, 0, 1], dtype=np.int8), logprobs=np.array([0, 0, -0.1234567], dtype=np.float32),
                      prompt_length=2, rewards=[0.5], versions=[4], terminated=True, truncated=False, steps=[step(i)],
                      token_exact=True, env_index=i)


def same(a, b) -> bool:
    for name in b.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(y, np.ndarray):
            if x.dtype != y.dtype or x.tolist() != y.tolist():
                return False
        elif name == "steps":
            if len(x) != len(y) or not all(same(u, v) for u, v in zip(x, y)):
                return False
        elif x != y:
            return False
    return True


@pytest.fixture
def fsyncs(monkeypatch):
    """Every ``os.fsync`` as ``(path, size)`` of its fd at that moment (a folder: its sorted entries);
    each call then goes to the real ``fsync``."""
    calls = []
    real_fsync = os.fsync

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        calls.append((path, sorted(os.listdir(path)) if os.path.isdir(path) else os.fstat(fd).st_size))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


@pytest.mark.parametrize("name", ["r.jsonl", "r.parquet"])
def test_round_trip_of_steps_and_trajectories(tmp_path, name):
    records = [trajectory(0), step(1)]
    with RolloutWriter(tmp_path / name) as writer:
        writer.write(records[:1])
        writer.write(records[1:])
        writer.write([])
    assert writer.batches_written == 2 and writer.records_written == 2
    back = read_rollouts(tmp_path / name)
    assert len(back) == 2 and all(same(a, b) for a, b in zip(back, records))
    with RolloutWriter(tmp_path / name) as writer:  # reopening appends
        writer.write([step(2)])
    assert [r.env_index for r in read_rollouts(tmp_path / name)] == [0, 1, 2]


def test_jsonl_file_is_fsynced_once_per_batch_after_the_whole_batch(tmp_path, fsyncs):
    path = tmp_path / "r.jsonl"
    with RolloutWriter(path) as writer:
        assert len(fsyncs) == 1  # the new file's header line
        for i in range(3):
            writer.write([trajectory(i), step(i)])
            assert len(fsyncs) == i + 2  # one fsync per write()
        writer.write([])  # an empty batch: nothing to make durable
    assert [fsynced_path for fsynced_path, _ in fsyncs] == [str(path.resolve())] * 4
    # each fsync came when the file held exactly the complete lines of every batch so far: header, then per batch
    # its two records and its commit line
    data = path.read_bytes()
    lines_then = [(data[:size].count(b"\n"), data[size - 1:size]) for _, size in fsyncs]
    assert lines_then == [(1, b"\n"), (4, b"\n"), (7, b"\n"), (10, b"\n")]
    assert fsyncs[-1][1] == len(data)


def test_parquet_part_is_fsynced_before_its_rename_then_the_folder(tmp_path, fsyncs):
    folder = tmp_path / "r.parquet"
    with RolloutWriter(folder) as writer:
        writer.write([step(0)])
        writer.write([trajectory(1), step(2)])
    resolved = str(folder.resolve())
    part0, part1 = folder / "part-000000.parquet", folder / "part-000001.parquet"
    assert fsyncs == [
        (f"{resolved}/part-000000.parquet.tmp", part0.stat().st_size),  # the whole part, under its temporary name
        (resolved, ["part-000000.parquet"]),  # the folder, once the rename is in it
        (f"{resolved}/part-000001.parquet.tmp", part1.stat().st_size),
        (resolved, ["part-000000.parquet", "part-000001.parquet"]),
    ]


def test_a_partial_last_line_is_skipped_then_cut_before_appending(tmp_path, caplog):
    path = tmp_path / "r.jsonl"
    with RolloutWriter(path) as writer:
        writer.write([step(0)])
    with open(path, "ab") as f:
        f.write(b'{"kind": "step", "env_ind')  # a crash mid-write
    assert [r.env_index for r in read_rollouts(path)] == [0]
    assert "partial record" in caplog.text
    with RolloutWriter(path) as writer:
        writer.write([step(1)])
    assert [r.env_index for r in read_rollouts(path)] == [0, 1]


def test_bad_paths_and_records(tmp_path):
    with pytest.raises(ValueError, match="Cannot tell the rollout format"):
        RolloutWriter(tmp_path / "r.txt")
    with RolloutWriter(tmp_path / "r.jsonl") as writer, pytest.raises(TypeError, match="Only Trajectory and StepRecord"):
        writer.write([{"kind": "step"}])


def test_partial_line_scan_crosses_chunks(tmp_path):
    from gym_llm_adapters.rollout_io import _drop_partial_line

    path = tmp_path / "r.jsonl"
    path.write_bytes(b"aaaa\nbbbbbbbbbb\ncccccccc")
    _drop_partial_line(path, chunk_bytes=3)
    assert path.read_bytes() == b"aaaa\nbbbbbbbbbb\n"
    path.write_bytes(b"no newline at all")
    _drop_partial_line(path, chunk_bytes=4)
    assert path.read_bytes() == b""
