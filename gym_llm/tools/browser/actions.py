"""The browser actions, as coroutines on one episode's :class:`Tab` (run on the tool's event-loop thread).

Every action returns the text of a tool message. Pages are shown either as Playwright's accessibility
snapshot for AI agents (``page.aria_snapshot(mode="ai")``: roles, accessible names, text, and
``[ref=eN]`` handles that ``click``/``type`` accept) or as the visible text (``innerText``). Long pages
are cut at ``max_output_chars`` with a marker naming the ``offset`` to read on from.

This module imports Playwright; :mod:`gym_llm.tools.browser.runtime` imports it only when the first
action runs.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping
from urllib.parse import urljoin, urlsplit

from playwright.async_api import BrowserContext, Download, Locator, Page, Request
from playwright.async_api import Error as PlaywrightError

from gym_llm.tools.browser.config import BrowserConfig, HostPolicy

__all__ = ["ACTIONS", "ActionError", "Tab", "page_view"]

logger = logging.getLogger(__name__)

_SNAPSHOT_NOISE = re.compile(r" \[cursor=pointer\]")
_NAVIGATION_RACE = ("Execution context was destroyed", "navigation", "Target page, context or browser has been closed")
_LINKS_JS = """(max) => {
  const anchors = document.querySelectorAll('a[href]');
  const out = [];
  for (const a of anchors) {
    if (out.length >= max) break;
    const text = (a.innerText || a.getAttribute('aria-label') || a.title || '').replace(/\\s+/g, ' ').trim();
    out.push([text, a.href]);
  }
  return [out, anchors.length];
}"""


_OPENS_NEW_TAB_JS = """(e) => {
  const owner = e.closest('a[href], area[href], form') || (e.form || null);
  if (!owner) return false;
  const base = document.querySelector('base[target]');
  const target = (owner.getAttribute('target') || (base && base.getAttribute('target')) || '').toLowerCase();
  return !['', '_self', '_parent', '_top'].includes(target);
}"""


class ActionError(Exception):
    """The model asked for something that cannot be done (bad argument, blocked host, no such element)."""


@dataclass
class Tab:
    """One episode's browser context and its current page.

    Attributes:
        context: the episode's own ``BrowserContext`` (cookies, storage, cache).
        page: the page actions run on (a popup opened by the page becomes the current page).
        blocked: every request the allow-list aborted, in order (URLs).
        notes: events to report with the next result (blocked navigations, refused downloads, popups).
    """

    context: BrowserContext
    page: Page | None
    config: BrowserConfig
    policy: HostPolicy
    read_name: str = "browser_read"
    blocked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    opening_page: bool = False  # the tool itself is opening a page (not a popup)
    refused_download: bool = False  # navigate already reported a download: do not report it twice

    def watch(self, page: Page) -> None:
        page.on("download", self._on_download)

    def on_blocked(self, request: Request) -> None:
        self.blocked.append(request.url)
        if request.is_navigation_request():
            self.notes.append(f"[Blocked: {request.url} is not on the allow-list ({self.policy.describe()}).]")

    def on_new_page(self, page: Page) -> None:
        """A popup / ``target=_blank`` page becomes the current page; the old one is closed (one tab per episode)."""
        if self.opening_page or page is self.page:
            return
        old, self.page = self.page, page
        self.watch(page)
        self.notes.append("[The page opened a new tab; it is now the current page.]")
        if old is not page and not old.is_closed():
            asyncio.ensure_future(_quietly(old.close()))

    async def _on_download(self, download: Download) -> None:
        if self.refused_download:
            self.refused_download = False
        else:
            self.notes.append(f"[Refused a download of {download.suggested_filename!r}: file downloads are disabled.]")
        await _quietly(download.cancel())

    def take_notes(self) -> str:
        notes, self.notes = self.notes, []
        return "".join(note + "\n" for note in dict.fromkeys(notes))


async def _quietly(awaitable: Awaitable[Any]) -> None:
    try:
        await awaitable
    except Exception as e:  # closing something already gone
        logger.debug("ignored: %r", e)


# ------------------------------------------------------------------------------------- arguments
def _check_args(args: Mapping[str, Any], allowed: Mapping[str, type], required: tuple[str, ...] = ()) -> None:
    unknown = sorted(set(args) - set(allowed))
    if unknown:
        raise ActionError(f"unknown argument(s) {unknown}; this action takes {sorted(allowed) or 'no arguments'}.")
    for name in required:
        if name not in args:
            raise ActionError(f"missing argument {name!r}; this action takes {sorted(allowed)}.")
    for name, value in args.items():
        expected = allowed[name]
        if expected is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ActionError(f"{name!r} must be an integer >= 0, got {value!r}.")
        if expected is not int and not isinstance(value, expected):
            raise ActionError(f"{name!r} must be a {expected.__name__}, got {type(value).__name__} {value!r}.")


def _ref(value: str) -> str:
    """``'e12'``, ``'[ref=e12]'`` or ``'ref=e12'`` -> ``'e12'``."""
    ref = value.strip().strip("[]").removeprefix("ref=")
    if not re.fullmatch(r"[a-z0-9]+", ref):
        raise ActionError(f"ref must look like 'e12' (a [ref=...] handle from the page snapshot), got {value!r}.")
    return ref


def _one_of(args: Mapping[str, Any], a: str, b: str) -> str:
    given = [k for k in (a, b) if k in args]
    if len(given) != 1:
        raise ActionError(f"give exactly one of {a!r} or {b!r}, got {given or 'neither'}.")
    return given[0]


# ------------------------------------------------------------------------------------------ views
def clip(header: str, body: str, offset: int, limit: int, read_name: str, view: str | None = None) -> tuple[str, bool]:
    """``header`` + the part of ``body`` from ``offset`` that fits in ``limit`` characters, with markers; the
    marker names the ``read`` arguments that show the rest (``view``: the read format, if not the default)."""
    if offset and offset >= len(body):
        return header + f"[offset {offset} is past the end: the page has {len(body)} characters.]", False
    budget = max(limit - len(header), 200)
    part = body[offset: offset + budget]
    rest = len(body) - offset - len(part)
    text = header + (f"[... {offset} characters before this skipped ...]\n" if offset else "") + part
    if rest > 0:
        end = offset + len(part)
        arguments = f'{{"format": "{view}", "offset": {end}}}' if view else f'{{"offset": {end}}}'
        text += f"\n[... {rest} more characters not shown; call {read_name} with {arguments} to read on ...]"
    return text, rest > 0


async def page_view(tab: Tab, view: str, offset: int = 0) -> tuple[str, bool]:
    """The current page as a tool message: notes, URL, title, then the snapshot or text."""
    for attempt in range(3):  # a navigation may land, or a popup open, while the page is read
        page = tab.page
        try:
            await page.wait_for_load_state("load")
            body = await (_snapshot(page) if view == "snapshot" else page.inner_text("body"))
            title = await page.title()
        except PlaywrightError as e:
            if attempt == 2 or not any(s in str(e) for s in _NAVIGATION_RACE):
                raise
            continue
        if page is tab.page:
            break
    if page.url.startswith("chrome-error://"):
        header = f"{tab.take_notes()}The page could not be loaded (blocked or unreachable).\n"
        return header, False
    header = f"{tab.take_notes()}URL: {page.url}\nTitle: {title}\n\n"
    return clip(header, body.strip(), offset, tab.config.max_output_chars, tab.read_name,
                view if view != "text" else None)


async def _snapshot(page: Page) -> str:
    return _SNAPSHOT_NOISE.sub("", await page.aria_snapshot(mode="ai"))


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


# ---------------------------------------------------------------------------------------- actions
async def navigate(tab: Tab, args: Mapping[str, Any]) -> tuple[str, bool]:
    _check_args(args, {"url": str}, ("url",))
    current = tab.page.url
    url = urljoin(current if current.startswith(("http://", "https://")) else "", args["url"].strip())
    if urlsplit(url).scheme not in ("http", "https"):
        raise ActionError(f"only http(s) URLs can be opened (a relative URL needs an open page), got {args['url']!r}.")
    if not tab.policy.allows(url):
        raise ActionError(f"{url} is not on the allow-list; allowed hosts: {tab.policy.describe()}.")
    try:
        response = await tab.page.goto(url, wait_until="load")
    except PlaywrightError as e:
        message = _first_line(e)
        if "Download is starting" in message:
            count = len(tab.notes)
            tab.notes = [note for note in tab.notes if not note.startswith("[Refused a download")]
            tab.refused_download = len(tab.notes) == count  # its download event is still to come: mute it
            raise ActionError(f"{url} is a file download; file downloads are disabled.") from None
        if "net::ERR_" in message:
            code = re.search(r"net::ERR_\w+", message).group(0)
            raise ActionError(f"could not load {url} ({code}).") from None
        raise
    text, truncated = await page_view(tab, tab.config.page_view)
    if response is not None and response.status >= 400:
        text = f"[HTTP {response.status} {response.status_text}]\n" + text
    return text, truncated


async def read(tab: Tab, args: Mapping[str, Any]) -> tuple[str, bool]:
    _check_args(args, {"format": str, "offset": int})
    view = args.get("format", "text")
    if view not in ("text", "snapshot"):
        raise ActionError(f"format must be 'text' or 'snapshot', got {view!r}.")
    if tab.page.url == "about:blank":
        raise ActionError("no page is open yet; open one with the navigate action first.")
    return await page_view(tab, view, args.get("offset", 0))


async def _clickable(page: Page, text: str) -> Locator | None:
    """A link, button or text with this exact (then partial) label; the first of several."""
    exact = (page.get_by_role("link", name=text, exact=True), page.get_by_role("button", name=text, exact=True),
             page.get_by_text(text, exact=True))
    loose = (page.get_by_role("link", name=text), page.get_by_role("button", name=text), page.get_by_text(text))
    for locator in (*exact, *loose):
        if await locator.count():
            return locator.first
    return None


async def _by_ref(page: Page, ref: str) -> Locator:
    locator = page.locator(f"aria-ref={_ref(ref)}")
    try:
        found = await locator.count()
    except PlaywrightError:
        found = 0
    if not found:
        raise ActionError(f"no element [ref={_ref(ref)}] on the current page (refs change when the page does); "
                          'read the page again with {"format": "snapshot"} to get fresh refs.')
    return locator


async def click(tab: Tab, args: Mapping[str, Any]) -> tuple[str, bool]:
    _check_args(args, {"ref": str, "text": str})
    key = _one_of(args, "ref", "text")
    page = tab.page
    if key == "ref":
        locator = await _by_ref(page, args["ref"])
    else:
        locator = await _clickable(page, args["text"])
        if locator is None:
            raise ActionError(f"no link, button or text {args['text']!r} on this page; read it with "
                              '{"format": "snapshot"} to see its elements and their refs.')
    if await locator.evaluate(_OPENS_NEW_TAB_JS):  # wait for the new tab, so the result shows it
        async with tab.context.expect_page():
            await locator.click()
    else:
        await locator.click()
    return await page_view(tab, tab.config.page_view)


async def _field(page: Page, name: str) -> Locator | None:
    """An input found by its label, placeholder, name attribute, or textbox name."""
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    for locator in (page.get_by_label(name, exact=True), page.get_by_placeholder(name, exact=True),
                    page.locator(f'[name="{quoted}"]'), page.get_by_label(name), page.get_by_role("textbox", name=name),
                    page.get_by_placeholder(name)):
        if await locator.count():
            return locator.first
    return None


async def type_text(tab: Tab, args: Mapping[str, Any]) -> tuple[str, bool]:
    _check_args(args, {"ref": str, "field": str, "text": str, "submit": bool}, ("text",))
    key = _one_of(args, "ref", "field")
    page = tab.page
    if key == "ref":
        locator = await _by_ref(page, args["ref"])
    else:
        locator = await _field(page, args["field"])
        if locator is None:
            raise ActionError(f"no input field labelled, named or with placeholder {args['field']!r}; read the page "
                              'with {"format": "snapshot"} and use the field\'s ref.')
    tag = await locator.evaluate("e => e.tagName.toLowerCase()")
    if tag == "select":
        await locator.select_option(label=args["text"])
    else:
        await locator.fill(args["text"])
    if args.get("submit", False):
        await locator.press("Enter")
    return await page_view(tab, tab.config.page_view)


async def links(tab: Tab, args: Mapping[str, Any]) -> tuple[str, bool]:
    _check_args(args, {})
    page = tab.page
    if page.url == "about:blank":
        raise ActionError("no page is open yet; open one with the navigate action first.")
    found, total = await page.evaluate(_LINKS_JS, 2 * tab.config.max_links)  # 2x: room for duplicates
    distinct = list(dict.fromkeys((text, href) for text, href in found))
    text = f"{tab.take_notes()}Links on {page.url} ({total} on the page):\n"
    shown = 0
    for label, href in distinct[: tab.config.max_links]:
        line = f"- {label or '(no text)'}: {href}{'' if tab.policy.allows(href) else '  (not allowed)'}\n"
        if len(text) + len(line) > tab.config.max_output_chars - 60:
            break
        text += line
        shown += 1
    complete = shown == len(distinct) and total == len(found)
    if not complete:
        text += f"[... {shown} of the page's {total} links are listed ...]"
    return text.rstrip("\n"), not complete


async def back(tab: Tab, args: Mapping[str, Any]) -> tuple[str, bool]:
    _check_args(args, {})
    before = tab.page.url
    response = await tab.page.go_back(wait_until="load")
    if response is None and tab.page.url == before:
        raise ActionError("there is no previous page.")
    return await page_view(tab, tab.config.page_view)


ACTIONS: dict[str, Callable[[Tab, Mapping[str, Any]], Awaitable[tuple[str, bool]]]] = {
    "navigate": navigate, "read": read, "click": click, "type": type_text, "links": links, "back": back,
}
"""Action name (the function name without the tool's prefix) -> coroutine."""
