"""The browser tool: a real headless Chromium driven through Playwright (see ``docs/browser.md``).

Importing this package does not import Playwright; attaching a :class:`BrowserTool` checks that it is
installed, and the first action starts it and Chromium.
"""

from gym_llm.tools.browser.config import BrowserConfig, HostPolicy, HostRule
from gym_llm.tools.browser.tool import ACTION_NAMES, BrowserSession, BrowserTool

__all__ = ["ACTION_NAMES", "BrowserConfig", "BrowserSession", "BrowserTool", "HostPolicy", "HostRule"]
