"""``BrowserTool``: a real headless Chromium, driven through Playwright, as env tools.

Functions (with the default ``name_prefix="browser_"``): ``browser_navigate``, ``browser_read``,
``browser_click``, ``browser_type``, ``browser_links``, ``browser_back``. One Chromium per attached
tool, launched on the first call; one browser context per episode (cookies and storage never leak to
the next episode), closed when the episode ends; the browser closes with the env. See ``docs/browser.md``.
"""

from __future__ import annotations

from gym_llm.core.episode import ForkError
from gym_llm.core.pickling import ConstructorPickle
import asyncio
import importlib.util
import logging
import os
import threading
import time
from typing import Any, Mapping

from gym_llm.tools.base import ToolCall, ToolResult, function_schema, invalid_result
from gym_llm.tools.browser.config import BrowserConfig
from gym_llm.tools.browser.runtime import LAUNCH_TIMEOUT_S, BrowserRuntime

__all__ = ["ACTION_NAMES", "BrowserSession", "BrowserTool"]

logger = logging.getLogger(__name__)

ACTION_NAMES = ("navigate", "read", "click", "type", "links", "back")
"""The actions; function names are ``name_prefix + action``."""

_REF = "a [ref=eN] handle from the page snapshot, e.g. 'e12'"


def _parameters(*required: str, **properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


def _schemas(prefix: str, page_view: str) -> list[dict[str, Any]]:
    shows = ("the page as an accessibility snapshot (roles, names, text, and [ref=...] handles for click/type)"
             if page_view == "snapshot" else "the page's visible text")
    read = prefix + "read"
    specs = [
        ("navigate", f"Open a URL (absolute, or relative to the current page). Returns {shows}.",
         _parameters("url", url={"type": "string", "description": "the URL to open"})),
        ("read", f"Read the current page again. Long pages are cut: call {read} with the offset the marker names "
                 "to read on.",
         _parameters(format={"type": "string", "enum": ["text", "snapshot"],
                             "description": "'text' (default): the visible text; 'snapshot': the elements with "
                                            "[ref=...] handles"},
                     offset={"type": "integer", "description": "character offset to start from (default 0)"})),
        ("click", f"Click a link or button, by its ref or by its visible text. Returns {shows}.",
         _parameters(ref={"type": "string", "description": _REF},
                     text={"type": "string", "description": "the link's or button's visible text"})),
        ("type", "Type text into an input field (or choose an option of a select), found by its ref or by its "
                 f"label, name or placeholder; submit=true presses Enter afterwards. Returns {shows}.",
         _parameters("text", ref={"type": "string", "description": _REF},
                     field={"type": "string", "description": "the field's label, name or placeholder"},
                     text={"type": "string", "description": "the text to type"},
                     submit={"type": "boolean", "description": "press Enter after typing (default false)"})),
        ("links", "List the links of the current page with their URLs.", _parameters()),
        ("back", f"Go back to the previous page. Returns {shows}.", _parameters()),
    ]
    return [function_schema(prefix + name, description, parameters) for name, description, parameters in specs]


class BrowserTool(ConstructorPickle):
    """A headless Chromium the model drives with navigate / read / click / type / links / back.

    Args:
        allowed_hosts: the hosts pages may reach; every other request is aborted (see
            :class:`~gym_llm.tools.browser.config.BrowserConfig` for the forms). Default: none.
        name_prefix: prepended to every action name (``"browser_"`` -> ``browser_click``).
        config: a :class:`BrowserConfig` instead of the keyword settings.
        **settings: any other :class:`BrowserConfig` field (``timeout_s``, ``max_output_chars``,
            ``page_view``, ``host_map``, ``executable_path``, ...).

    Raises:
        ImportError: Playwright is missing (``pip install 'gym-llm[browser]'``) — on attach.
        FileNotFoundError: no Chromium is installed — on attach; the message says how to get one.

    Example::

        tool = BrowserTool(allowed_hosts=["docs.python.org"], timeout_s=15)
        env = gym.make("LLMChat-v0", tools=[tool], max_turns=8)
    """

    code_blocks = False

    def __init__(self, *, allowed_hosts: Any = (), name_prefix: str = "browser_", config: BrowserConfig | None = None,
                 **settings: Any):
        if config is not None and (settings or allowed_hosts):
            raise TypeError("Pass either config=BrowserConfig(...) or individual settings, not both.")
        if config is None:
            try:
                config = BrowserConfig(allowed_hosts=allowed_hosts, **settings)
            except TypeError as e:
                if "unexpected keyword" not in str(e):
                    raise
                known = sorted(BrowserConfig.__dataclass_fields__)
                raise TypeError(f"Unknown BrowserTool setting(s) {sorted(settings)}; settings are {known}.") from None
        if not isinstance(name_prefix, str):
            raise TypeError(f"name_prefix must be a str, got {type(name_prefix).__name__}.")
        self.config = config
        self.name_prefix = name_prefix
        self.names = tuple(name_prefix + action for action in ACTION_NAMES)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._runtime: BrowserRuntime | None = None
        self._refs = 0
        self._owner_pid = os.getpid()

    def _after_fork(self) -> None:
        """A forked child (e.g. an ``AsyncVectorEnv`` worker) must not use the parent's loop thread or browser."""
        if self._owner_pid != os.getpid():
            self._init_runtime()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_lock", "_runtime", "_refs", "_owner_pid"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    # ------------------------------------------------------------------------------ Tool
    def schemas(self) -> list[dict[str, Any]]:
        return _schemas(self.name_prefix, self.config.page_view)

    def attach(self) -> None:
        self._after_fork()
        with self._lock:
            if self._runtime is None:
                if importlib.util.find_spec("playwright") is None:
                    raise ImportError("BrowserTool needs Playwright: pip install 'gym-llm[browser]' (and a Chromium: "
                                      "apt-get install chromium).")
                self._runtime = BrowserRuntime(self.config, read_name=self.name_prefix + "read")
            self._refs += 1

    def detach(self) -> None:
        self._after_fork()
        with self._lock:
            self._refs = max(0, self._refs - 1)
            runtime = self._runtime if self._refs == 0 else None
            if runtime is not None:
                self._runtime = None
        if runtime is not None:
            runtime.close()

    @property
    def runtime(self) -> BrowserRuntime:
        self._after_fork()
        runtime = self._runtime
        if runtime is None:
            raise RuntimeError("the BrowserTool is not attached to an env (call tool.attach() first)")
        return runtime

    def open_session(self) -> "BrowserSession":
        return BrowserSession(self)

    def __repr__(self) -> str:
        return f"BrowserTool(allowed_hosts={list(self.config.allowed_hosts)}, host_map={dict(self.config.host_map)})"


class BrowserSession:
    """One episode's browser context: opened on the first call, closed by :meth:`close`.

    Attributes:
        blocked: URLs of the requests the allow-list aborted in this episode.
    """

    def __init__(self, tool: BrowserTool):
        self.tool = tool
        self.config = tool.config
        self._runtime: BrowserRuntime | None = None  # the runtime the tab belongs to (outlives a detach)
        self._tab: Any = None
        self._launches = 0

    @property
    def blocked(self) -> list[str]:
        return list(self._tab.blocked) if self._tab is not None else []

    def run(self, call: ToolCall) -> ToolResult:
        start = time.perf_counter()
        action = call.name[len(self.tool.name_prefix):] if call.name in self.tool.names else None
        if action is None:
            return invalid_result(call, f"the browser tool has no function {call.name!r}; it has {list(self.tool.names)}.")
        if not isinstance(call.arguments, Mapping):
            return invalid_result(call, f"arguments of {call.name} must be a JSON object, got {call.arguments!r}.")
        runtime = self.tool.runtime
        if self._runtime is not runtime:  # first call, or the tool was re-attached
            self._runtime, self._tab = runtime, None
        wait_s = self.config.timeout_s + 15.0 + (LAUNCH_TIMEOUT_S if not runtime.browser_alive else 0.0)
        try:
            text, status, truncated = runtime.call(self._act(runtime, action, dict(call.arguments)), wait_s)
        except TimeoutError:
            return ToolResult(call, f"Error: the browser did not answer within {wait_s:g} s.", "timeout",
                              time.perf_counter() - start)
        return ToolResult(call, text, status, time.perf_counter() - start, truncated)

    async def _act(self, runtime: BrowserRuntime, action: str, args: dict[str, Any]) -> tuple[str, str, bool]:
        """On the loop: (text, status, truncated). Never raises for anything the page or the model does."""
        from playwright.async_api import Error as PlaywrightError
        from playwright.async_api import TimeoutError as PlaywrightTimeoutError

        from gym_llm.tools.browser.actions import ACTIONS, ActionError

        note = ""
        try:
            if self._tab is None or self._launches != runtime.launches or not runtime.browser_alive:
                if self._tab is not None:
                    note = "[The browser had stopped and was restarted: this episode's pages and cookies are lost.]\n"
                self._tab = await runtime.open_tab()
                self._launches = runtime.launches
        except Exception as e:
            logger.error("the browser could not start: %r", e)
            return f"Error: the browser could not start ({type(e).__name__}: {e}).", "crashed", False
        tab = self._tab
        try:
            text, truncated = await asyncio.wait_for(ACTIONS[action](tab, args), self.config.timeout_s)
            return note + text, "ok", truncated
        except ActionError as e:
            return f"{note}{tab.take_notes()}Error: {e}", "error", False
        except (TimeoutError, PlaywrightTimeoutError):
            return await self._timed_out(runtime, tab, action, note), "timeout", False
        except PlaywrightError as e:
            if not runtime.browser_alive:
                text = f"{note}Error: the browser crashed ({_first_line(e)}); it restarts on the next call."
                return text, "crashed", False
            return f"{note}{tab.take_notes()}Error: {call_name(self.tool, action)} failed: {_first_line(e)}", "error", False

    async def _timed_out(self, runtime: BrowserRuntime, tab: Any, action: str, note: str) -> str:
        recovered = await runtime.recover(tab)
        text = (f"{note}{tab.take_notes()}Error: {call_name(self.tool, action)} did not finish within the "
                f"{self.config.timeout_s:g} s limit and was stopped.")
        return text + (f" {recovered}" if recovered else "")

    def fork(self) -> "BrowserSession":
        """Refused: a page's live state (DOM, JavaScript heap, cookies, the site's own server-side session) cannot
        be copied into a second browser context."""
        raise ForkError("an episode that has used the browser tool cannot be forked: a page's live state (DOM, "
                        "JavaScript heap, the site's server-side session) cannot be copied into another browser "
                        "context. Fork before the first browser call.")

    def close(self) -> None:
        runtime, tab = self._runtime, self._tab
        self._tab = None
        if runtime is None or tab is None or runtime.closed:
            return
        try:
            runtime.call(runtime.close_tab(tab), 15.0)
        except Exception as e:
            logger.warning("closing an episode's browser context failed: %r", e)


def call_name(tool: BrowserTool, action: str) -> str:
    return tool.name_prefix + action


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
