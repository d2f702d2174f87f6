"""The browser tool's runtime: a private asyncio loop thread driving Playwright, one shared Chromium.

Why a loop thread: Playwright's sync API refuses to run inside a running asyncio loop and its objects
belong to the thread that made them, while envs call tools from any thread (the vector env's respond
pool). Here every Playwright object lives on one event loop in one daemon thread; callers submit
coroutines (``asyncio.run_coroutine_threadsafe``) and wait with a timeout. Actions of different
episodes interleave on that loop, so the sub-envs of a vector env browse concurrently.

Chromium is launched on the first action (not on attach), once per runtime, and relaunched if it dies.
Each episode gets its own ``BrowserContext`` (cookies, storage, cache), with the allow-list routing
installed before its first page exists.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any, Coroutine, TypeVar

from gym_llm.tools.browser.config import BrowserConfig, HostPolicy, find_chromium

__all__ = ["BrowserRuntime"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
LAUNCH_TIMEOUT_S = 60.0


_NO_PEER_TRAFFIC = """
for (const name of ["RTCPeerConnection", "webkitRTCPeerConnection", "RTCDataChannel", "RTCIceTransport",
                    "RTCSctpTransport", "WebTransport"]) {
  try { delete globalThis[name]; } catch (e) {}
}
"""
"""Removes the APIs that send traffic the routing layer never sees, in every frame. Defense in depth: the Chromium
flags in :data:`~gym_llm.tools.browser.config.CHROMIUM_FLAGS` already keep WebRTC from gathering candidates and QUIC
(WebTransport's transport) off; this also takes the constructors away."""


class BrowserRuntime:
    """One event-loop thread and (from the first action on) one Chromium process shared by all tabs.

    Attributes:
        launches: how many times Chromium was started (1 unless it died).
        tabs_opened: browser contexts created so far (one per episode that used the browser).
    """

    def __init__(self, config: BrowserConfig, *, read_name: str):
        self.config = config
        self.policy = HostPolicy.from_config(config)
        self.read_name = read_name
        self.executable = find_chromium(config.executable_path)
        self.launches = 0
        self.tabs_opened = 0
        self.closed = False
        self._playwright: Any = None
        self._playwright_manager: Any = None
        self._browser: Any = None
        self._launch_lock: asyncio.Lock | None = None
        self._tabs: dict[int, Any] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="gym_llm_browser", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------------ thread boundary
    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coroutine`` on the loop from any other thread; ``TimeoutError`` past ``timeout_s``."""
        if self.closed:
            coroutine.close()
            raise RuntimeError("the browser tool is not attached to an env (call tool.attach() first)")
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"the browser did not answer within {timeout_s:g} s") from None

    # ------------------------------------------------------------------------------- on the loop
    @property
    def browser_alive(self) -> bool:
        return self._browser is not None and self._browser.is_connected()

    async def browser(self) -> Any:
        """The shared Chromium, launched on first use (and again if it died)."""
        if self._launch_lock is None:
            self._launch_lock = asyncio.Lock()
        async with self._launch_lock:
            if self.browser_alive:
                return self._browser
            if self._playwright is None:
                from playwright.async_api import async_playwright

                self._playwright_manager = async_playwright()
                self._playwright = await self._playwright_manager.start()
            if self._browser is not None:
                logger.warning("Chromium stopped; launching a new one")
            self._browser = await self._playwright.chromium.launch(
                executable_path=self.executable, args=self.config.chromium_args(),
                chromium_sandbox=self.config.chromium_sandbox, timeout=LAUNCH_TIMEOUT_S * 1000, handle_sigint=False,
            )
            self.launches += 1
            logger.info("launched Chromium %s (%s)", self._browser.version, self.executable or "Playwright's")
            return self._browser

    async def open_tab(self) -> Any:
        """A fresh browser context for one episode, with the allow-list routing, and a blank page."""
        from gym_llm.tools.browser.actions import Tab

        browser = await self.browser()
        config = self.config
        width, height = config.viewport
        context = await browser.new_context(
            accept_downloads=False, service_workers="block", java_script_enabled=config.javascript,
            viewport={"width": width, "height": height}, locale=config.locale,
        )
        await context.add_init_script(_NO_PEER_TRAFFIC)  # every frame, before its scripts (the flags already hold)
        context.set_default_timeout(config.timeout_s * 1000)
        context.set_default_navigation_timeout(config.timeout_s * 1000)
        tab = Tab(context, None, config, self.policy, read_name=self.read_name)  # type: ignore[arg-type]
        await context.route("**/*", lambda route: self._route(tab, route))
        await context.route_web_socket(lambda url: True, lambda ws: self._route_websocket(tab, ws))
        tab.opening_page = True
        try:
            tab.page = await context.new_page()
        finally:
            tab.opening_page = False
        tab.watch(tab.page)
        context.on("page", tab.on_new_page)
        self._tabs[id(tab)] = tab
        self.tabs_opened += 1
        return tab

    async def _route(self, tab: Any, route: Any) -> None:
        """Routing layer of the allow-list (see :mod:`gym_llm.tools.browser.config`)."""
        request = route.request
        try:
            if not self.policy.allows(request.url):
                tab.on_blocked(request)
                await route.abort("blockedbyclient")
            elif request.resource_type in self.config.blocked_resource_types:
                await route.abort("blockedbyclient")
            else:
                await route.continue_()
        except Exception as e:  # the context closed while the request was in flight
            logger.debug("routing %s failed: %r", request.url, e)

    async def _route_websocket(self, tab: Any, websocket: Any) -> None:
        if self.policy.allows(websocket.url):
            websocket.connect_to_server()
        else:
            tab.blocked.append(websocket.url)
            await websocket.close(code=1008, reason="blocked by the allow-list")

    async def recover(self, tab: Any) -> str:
        """After a timeout: keep the page if it still answers; else (still loading, or its renderer hangs in a
        script) replace it by a fresh blank page in the same context (cookies kept). Returns a note for the model."""
        try:
            await asyncio.wait_for(tab.page.evaluate("1"), 1.0)
            return ""
        except Exception:
            pass
        old = tab.page
        tab.opening_page = True
        try:
            tab.page = await asyncio.wait_for(tab.context.new_page(), 10.0)
            tab.watch(tab.page)
        except Exception as e:
            logger.warning("could not open a fresh page after a timeout: %r", e)
            return ""
        finally:
            tab.opening_page = False
        asyncio.ensure_future(self._close_page(old))  # a hung renderer may take a while to die: do not wait
        return "The page did not respond and was replaced by a blank page (cookies are kept)."

    @staticmethod
    async def _close_page(page: Any) -> None:
        try:
            await asyncio.wait_for(page.close(run_before_unload=False), 10.0)
        except Exception as e:
            logger.debug("closing a hung page failed: %r", e)

    async def close_tab(self, tab: Any) -> None:
        self._tabs.pop(id(tab), None)
        try:
            await tab.context.close()
        except Exception as e:  # the browser is already gone
            logger.debug("closing a browser context failed: %r", e)

    def _driver(self) -> Any:
        """The Playwright driver's ``asyncio.subprocess.Process`` (Playwright has no public handle to it)."""
        try:
            return self._playwright_manager._client._transport._proc
        except AttributeError:
            return None

    @property
    def driver_pid(self) -> int | None:
        """The Playwright driver (node) process id, once started."""
        driver = self._driver()
        return driver.pid if driver is not None else None

    async def _shutdown(self) -> None:
        for tab in list(self._tabs.values()):
            await self.close_tab(tab)
        if self._browser is not None:
            try:
                await asyncio.wait_for(self._browser.close(), 10.0)
            except Exception as e:
                logger.debug("closing Chromium: %r", e)
        if self._playwright is not None:
            try:
                await asyncio.wait_for(self._playwright.stop(), 3.0)
            except Exception as e:
                # The driver exits on EOF of its stdin; a forked child (an AsyncVectorEnv worker, a
                # DataLoader worker) that inherited that pipe keeps it open, so end the driver directly.
                logger.debug("stopping Playwright: %r; killing its driver", e)
                driver = self._driver()
                try:
                    driver.kill()
                    await asyncio.wait_for(driver.wait(), 5.0)
                    driver._transport.close()  # asyncio's; its pipes would otherwise be closed after the loop
                except (AttributeError, ProcessLookupError, TimeoutError) as e:
                    logger.warning("could not end the Playwright driver: %r", e)
                await asyncio.sleep(0.05)
        self._browser = self._playwright = self._playwright_manager = None

    def close(self, timeout_s: float = 30.0) -> None:
        """Close every context and Chromium, stop Playwright, end the loop thread (idempotent)."""
        if self.closed:
            return
        try:
            self.call(self._shutdown(), timeout_s)
        except Exception as e:
            logger.warning("browser shutdown did not finish: %r", e)
        self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=timeout_s)
        if not self.thread.is_alive():
            self.loop.close()
