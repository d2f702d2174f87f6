"""``LLMGSM8K-v0``: grade-school math word problems, scored on the final answer."""

from __future__ import annotations

from typing import Any, Literal, Sequence

from gym_llm.core.env import LLMEnv
from gym_llm.core.episode import EnvParts
from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task, TaskOrder
from gym_llm.envs.common import take_arguments, with_arguments_of
from gym_llm.envs.scored import ScoredReplyHandler, scored_reply_parts
from gym_llm.rewards.hooks import DEFAULT_HOOK_TIMEOUT_S
from gym_llm.rewards.gsm8k import grade, reference_answer
from gym_llm.tasks.loading import load_hub_dataset, records_from_source

__all__ = ["LLMGSM8KEnv", "LLMGSM8KVectorEnv", "GSM8KHandler", "load_gsm8k_tasks", "generate_arithmetic",
           "DEFAULT_GSM8K_PROMPT", "grade_gsm8k_reply"]

DEFAULT_GSM8K_PROMPT = (
    "{question}\n\nSolve the problem step by step. On the last line, write the final answer as "
    "'#### <number>'."
)
"""The default prompt; ``{question}`` is replaced by the problem text."""

GSM8KSource = Literal["file", "hub", "gsm_symbolic", "arithmetic"]
ArithmeticPairs = Literal["all", "train", "test"]
ARITHMETIC_TEST_FRACTION = 0.2


def load_gsm8k_tasks(
    *,
    data_files: Any = None,
    tasks: Any = None,
    source: GSM8KSource | None = None,
    dataset_name: str = "openai/gsm8k",
    dataset_config: str = "main",
    split: str = "test",
    num_generated: int = 1_000,
    generator_seed: int = 0,
    max_operand: int = 9,
    operand_pairs: ArithmeticPairs = "all",
    prompt_template: str = DEFAULT_GSM8K_PROMPT,
) -> list[Task]:
    """GSM8K tasks from the first source given (see :class:`LLMGSM8KEnv` for the arguments).

    Raises:
        RuntimeError: no source is reachable; the message lists the others (source="arithmetic" works offline).
    """
    if "{question}" not in prompt_template:
        raise ValueError(f"prompt_template must contain '{{question}}', got {prompt_template!r}.")
    def hub() -> list[Any]:
        try:
            return load_hub_dataset(dataset_name, dataset_config, split)
        except Exception as e:
            raise RuntimeError(
                f"Could not load GSM8K from the Hugging Face hub ({dataset_name!r}, config {dataset_config!r}, "
                f"split {split!r}): {type(e).__name__}: {e}\nChoose another source:\n"
                "  1. generated:     source='arithmetic'  (offline, no extra: 'What is a + b?' in GSM8K's format)\n"
                "  2. a local file:  data_files='path/to/gsm8k/test.jsonl'  (GSM8K's own jsonl, 'question'/'answer')\n"
                "  3. generated:     source='gsm_symbolic'  (offline: pip install 'gym-llm[gsm_symbolic]')\n"
                "  4. the hub:       pip install 'gym-llm[datasets]' on a machine that reaches huggingface.co"
            ) from e

    records = records_from_source(
        tasks=tasks, data_files=data_files, source=source, split=split, default="hub",
        file_hint="a GSM8K .jsonl path with 'question' and 'answer'",
        sources={"hub": hub, "gsm_symbolic": lambda: _generate_gsm_symbolic(num_generated, generator_seed),
                 "arithmetic": lambda: generate_arithmetic(num_generated, generator_seed, max_operand=max_operand,
                                                           pairs=operand_pairs)})
    out = []
    for index, record in enumerate(records):
        if not isinstance(record, dict) or "question" not in record or "answer" not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(
                f"GSM8K record {index} needs 'question' and 'answer' fields, got {keys}; "
                "GSM8K's jsonl has one {'question': ..., 'answer': '... #### 42'} per line."
            )
        prompt = prompt_template.format(question=record["question"])
        out.append(Task(index, (Message("user", prompt),), reference_answer(record["answer"]), record))
    return out


def _generate_gsm_symbolic(size: int, seed: int) -> list[dict[str, Any]]:
    try:
        import reasoning_gym
    except ImportError as e:
        raise ImportError(
            "source='gsm_symbolic' generates problems with reasoning-gym: pip install 'gym-llm[gsm_symbolic]'."
        ) from e
    dataset = reasoning_gym.create_dataset("gsm_symbolic", size=int(size), seed=int(seed))
    return [{"question": row["question"], "answer": str(row["answer"])} for row in dataset]


def arithmetic_pairs(max_operand: int, part: ArithmeticPairs = "all") -> list[tuple[int, int]]:
    """The operand pairs ``(a, b)``, ``0 <= a, b <= max_operand``, of one part of a fixed train/test partition.

    ``"test"`` is a fixed 20% of all pairs (a permutation seeded by ``max_operand`` alone, so it does not depend on
    any generator seed), ``"train"`` the other 80%, ``"all"`` every pair. Problems drawn from the two parts never
    share a question: evaluate on ``"test"`` what was trained on ``"train"`` and no eval problem was seen.

    >>> train, test = arithmetic_pairs(9, "train"), arithmetic_pairs(9, "test")
    >>> len(train), len(test), set(train) & set(test), sorted(train + test) == arithmetic_pairs(9)
    (80, 20, set(), True)
    """
    import numpy as np

    if isinstance(max_operand, bool) or not isinstance(max_operand, int) or max_operand < 1:
        raise ValueError(f"max_operand must be an int >= 1, got {max_operand!r}.")
    if part not in ("all", "train", "test"):
        raise ValueError(f"operand_pairs must be 'all', 'train' or 'test', got {part!r}.")
    side = max_operand + 1
    if part == "all":
        return [(a, b) for a in range(side) for b in range(side)]
    order = np.random.default_rng([0x5EED, max_operand]).permutation(side * side)
    cut = round(ARITHMETIC_TEST_FRACTION * side * side)
    chosen = np.sort(order[:cut] if part == "test" else order[cut:])
    return [(int(i) // side, int(i) % side) for i in chosen]


def generate_arithmetic(size: int, seed: int, *, max_operand: int = 9,
                        pairs: ArithmeticPairs = "all") -> list[dict[str, Any]]:
    """``size`` addition problems ``a + b`` with ``0 <= a, b <= max_operand``, in GSM8K's record format.

    The ``answer`` field is a worked solution like GSM8K's (``"3 + 4 = 7\\n#### 7"``), so it doubles as
    a supervised target. Made for smoke tests and the CPU training demo: a tiny model learns it in
    minutes. Deterministic in ``(size, seed, max_operand, pairs)``; needs no dependency. ``pairs`` draws the
    operands from every pair (``"all"``, uniform operands) or from one part of the fixed train/test partition of
    :func:`arithmetic_pairs`, for a held-out evaluation.

    >>> generate_arithmetic(2, 0, max_operand=5)
    [{'question': 'What is 5 + 3?', 'answer': '5 + 3 = 8\\n#### 8'}, {'question': 'What is 3 + 1?', 'answer': '3 + 1 = 4\\n#### 4'}]
    """
    import numpy as np

    if isinstance(max_operand, bool) or not isinstance(max_operand, int) or max_operand < 1:
        raise ValueError(f"max_operand must be an int >= 1, got {max_operand!r}.")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"num_generated must be an int >= 1, got {size!r}.")
    rng = np.random.default_rng(seed)
    if pairs == "all":
        operands = rng.integers(0, max_operand + 1, size=(size, 2)).tolist()
    else:
        allowed = arithmetic_pairs(max_operand, pairs)
        operands = [allowed[i] for i in rng.integers(0, len(allowed), size=size).tolist()]
    return [{"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"}
            for a, b in operands]


def grade_gsm8k_reply(reply: str, task: Task):
    """:func:`gym_llm.rewards.gsm8k.grade` of ``reply`` against the task's reference (the grade function of
    ``LLMGSM8K-v0``)."""
    return grade(reply, task.answer)


class GSM8KHandler(ScoredReplyHandler):
    """Scores the single assistant turn: ``1.0`` if correct, plus ``format_reward`` if it states
    ``#### N``, plus ``reward_fn(task, messages)`` (a shaping hook, e.g. a length penalty) if given."""

    def __init__(self, format_reward: float = 0.0, reward_fn: Any = None,
                 reward_timeout_s: float | None = DEFAULT_HOOK_TIMEOUT_S):
        super().__init__(grade_gsm8k_reply, format_reward, reward_fn, reward_timeout_s)


@with_arguments_of(load_gsm8k_tasks, scored_reply_parts)
def build_gsm8k(**kwargs: Any) -> EnvParts:
    """The env's parts: :func:`load_gsm8k_tasks`'s arguments pick the tasks; the rest (``format_reward``,
    ``reward_fn``, tools, every ``ChatConfig`` field) go to :func:`~gym_llm.envs.scored.scored_reply_parts`."""
    task_list = load_gsm8k_tasks(**take_arguments(load_gsm8k_tasks, kwargs))
    return scored_reply_parts(task_list, grade_gsm8k_reply, **kwargs)


class LLMGSM8KEnv(LLMEnv, build=build_gsm8k):
    """Grade-school math (GSM8K).

    ## Description
    One question per episode; the policy answers once. The reply is scored by
    :func:`gym_llm.rewards.gsm8k.grade`: the final answer is extracted (``#### N``, ``\\boxed{N}``,
    "the answer is N", ``A: N``, else the last number), normalised and compared with the reference
    exactly (rationals), with math-verify for non-numeric answers.

    ## Action Space
    Text mode: ``UnicodeText(max_action_chars)``; tokens mode: padded ids + mask (see ``LLMChat-v0``).

    ## Observation Space
    The question rendered with the chat template (text), or its token ids (tokens mode).

    ## Rewards
    | outcome | reward |
    |---|---|
    | one final answer, equal to the reference (docs/verifiers.md: what follows it may justify, restate or sign off, not correct, hedge or offer another) | 1.0 |
    | otherwise | 0.0 |
    | plus, if the reply states ``#### N`` | ``format_reward`` (default 0.0) |
    | plus, if given | ``reward_fn(task, messages)`` (shaping; its info dict is merged into ``info``) |

    ``info``: ``correct``, ``formatted``, ``extracted_answer``, ``reference_answer``, ``answer_problem`` (why an answer
    was refused: several candidates, a correction after it, ...).

    ## Starting State
    The next problem of the task stream (seeded shuffle; ``options={"task_id": i}`` forces one).

    ## Episode End
    Terminated after the one assistant turn (``max_turns`` defaults to 1). Never truncated unless
    the reply overflows the observation space.

    ## Arguments
    * ``data_files``: a local GSM8K ``.jsonl`` (``question``/``answer`` per line) — or a list of them.
    * ``source``: ``"gsm_symbolic"`` to generate problems offline with reasoning-gym
      (``num_generated``, ``generator_seed``); ``"arithmetic"`` for generated ``a + b`` problems with
      operands up to ``max_operand`` (no dependency; the CPU training demo's task, see
      :func:`generate_arithmetic`; ``operand_pairs="train"``/``"test"`` draws them from a fixed 80/20
      partition of the pairs, so an evaluation on ``"test"`` never sees a training problem);
      ``"hub"``/None loads ``dataset_name`` (default ``openai/gsm8k``, config ``main``, ``split``) through
      ``datasets``.
    * ``tasks``: records (or a ``datasets.Dataset``) with ``question``/``answer`` instead of a file.
    * ``tools``: :mod:`gym_llm.tools` tools (``PythonTool``, ``MCPTool``); calls in a reply are run and
      answered with ``tool`` messages until a reply without calls is scored (raise ``max_turns``);
      ``max_tool_calls_per_turn``. See ``docs/tools.md`` and ``LLMPythonTool-v0``.
    * ``prompt_template`` (with ``{question}``), ``format_reward``, ``task_order``, and every
      :class:`~gym_llm.core.chat.ChatConfig` field (``mode``, ``tokenizer``, ``system_prompt``, ...).

    If none is reachable the error lists the three options.

    ## Vectorized environment
    :class:`LLMGSM8KVectorEnv`: ``gym.make_vec("LLMGSM8K-v0", num_envs=8, group_size=4, ...)`` runs 2
    problems x 4 samples per round.

    ## Version History
    * v0: initial version.
    * v0, reward change (issue 45): the one-answer rule reads the answer's clause. A correct ``#### N`` or "The answer
      is N" followed by a justification, restatement, sign-off or question that holds other numbers now scores 1.0
      (it scored 0.0); a correction, alternative, hedge or other stated answer after it scores 0.0, as does a second
      final-answer marker of any kind with another value; text before ``</think>`` is not read. The id stays ``-v0``:
      the package is unreleased (0.1.0) and no env has left v0; compare runs across this change with that in mind
      (docs/verifiers.md has the rates before and after).
    """


LLMGSM8KVectorEnv = LLMGSM8KEnv.Vector
