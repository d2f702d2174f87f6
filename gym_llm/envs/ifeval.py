"""``LLMIFEval-v0``: instruction following, scored by the official IFEval checks."""

from __future__ import annotations

import os
import re
from typing import Any, Literal, Mapping, Sequence

from gym_llm.core.chat import ChatConfig, ChatEpisode, Response
from gym_llm.core.env import LLMEnv
from gym_llm.envs.common import chat_env_parts
from gym_llm.core.episode import EnvParts
from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task, TaskOrder
from gym_llm.tasks.loading import load_hub_dataset, records_from_source

__all__ = [
    "IFEvalHandler", "LLMIFEvalEnv", "LLMIFEvalVectorEnv", "RewardMode", "build_ifeval", "default_scoring_workers",
    "load_ifeval_tasks",
]

RewardMode = Literal["fraction", "all"]
IFEvalSource = Literal["file", "hub"]
_ROW_KEYS = ("prompt", "instruction_id_list", "kwargs")


def _task_from_row(index: int, row: Any) -> Task:
    if not isinstance(row, Mapping) or any(k not in row for k in _ROW_KEYS):
        keys = sorted(row) if isinstance(row, Mapping) else type(row).__name__
        raise ValueError(
            f"IFEval row {index} needs {list(_ROW_KEYS)} (and optionally 'key'), got {keys}; IFEval's "
            "input_data.jsonl has one {'key', 'prompt', 'instruction_id_list', 'kwargs'} object per line."
        )
    ids, kwargs = list(row["instruction_id_list"]), list(row["kwargs"])
    if len(ids) != len(kwargs):
        raise ValueError(f"IFEval row {index}: {len(ids)} instruction ids but {len(kwargs)} kwargs dicts.")
    # Drop the None-valued keys of the hub rows (the scorer ignores them anyway): smaller tasks, same results.
    kwargs = [{k: v for k, v in (kw or {}).items() if v is not None} for kw in kwargs]
    data = {"key": row.get("key", index), "prompt": str(row["prompt"]), "instruction_id_list": ids, "kwargs": kwargs}
    return Task(index, (Message("user", data["prompt"]),), None, data)


def load_ifeval_tasks(
    *,
    data_files: Any = None,
    tasks: Any = None,
    source: IFEvalSource | None = None,
    dataset_name: str = "google/IFEval",
    split: str = "train",
) -> list[Task]:
    """IFEval tasks from the first source given (see :class:`LLMIFEvalEnv`); every row is checked
    against the official checkers (known instruction ids, complete kwargs) before any episode runs.

    Raises:
        RuntimeError: no source is reachable; the message lists the options.
        ValueError: a malformed row (names the row and what is wrong).
    """
    def hub() -> list[Any]:
        try:
            return load_hub_dataset(dataset_name, None, split)
        except Exception as e:
            raise RuntimeError(
                f"Could not load IFEval from the Hugging Face hub ({dataset_name!r}, split {split!r}): "
                f"{type(e).__name__}: {e}\nChoose a source:\n"
                "  1. a local file: data_files='path/to/input_data.jsonl' (google-research's IFEval file)\n"
                "  2. rows:         tasks=[{'prompt', 'instruction_id_list', 'kwargs'}, ...] or a datasets.Dataset\n"
                "  3. the hub:      pip install 'gym-llm[datasets]' on a machine that reaches huggingface.co"
            ) from e

    records = records_from_source(tasks=tasks, data_files=data_files, source=source, split=split, default="hub",
                                  file_hint="IFEval's input_data.jsonl", sources={"hub": hub})
    out = [_task_from_row(i, row) for i, row in enumerate(records)]
    _validate_rows(out)
    return out


def _validate_rows(tasks: list[Task]) -> None:
    from gym_llm.rewards.ifeval import evaluate

    for task in tasks:
        try:  # builds every checker: unknown ids and bad kwargs fail here, not mid-training
            evaluate("", task.data["instruction_id_list"], task.data["kwargs"], prompt=task.data["prompt"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"IFEval row {task.task_id} (key {task.data['key']}): {e}") from e


def _strip_thinking(text: str) -> str:
    """The reply after the last ``</think>`` (reasoning models); unchanged when there is none."""
    at = text.rfind("</think>")
    return text[at + len("</think>"):].lstrip() if at >= 0 else text


_WORD_RE = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")


def _words(value: Any) -> list[str]:
    """Lower-cased words of a value (nested lists/dicts of instruction arguments included)."""
    if isinstance(value, str):
        return [w.lower() for w in _WORD_RE.findall(value)]
    if isinstance(value, Mapping):
        return [w for v in value.values() for w in _words(v)]
    if isinstance(value, (list, tuple)):
        return [w for v in value for w in _words(v)]
    return []


QUALITY_MIN_WORDS = 15
QUALITY_MIN_DISTINCT = 0.3
QUALITY_MIN_OWN = 0.5


def quality_problem(reply: str, prompt: str, kwargs: Any) -> str | None:
    """Why a reply is content-free by the optional quality guard of :class:`LLMIFEvalEnv`, or ``None``.

    IFEval's official checks look at form only: a reply made of the instruction's own arguments (the keywords to
    include, the phrase to end with, a repeated placeholder) meets most of them while answering nothing. The guard
    asks for a minimal answer: at least :data:`QUALITY_MIN_WORDS` words; at least :data:`QUALITY_MIN_DISTINCT` of
    them distinct (not one word repeated); at least :data:`QUALITY_MIN_OWN` of them not taken from the
    instruction's arguments; and at least one content word (4+ letters) of the prompt that is not an argument.
    """
    words = _words(reply)
    if len(words) < QUALITY_MIN_WORDS:
        return f"fewer than {QUALITY_MIN_WORDS} words ({len(words)})"
    if len(set(words)) < QUALITY_MIN_DISTINCT * len(words):
        return f"repetitive ({len(set(words))} distinct words of {len(words)})"
    argument_words = set(_words(kwargs))
    own = sum(1 for w in words if w not in argument_words)
    if own < QUALITY_MIN_OWN * len(words):
        return f"mostly the instruction's own arguments ({len(words) - own} of {len(words)} words)"
    topic = {w for w in _words(prompt) if len(w) >= 4} - argument_words
    if topic and not topic & set(words):
        return "no content word of the prompt"
    return None


class IFEvalHandler:
    """Scores the single assistant turn with the official IFEval checks (see :class:`LLMIFEvalEnv`)."""

    def __init__(self, reward_mode: RewardMode = "fraction", loose: bool = False, strip_thinking: bool = False,
                 scoring_workers: int = 0, quality_guard: bool = False):
        from gym_llm.rewards.ifeval_pool import IFEvalScorer

        if reward_mode not in ("fraction", "all"):
            raise ValueError(
                f"reward_mode must be 'fraction' (share of instructions followed) or 'all' (1 only if every "
                f"instruction is followed), got {reward_mode!r}."
            )
        self.reward_mode = reward_mode
        self.loose = bool(loose)
        self.strip_thinking = bool(strip_thinking)
        self.quality_guard = bool(quality_guard)
        self.scorer = IFEvalScorer(scoring_workers)

    def reward(self, result: Any) -> float:
        """The reward of an :class:`~gym_llm.rewards.ifeval.IFEvalResult` under this handler's settings."""
        followed = result.loose if self.loose else result.strict
        if self.reward_mode == "all":
            return float(all(followed))
        return sum(followed) / len(followed) if followed else 1.0

    def respond(self, episode: ChatEpisode, reply: Message) -> Response:
        data = episode.task.data
        text = _strip_thinking(reply.content) if self.strip_thinking else reply.content
        try:
            result = self.scorer.evaluate(text, data["instruction_id_list"], data["kwargs"], data["prompt"])
        except Exception as e:  # past the scoring deadline, or the worker died: fail closed, the sub-env moves on
            return Response(0.0, True, (), {"reward_error": f"{type(e).__name__}: {e}",
                                            "num_instructions": len(data["instruction_id_list"])})
        reward = self.reward(result)
        info = {
            "prompt_strict": result.strict_all,
            "prompt_loose": result.loose_all,
            "instruction_strict_fraction": result.strict_fraction,
            "instruction_loose_fraction": result.loose_fraction,
            "num_instructions": len(result.instruction_ids),
            "num_strict_followed": sum(result.strict),
            "num_loose_followed": sum(result.loose),
            "instruction_results": result.to_json(),
            "key": int(data["key"]) if isinstance(data["key"], int) else str(data["key"]),
        }
        if self.quality_guard:  # off by default: the official score stays exact
            problem = quality_problem(text, data["prompt"], data["kwargs"])
            info["quality_problem"] = problem or ""
            if problem is not None:
                reward = 0.0
        return Response(reward, True, (), info)


def build_ifeval(
    *,
    data_files: Any = None,
    tasks: Any = None,
    source: IFEvalSource | None = None,
    dataset_name: str = "google/IFEval",
    split: str = "train",
    reward_mode: RewardMode = "fraction",
    loose: bool = False,
    strip_thinking: bool = False,
    scoring_workers: int | None = None,
    num_envs: int | None = None,
    quality_guard: bool = False,
    task_order: TaskOrder = "shuffle",
    tools: Sequence[Any] | None = None,
    max_tool_calls_per_turn: int = 8,
    **chat_kwargs: Any,
) -> EnvParts:
    from gym_llm.core.extras import require

    require("ifeval", "if_verifiable", "langdetect", "nltk", "punkt", needed_by="LLMIFEval-v0")
    task_list = load_ifeval_tasks(data_files=data_files, tasks=tasks, source=source, dataset_name=dataset_name,
                                  split=split)
    if scoring_workers is None:  # the scalar env scores inline; a vector env in processes (default_scoring_workers)
        scoring_workers = default_scoring_workers(num_envs) if isinstance(num_envs, int) else 0
    handler = IFEvalHandler(reward_mode, loose, strip_thinking, scoring_workers, quality_guard)
    parts = chat_env_parts(task_list, handler, ChatConfig(**chat_kwargs), task_order=task_order, tools=tools,
                           max_tool_calls_per_turn=max_tool_calls_per_turn, parallel_respond=scoring_workers > 0,
                           on_close=handler.scorer.close, extra={"scorer": handler.scorer})
    parts.respond_workers = 2 * scoring_workers  # two replies in flight per process: a worker never waits
    return parts


class LLMIFEvalEnv(LLMEnv, build=build_ifeval):
    """Instruction following (IFEval), scored exactly like the official evaluation.

    ## Description
    One IFEval prompt per episode ("Write a 300+ word summary ... Do not use any commas ..."); the
    policy answers once. The reply is checked against each of the prompt's 1-3 verifiable
    instructions (25 types: word/sentence/paragraph counts, keywords, JSON, bullet lists, case,
    language, ...) by :func:`gym_llm.rewards.ifeval.evaluate` — the official checkers, run the way the
    official ``evaluation_lib`` runs them, so strict and loose results equal the official evaluation
    prompt by prompt. ``langdetect`` is seeded and NLTK's ``punkt_tab`` is built offline.

    ## Action Space
    Text mode: ``UnicodeText(max_action_chars)``; tokens mode: padded ids + mask (see ``LLMChat-v0``).

    ## Observation Space
    The prompt rendered with the chat template (text), or its token ids (tokens mode).

    ## Rewards
    ``followed`` = per-instruction booleans, strict (default) or loose (``loose=True``):

    | ``reward_mode`` | reward |
    |---|---|
    | ``"fraction"`` (default) | ``sum(followed) / len(followed)`` (instruction level) |
    | ``"all"`` | ``1.0`` if every instruction is followed, else ``0.0`` (prompt level) |

    ``info`` (scalars and strings, so vector envs batch them): ``prompt_strict``, ``prompt_loose``,
    ``instruction_strict_fraction``, ``instruction_loose_fraction``, ``num_instructions``,
    ``num_strict_followed``, ``num_loose_followed``, ``key`` (the row's key) and
    ``instruction_results`` — a JSON list ``[{"id", "strict", "loose"}, ...]``.

    ## Starting State
    The next prompt of the task stream (seeded shuffle; ``options={"task_id": i}`` forces one).

    ## Episode End
    Terminated after the one assistant turn. Truncated only if the reply overflows the observation
    space (text) or ``max_seq_len`` (tokens).

    ## Arguments
    * ``data_files``: IFEval's ``input_data.jsonl`` (or a list of files); ``tasks``: rows
      (``prompt``, ``instruction_id_list``, ``kwargs``, optional ``key``) as any iterable or a
      ``datasets.Dataset``; else ``source="hub"``/None loads ``dataset_name`` (``google/IFEval``,
      ``split="train"``) through ``datasets``. Rows are validated when the env is made.
    * ``reward_mode`` (``"fraction"``/``"all"``), ``loose`` (bool), ``strip_thinking`` (score only the
      text after ``</think>``; default False, as the official evaluation), ``scoring_workers``
      (processes for scoring; 0 scores in the stepping thread), ``quality_guard`` (default False: reward 0 for a
      content-free reply — see :func:`quality_problem`; info ``quality_problem`` says why), ``task_order``, and every
      :class:`~gym_llm.core.chat.ChatConfig` field (``mode``, ``tokenizer``, ``system_prompt``, ...).

    ## Vectorized environment
    :class:`LLMIFEvalVectorEnv`: ``gym.make_vec("LLMIFEval-v0", num_envs=8, group_size=4,
    data_files=..., scoring_workers=4)`` scores the 8 replies in 4 processes at once (default: half the
    CPUs, see :func:`default_scoring_workers`). Worker processes are spawned, so scripts that make
    the env need the usual ``if __name__ == "__main__":`` guard.

    ## Version History
    * v0: initial version.
    """



def default_scoring_workers(num_envs: int) -> int:
    """Processes a vector env scores in by default: half the CPUs (the rest is left to the engine and
    the env), at most ``num_envs`` and 8; 0 (inline) when that is under 2 — one process only adds IPC."""
    workers = min(num_envs, (os.cpu_count() or 1) // 2, 8)
    return workers if workers >= 2 else 0


LLMIFEvalVectorEnv = LLMIFEvalEnv.Vector
"""Native vector env of :class:`LLMIFEvalEnv`. With ``scoring_workers=P > 0`` the sub-envs' replies are scored in
``P`` processes at once (the respond threads that hand them over default to ``2 P``); with 0 they are scored one after
another in the stepping thread (threads alone do not help: the checkers hold the GIL). Default:
:func:`default_scoring_workers` of ``num_envs``."""
