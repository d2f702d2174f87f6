"""``LLMBrowser-v0``: answer questions by browsing a local website with a real headless Chromium."""

from __future__ import annotations

from os import PathLike
from typing import Any, Mapping, Sequence

from gym_llm.core.chat import ChatConfig
from gym_llm.core.env import LLMEnv
from gym_llm.core.episode import EnvParts
from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task, TaskOrder
from gym_llm.envs.common import chat_env_parts
from gym_llm.envs.scored import ScoredReplyHandler
from gym_llm.rewards.short_answer import grade
from gym_llm.tasks.loading import load_records

__all__ = ["DEFAULT_BROWSER_PROMPT", "DEFAULT_BROWSER_SYSTEM_PROMPT", "SITE_HOST", "LLMBrowserEnv",
           "LLMBrowserVectorEnv", "ShortAnswerHandler", "build_browser", "load_browser_tasks"]

SITE_HOST = "larkspur.test"
"""The host name the env's site is served under (mapped to its 127.0.0.1 server inside the browser)."""

DEFAULT_BROWSER_SYSTEM_PROMPT = (
    "You can use a web browser through the browser_* tools: navigate to a URL, read the page, click links and "
    "buttons, type into form fields, list links, go back. Pages are shown with [ref=...] handles you can pass to "
    "click and type. Find the answer on the website; do not guess. When you know it, reply without any tool call "
    "and write the final answer alone on the last line as 'Answer: <answer>'."
)
"""The default system prompt of ``LLMBrowser-v0``."""

DEFAULT_BROWSER_PROMPT = "Use the website at {start_url} to answer this question.\n\nQuestion: {question}"
"""The default user prompt; ``{start_url}`` and ``{question}`` are filled in."""


def load_browser_tasks(tasks: Any, *, start_url: str, prompt_template: str = DEFAULT_BROWSER_PROMPT) -> list[Task]:
    """Tasks from records with ``question`` and ``answer`` (a string or a list of accepted strings), a
    ``.jsonl`` path, or ``None`` for the built-in Larkspur Harbor tasks.

    Raises:
        ValueError: a record without ``question``/``answer``, or a template without ``{question}``.
    """
    if "{question}" not in prompt_template:
        raise ValueError(f"prompt_template must contain '{{question}}', got {prompt_template!r}.")
    if tasks is None:
        from gym_llm.tasks.larkspur import SITE_TASKS

        records: list[Any] = [{"question": t.question, "answer": list(t.answers), "skill": t.skill} for t in SITE_TASKS]
    else:
        records = load_records(tasks)
    out = []
    for index, record in enumerate(records):
        answer = record.get("answer") if isinstance(record, dict) else None
        accepted = [answer] if isinstance(answer, str) else answer
        if (not isinstance(record, dict) or not isinstance(record.get("question"), str) or not isinstance(accepted, list)
                or not accepted or not all(isinstance(a, str) and a.strip() for a in accepted)):
            got = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise ValueError(
                f"Browser task {index} needs 'question' (str) and 'answer' (a str or a non-empty list of accepted "
                f"strings), got {got}; e.g. {{'question': 'Who designed the lighthouse?', 'answer': ['Tobias Merrow']}}."
            )
        prompt = prompt_template.format(question=record["question"], start_url=start_url)
        out.append(Task(index, (Message("user", prompt),), accepted[0], {**record, "accepted_answers": tuple(accepted)}))
    return out


def grade_short_answer_reply(reply: str, task: Task):
    """:func:`gym_llm.rewards.short_answer.grade` of ``reply`` against the task's accepted answers."""
    return grade(reply, task.data.get("accepted_answers") or [task.answer])


class ShortAnswerHandler(ScoredReplyHandler):
    """Scores the final reply: 1.0 if its ``Answer:`` line matches an accepted answer (see
    :func:`gym_llm.rewards.short_answer.grade`), plus ``format_reward`` when the line is there."""

    def __init__(self, format_reward: float = 0.0):
        super().__init__(grade_short_answer_reply, format_reward)


def build_browser(
    *,
    tasks: Any = None,
    site_dir: str | PathLike | None = None,
    site_host: str = SITE_HOST,
    browser: Mapping[str, Any] | None = None,
    tools: Sequence[Any] = (),
    prompt_template: str = DEFAULT_BROWSER_PROMPT,
    system_prompt: str | None = DEFAULT_BROWSER_SYSTEM_PROMPT,
    max_turns: int = 10,
    format_reward: float = 0.0,
    task_order: TaskOrder = "shuffle",
    max_tool_calls_per_turn: int = 4,
    **chat_kwargs: Any,
) -> EnvParts:
    """Start the site server, build the browser tool (allowed: the site only), and the chat parts."""
    from gym_llm.core.extras import require

    require("browser", "playwright", needed_by="LLMBrowser-v0")
    from gym_llm.tasks.site_server import SiteServer
    from gym_llm.tools.browser import BrowserTool

    if site_dir is not None and tasks is None:
        raise ValueError("site_dir=... serves your own pages; pass tasks=[{'question': ..., 'answer': ...}] about them.")
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools must be a list of extra tools (e.g. PythonTool()), got {type(tools).__name__}.")
    settings = dict(browser or {})
    if "host_map" in settings or "config" in settings:
        raise ValueError(f"browser={{...}} must not set {sorted({'host_map', 'config'} & set(settings))}: the env maps "
                         f"{site_host!r} to its own server; add other hosts with browser={{'allowed_hosts': [...]}}.")
    server = SiteServer(site_dir)
    try:
        tool = BrowserTool(host_map={site_host: server.address}, **settings)
        task_list = load_browser_tasks(tasks, start_url=f"http://{site_host}/", prompt_template=prompt_template)
        config = ChatConfig(max_turns=max_turns, system_prompt=system_prompt, **chat_kwargs)
        parts = chat_env_parts(task_list, ShortAnswerHandler(format_reward), config, task_order=task_order,
                               tools=[tool, *tools], max_tool_calls_per_turn=max_tool_calls_per_turn,
                               on_close=server.close, extra={"browser_tool": tool, "site": server})
        parts.respond_workers = "per_env"  # each sub-env's turn waits on its browser page
        return parts
    except BaseException:
        server.close()
        raise


class LLMBrowserEnv(LLMEnv, build=build_browser):
    """Answer questions by browsing a website with a real headless Chromium.

    ## Description
    The env starts a small website on ``127.0.0.1`` (default: Larkspur Harbor, an invented town with a
    wiki, a shop, accounts and a ferry timetable — facts no model knows) and gives the policy a browser
    tool (:class:`~gym_llm.tools.browser.BrowserTool`, Playwright driving Chromium). The site is reached
    as ``http://larkspur.test/``; the browser may reach nothing else. Each task asks for one fact that
    takes navigation, clicks, a search or a login form to find. Tool calls
    (``<tool_call>{"name": "browser_click", "arguments": {"text": "Wiki"}}</tool_call>``) are run and
    answered with ``tool`` messages; a reply without calls is the final answer.

    ## Action Space
    Text mode: ``UnicodeText(max_action_chars)``; tokens mode: padded ids + mask (see ``LLMChat-v0``).

    ## Observation Space
    The conversation rendered with the chat template (the six browser functions' JSON schemas go to
    its ``tools`` variable), or its token ids in tokens mode (tool results appended as new tokens only).

    ## Rewards
    | step | reward |
    |---|---|
    | a reply with tool calls | 0.0 |
    | the final reply | 1.0 if its ``Answer: ...`` line matches an accepted answer (normalised exact match), else 0.0 |
    | plus, if the final reply has an ``Answer:`` line | ``format_reward`` (default 0.0) |

    ## Starting State
    The next task of the stream; a fresh browser context (no cookies, no history) is opened on the
    episode's first tool call. ``options={"task_id": i}`` forces a task.

    ## Episode End
    Terminated when a reply without tool calls is scored. On the last allowed turn (``max_turns``,
    default 10) calls are not run and the reply is scored. Truncated when the conversation outgrows
    the observation space. The episode's browser context is closed when it ends.

    ``info``: ``num_tool_calls``, ``tool_calls`` (JSON list: ``name``, ``arguments``, ``status`` in
    ok/error/timeout/crashed/invalid, ``duration_s``, ``truncated``), ``num_tool_calls_skipped``; on the
    final step also ``correct``, ``formatted``, ``extracted_answer``, ``reference_answer``.

    ## Arguments
    * ``tasks``: records ``{"question", "answer"}`` (``answer``: a string or a list of accepted strings), a
      ``.jsonl`` path, or None for the 12 built-in tasks; ``site_dir``: serve your own static pages instead
      (with ``tasks`` about them); ``site_host`` (default ``"larkspur.test"``).
    * ``browser``: :class:`~gym_llm.tools.browser.BrowserConfig` settings (``timeout_s`` per action,
      ``max_output_chars``, ``page_view``, ``allowed_hosts`` to allow more hosts, ``executable_path``, ...).
    * ``tools``: more tools; ``max_tool_calls_per_turn`` (default 4); ``max_turns`` (default 10).
    * ``prompt_template`` (``{start_url}``, ``{question}``), ``system_prompt``, ``format_reward``,
      ``task_order``, and every :class:`~gym_llm.core.chat.ChatConfig` field (``mode``, ``tokenizer``, ...).

    ## Vectorized environment
    :class:`LLMBrowserVectorEnv` shares one site server and one Chromium among its sub-envs (one
    browser context each) and runs their tool calls in parallel threads.

    ## Version History
    * v0: initial version.
    """


LLMBrowserVectorEnv = LLMBrowserEnv.Vector
