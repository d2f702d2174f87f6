"""``LLMPythonTool-v0``: chat with a sandboxed Python interpreter; default task GSM8K solved with code."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from gym_llm.core.env import LLMEnv
from gym_llm.core.episode import EnvParts
from gym_llm.envs.gsm8k import build_gsm8k

__all__ = ["LLMPythonToolEnv", "LLMPythonToolVectorEnv", "DEFAULT_PYTHON_TOOL_SYSTEM_PROMPT", "build_python_tool"]

DEFAULT_PYTHON_TOOL_SYSTEM_PROMPT = (
    "You can run Python code. To run code, write it in a ```python code block (or call the python tool); "
    "its printed output comes back to you, and variables persist between blocks. When you know the answer, "
    "reply without any code block and write the final answer on the last line as '#### <number>'."
)
"""The default system prompt of ``LLMPythonTool-v0``."""


def build_python_tool(
    *,
    python_tool: Any = None,
    sandbox: Mapping[str, Any] | None = None,
    tools: Sequence[Any] = (),
    max_turns: int = 4,
    system_prompt: str | None = DEFAULT_PYTHON_TOOL_SYSTEM_PROMPT,
    **gsm8k_kwargs: Any,
) -> EnvParts:
    """GSM8K (any :class:`~gym_llm.envs.gsm8k.LLMGSM8KEnv` argument) with a Python tool and more tools."""
    from gym_llm.tools.python import PythonTool

    if python_tool is None:
        from gym_llm.core.extras import require

        require("tools", "pyseccomp", needed_by="LLMPythonTool-v0 (its sandbox's seccomp filters)")
        python_tool = PythonTool(**dict(sandbox or {}))
    elif sandbox is not None:
        raise TypeError("Pass either python_tool=PythonTool(...) or sandbox={...} settings, not both.")
    elif not isinstance(python_tool, PythonTool):
        raise TypeError(f"python_tool must be a gym_llm.tools.PythonTool, got {type(python_tool).__name__}.")
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools must be a list of extra tools (e.g. MCPTool), got {type(tools).__name__}.")
    parts = build_gsm8k(tools=[python_tool, *tools], max_turns=max_turns, system_prompt=system_prompt,
                            **gsm8k_kwargs)
    parts.extra["python_tool"] = python_tool
    parts.respond_workers = "per_env"  # each sub-env's turn waits on its sandbox
    parts.on_vector = python_tool.prewarm  # start one sandbox per sub-env ahead of the first reset
    return parts


class LLMPythonToolEnv(LLMEnv, build=build_python_tool):
    """Chat with a sandboxed, persistent Python interpreter.

    ## Description
    The policy solves a task (default: GSM8K) and may run Python on the way: a fenced ```python block
    in a reply (or a ``<tool_call>{"name": "python", "arguments": {"code": ...}}</tool_call>``) is
    executed in the episode's own interpreter — variables persist across calls — and its output comes
    back as a ``tool`` message. A reply without tool calls is the final answer and is scored. Code runs
    in a bubblewrap + seccomp + rlimits sandbox (``docs/tools.md`` has the threat model); a timeout,
    crash or limit restarts the interpreter and answers with an error tool message.

    ## Action Space
    Text mode: ``UnicodeText(max_action_chars)``; tokens mode: padded ids + mask (see ``LLMChat-v0``).

    ## Observation Space
    The conversation rendered with the chat template (the tools' JSON schemas are passed to its
    ``tools`` variable), or its token ids in tokens mode: tool results are appended as new tokens only.

    ## Rewards
    | step | reward |
    |---|---|
    | a reply with tool calls | 0.0 |
    | the final reply | GSM8K: 1.0 if correct, else 0.0 (+ ``format_reward`` for ``#### N``) |

    ## Starting State
    The next problem of the task stream; the interpreter starts empty (``options={"task_id": i}``).

    ## Episode End
    Terminated when a reply without tool calls is scored. On the last allowed turn (``max_turns``,
    default 4) tool calls are not run and the reply is scored as the final answer. Truncated when the
    conversation outgrows the observation space.

    ``info``: ``num_tool_calls``, ``tool_calls`` (JSON list: ``name``, ``code``, ``status`` in
    ok/error/timeout/crashed/invalid, ``duration_s``, ``truncated``), ``num_tool_calls_skipped``;
    on the final step also GSM8K's ``correct``, ``formatted``, ``extracted_answer``, ``reference_answer``.

    ## Arguments
    * every ``LLMGSM8K-v0`` argument (``data_files``, ``source``, ``tasks``, ``mode``, ``tokenizer``, ...);
    * ``sandbox``: settings for the default ``PythonTool`` (``timeout_s``, ``memory_limit_mb``,
      ``cpu_limit_s``, ``max_output_chars``, ``isolation``, ``preload``, ...) — or ``python_tool=PythonTool(...)``;
    * ``tools``: more tools (e.g. ``MCPTool``), ``max_tool_calls_per_turn`` (default 8);
    * ``max_turns`` (default 4), ``system_prompt`` (default :data:`DEFAULT_PYTHON_TOOL_SYSTEM_PROMPT`).

    ## Vectorized environment
    :class:`LLMPythonToolVectorEnv` runs the tool calls of all sub-envs in parallel (one thread per
    sub-env by default) and starts one warm sandbox per sub-env up front.

    ## Version History
    * v0: initial version.
    * v0, reward change (issue 45): the final reply is graded by ``LLMGSM8K-v0``'s revised one-answer rule (a sign-off
      or justification with other numbers after ``#### N`` is right; a correction, hedge or alternative is wrong).
    """


LLMPythonToolVectorEnv = LLMPythonToolEnv.Vector
