"""TorchRL 0.14.1 baselines for ``bench/env_overhead.py``: the same per-sample work with ``ChatEnv``/``GSM8KEnv``.

One gym-llm vector step (append each reply, score, end the episode, start the next one) corresponds in
TorchRL to: ``reset`` (render/pull the next prompts) + building the action the policy wrapper would
build (``("text", "full")`` = prompt + response, or the History extended by the assistant message) +
``step`` (for GSM8K: ``StepCounter`` + ``GSM8KRewardParser``). ``GSM8KEnv`` runs in its default history
mode — in text mode its reward parser matches the empty ``<answer></answer>`` tags of its own system
prompt and always returns 0. Its grading is a regex exact match: less work than gym-llm's checker.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import torch  # noqa: E402
from tensordict import TensorDict, lazy_stack, set_list_to_stack  # noqa: E402
from torchrl.data.llm import History  # noqa: E402
from torchrl.envs.llm import ChatEnv, GSM8KEnv  # noqa: E402

set_list_to_stack(True).set()
torch.set_num_threads(1)


def _local_gsm8k(data_files: str) -> str:
    """A folder ``datasets.load_dataset(folder, "main")`` reads offline (GSM8KEnv always asks for config main)."""
    folder = Path(tempfile.mkdtemp(prefix="gsm8k_torchrl_"))
    (folder / "train.jsonl").symlink_to(Path(data_files).resolve())  # GSM8KEnv reads the train split
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: train.jsonl\n---\n"
    )
    return str(folder)


def _tokenizer():
    from gym_llm_adapters.models.tokenizers import tiny_tokenizer

    return tiny_tokenizer()


def make_torchrl_step(env_id: str, batch_size: int, data_files: str, response: str,
                      input_mode: str = "text") -> Callable[[], None]:
    """A zero-argument callable doing one batch of TorchRL work equivalent to one gym-llm vector step.

    ``input_mode``: for ChatEnv, ``"text"`` (the policy passes strings) or ``"history"`` (ChatEnv's
    default: structured messages, like gym-llm's envs keep). GSM8KEnv always runs in history mode.
    """
    tokenizer = _tokenizer()
    if env_id == "LLMGSM8K-v0":
        env = GSM8KEnv(dataset=_local_gsm8k(data_files), num_envs=batch_size, tokenizer=tokenizer,
                       input_mode="history", shuffle=False, seed=0)
        replies = [response.format(answer=i) for i in range(batch_size)]

        def step() -> None:
            td = env.reset()
            messages = lazy_stack([History(role="assistant", content=r) for r in replies]).unsqueeze(-1)
            td["history"].full = td["history"].prompt.extend(messages, inplace=False, dim=-1)
            out = env.step(td)
            assert out["next", "done"].all()

        return step
    questions = [json.loads(line)["question"] for line in Path(data_files).read_text().splitlines()[:batch_size]]
    env = ChatEnv(input_mode=input_mode, batch_size=(batch_size,), tokenizer=tokenizer)
    query = TensorDict({"query": questions}, batch_size=(batch_size,))
    if input_mode == "history":
        replies = [response.format(answer=i) for i in range(batch_size)]

        def history_step() -> None:
            td = env.reset(query.clone())
            messages = lazy_stack([History(role="assistant", content=r) for r in replies]).unsqueeze(-1)
            td["history"].full = td["history"].prompt.extend(messages, inplace=False, dim=-1)
            env.step(td)

        return history_step
    replies = [response.format(answer=i) + tokenizer.eos_token for i in range(batch_size)]

    def step() -> None:
        td = env.reset(query.clone())
        td["text", "response"] = replies
        td["text", "full"] = [p + r for p, r in zip(td["text", "prompt"], replies)]
        env.step(td)

    return step
