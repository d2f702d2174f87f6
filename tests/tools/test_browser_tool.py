"""BrowserTool against a real headless Chromium and local servers: actions, allow-list, isolation, limits."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import socket
import threading
import time
from pathlib import Path

import pytest

from gym_llm.tools import BrowserTool, ToolCall
from gym_llm.tools.browser import ACTION_NAMES, BrowserConfig, HostPolicy, HostRule
from gym_llm.tools.browser.config import find_chromium, resolver_rules
from tests.tools.browser_server import Pages, RecordingServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def forbidden():
    server = RecordingServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def site(forbidden):
    server = RecordingServer(Pages(forbidden.origin))
    yield server
    server.close()


@pytest.fixture(scope="module")
def tool(site):
    tool = BrowserTool(allowed_hosts=[f"127.0.0.1:{site.port}"], timeout_s=10.0, max_output_chars=900)
    tool.attach()
    yield tool
    tool.detach()


@pytest.fixture(scope="module")
def quick_tool(site):
    """A tool with a short per-action limit, for the pages that never finish."""
    tool = BrowserTool(allowed_hosts=[f"127.0.0.1:{site.port}"], timeout_s=3.0)
    tool.attach()
    yield tool
    tool.detach()


@pytest.fixture
def session(tool):
    session = tool.open_session()
    yield session
    session.close()


def act(session, action: str, **arguments):
    return session.run(ToolCall("browser_" + action, arguments))


def test_navigate_read_click_type_links_back(session, site):
    result = act(session, "navigate", url=site.origin + "/")
    assert result.status == "ok" and f"URL: {site.origin}/" in result.content and "Title: Home" in result.content
    assert 'link "Second page" [ref=' in result.content and "pelican" in result.content  # snapshot with refs
    text = act(session, "read").content
    assert "The secret word is pelican." in text and "[ref=" not in text  # read: plain text
    ref = next(line for line in result.content.splitlines() if 'link "Second page"' in line).split("[ref=")[1].split("]")[0]
    assert "You made it." in act(session, "click", ref=ref).content
    assert "The secret word" in act(session, "back").content
    assert "You made it." in act(session, "click", text="Second page").content
    act(session, "navigate", url="/")  # relative to the current page
    links = act(session, "links").content
    assert f"- Second page: {site.origin}/second" in links
    assert "Forbidden link" in links and "(not allowed)" in links
    act(session, "type", field="Colour", text="green")  # a <select>: choose the option
    result = act(session, "type", field="Query", text="tide clock", submit=True)
    assert "Results for q=tide+clock&c=green" in result.content


def test_disallowed_host_receives_nothing(session, site, forbidden):
    result = act(session, "navigate", url=forbidden.origin + "/page")
    assert result.status == "error" and "not on the allow-list" in result.content
    act(session, "navigate", url=site.origin + "/")
    clicked = act(session, "click", text="Forbidden link")
    assert "Blocked:" in clicked.content and forbidden.origin in clicked.content
    act(session, "navigate", url=site.origin + "/leaky")
    act(session, "click", text="Send")  # a form POST to the forbidden server
    expected = [forbidden.origin + path for path in ("/page", "/img.png", "/script.js", "/style.css", "/frame",
                                                     "/fetch", "/post", "/beacon", "/pixel")]
    websocket = f"ws://127.0.0.1:{forbidden.port}/ws"

    def all_aborted() -> bool:  # beacons and sockets fire asynchronously
        blocked = session.blocked
        return all(url in blocked for url in expected) and any(url.startswith(websocket) for url in blocked)

    deadline = time.monotonic() + 15
    while not all_aborted() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [url for url in expected if url not in session.blocked] == []  # aborted by the routing layer
    assert any(url.startswith(websocket) for url in session.blocked)
    assert forbidden.hits == []


def test_webrtc_and_webtransport_send_nothing(session, site):
    """Traffic the HTTP routing layer never sees: STUN and TURN (UDP and TCP) from RTCPeerConnection, QUIC from
    WebTransport — from the page and from an iframe. A UDP and a TCP listener on the port they aim at hear nothing."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    port = udp.getsockname()[1]
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("127.0.0.1", port))
    tcp.listen(4)
    site.pages.egress_port = port
    try:
        result = act(session, "navigate", url=site.origin + "/egress")
        assert result.status == "ok", result.content
        udp.settimeout(3.0)
        with pytest.raises(socket.timeout):
            print("UDP RECEIVED", udp.recvfrom(2048))
        tcp.settimeout(0.5)
        with pytest.raises(socket.timeout):
            print("TCP CONNECTED", tcp.accept())
        text = act(session, "read").content
        assert "candidate" not in text, text  # no ICE candidate, not even a host one
    finally:
        udp.close()
        tcp.close()


def test_redirect_hop_to_a_disallowed_port_is_stopped_by_the_resolver_layer(session, site, forbidden):
    # Playwright's routing never sees redirect hops; Chromium's resolver rules allow only 127.0.0.1:<site port>.
    result = act(session, "navigate", url=site.origin + "/redirect-out")
    assert result.status == "error" and "ERR_NAME_NOT_RESOLVED" in result.content
    assert forbidden.hits == []


def test_every_episode_gets_its_own_context(tool, site):
    first, second = tool.open_session(), tool.open_session()
    try:
        act(first, "navigate", url=site.origin + "/set-storage")
        assert "cookie=[episode=alpha] stored=[v1]" in act(first, "navigate", url=site.origin + "/storage").content
        assert "cookie=[] stored=[]" in act(second, "navigate", url=site.origin + "/storage").content
    finally:
        first.close(), second.close()
    third = tool.open_session()
    try:  # a later episode starts clean as well
        assert "cookie=[] stored=[]" in act(third, "navigate", url=site.origin + "/storage").content
    finally:
        third.close()
    assert tool.runtime.launches == 1 and tool.runtime.tabs_opened >= 3  # one Chromium, one context per episode


def test_downloads_are_refused(session, site):
    act(session, "navigate", url=site.origin + "/")
    clicked = act(session, "click", text="Get the report")
    assert clicked.status == "ok" and "Refused a download of 'report.csv'" in clicked.content
    assert "a,b" not in clicked.content
    result = act(session, "navigate", url=site.origin + "/download")
    assert result.status == "error" and "file download" in result.content
    assert "Refused a download" not in act(session, "read").content  # reported once, not again


def test_slow_page_times_out_and_the_session_goes_on(quick_tool, site):
    session = quick_tool.open_session()
    try:
        result = act(session, "navigate", url=site.origin + "/slow")  # the server does not answer
        assert result.status == "timeout" and "3 s limit" in result.content
        assert act(session, "navigate", url=site.origin + "/second").status == "ok"
    finally:
        site.pages.release.set()
        session.close()


@pytest.mark.parametrize(("page", "delay_s"), [("/hang", 0.05), ("/hang-later", 1.5)])
def test_page_that_hangs_its_renderer_is_replaced(quick_tool, site, page, delay_s):
    session = quick_tool.open_session()
    try:
        result = act(session, "navigate", url=site.origin + page)  # its script loops forever delay_s after load
        if result.status == "ok":  # the page was read before the loop started: the next action meets the hang
            assert "about to hang" in result.content
            time.sleep(delay_s + 0.3)
            result = act(session, "read")
        assert result.status == "timeout" and "replaced by a blank page" in result.content
        assert "You made it." in act(session, "navigate", url=site.origin + "/second").content
    finally:
        session.close()


def _read_on(content: str) -> dict:
    return json.loads(content.rsplit(" with ", 1)[1].split(" to read on")[0])


@pytest.mark.parametrize("view", ["snapshot", "text"])
def test_long_page_is_cut_with_the_arguments_to_read_on(session, site, view):
    act(session, "navigate", url=site.origin + "/long")
    first = act(session, "read", format=view)
    assert first.truncated and len(first.content) < 1100
    shown = [int(n) for n in re.findall(r"Line (\d{4})", first.content)]
    arguments = _read_on(first.content)
    assert arguments.get("format", "text") == view
    second = act(session, "read", **arguments)
    assert second.truncated and "characters before this skipped ...]" in second.content
    following = [int(n) for n in re.findall(r"Line (\d{4})", second.content)]
    assert shown[-1] < following[0] <= shown[-1] + 2  # picks up where the first part stopped
    assert "past the end" in act(session, "read", offset=10**6).content


def test_many_links_are_capped(session, site):
    act(session, "navigate", url=site.origin + "/many-links")
    result = act(session, "links")
    assert result.truncated and len(result.content) <= 900 and "(250 on the page)" in result.content
    shown = result.content.count("\n- ")
    assert 5 < shown < 250 and f"[... {shown} of the page's 250 links are listed ...]" in result.content


def test_popup_becomes_the_current_page(session, site):
    act(session, "navigate", url=site.origin + "/popup")
    result = act(session, "click", text="Open in a new tab")
    assert "opened a new tab" in result.content and "Title: Second" in result.content
    assert "You made it." in act(session, "read").content


@pytest.mark.parametrize("action, arguments, needle", [
    ("navigate", {}, "missing argument 'url'"),
    ("navigate", {"url": "file:///etc/passwd"}, "only http(s) URLs"),
    ("navigate", {"url": "javascript:alert(1)"}, "only http(s) URLs"),
    ("navigate", {"url": 3}, "'url' must be a str"),
    ("click", {"ref": "e1", "text": "x"}, "exactly one of 'ref' or 'text'"),
    ("click", {"ref": "e9999"}, "no element [ref=e9999]"),
    ("click", {"ref": "body > a"}, "ref must look like 'e12'"),
    ("click", {"text": "No such button"}, "no link, button or text"),
    ("type", {"field": "Nope", "text": "x"}, "no input field"),
    ("type", {"field": "Query"}, "missing argument 'text'"),
    ("read", {"format": "html"}, "format must be 'text' or 'snapshot'"),
    ("read", {"offset": -1}, "integer >= 0"),
    ("links", {"all": True}, "unknown argument(s) ['all']"),
])
def test_bad_arguments_get_an_error_message_and_change_nothing(session, site, action, arguments, needle):
    act(session, "navigate", url=site.origin + "/")
    result = act(session, action, **arguments)
    assert result.status == "error" and needle in result.content
    assert "Title: Home" in act(session, "read", format="snapshot").content


def test_read_before_any_page_and_unknown_function(session):
    assert "no page is open yet" in act(session, "read").content
    result = session.run(ToolCall("browser_screenshot", {}))
    assert result.status == "invalid" and "browser_navigate" in result.content


def test_sessions_run_concurrently_from_many_threads(tool, site):
    sessions = [tool.open_session() for _ in range(4)]
    paths = ["/", "/second", "/popup", "/long"]
    results: dict[int, str] = {}

    def browse(i):
        results[i] = act(sessions[i], "navigate", url=site.origin + paths[i]).content

    threads = [threading.Thread(target=browse, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for session in sessions:
        session.close()
    assert [f"URL: {site.origin}{path}" in results[i] for i, path in enumerate(paths)] == [True] * 4


def test_schemas_match_the_actions():
    tool = BrowserTool(name_prefix="web_")
    from gym_llm.tools.browser.actions import ACTIONS

    assert tuple(ACTIONS) == ACTION_NAMES
    assert [s["function"]["name"] for s in tool.schemas()] == [f"web_{a}" for a in ACTION_NAMES]
    assert tool.schemas()[3]["function"]["parameters"]["required"] == ["text"]


def _chromium_pids(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def test_launch_is_lazy_and_detach_stops_chromium(site):
    tool = BrowserTool(allowed_hosts=[f"127.0.0.1:{site.port}", "lazy-marker.test"])
    tool.attach()
    marker = "lazy-marker.test:80"
    assert tool.runtime.launches == 0 and _chromium_pids(marker) == []  # nothing started until the first action
    session = tool.open_session()
    assert act(session, "navigate", url=site.origin + "/second").status == "ok"
    assert _chromium_pids(marker)
    runtime = tool.runtime
    tool.detach()
    assert runtime.closed and not runtime.thread.is_alive()
    deadline = time.monotonic() + 5
    while _chromium_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _chromium_pids(marker) == []
    session.close()  # after the tool is gone: a no-op
    with pytest.raises(RuntimeError, match="not attached"):
        act(session, "read")


def test_a_crashed_browser_is_relaunched_on_the_next_call(site):
    tool = BrowserTool(allowed_hosts=[f"127.0.0.1:{site.port}", "crash-marker.test"])
    tool.attach()
    session = tool.open_session()
    try:
        assert act(session, "navigate", url=site.origin + "/set-storage").status == "ok"
        main = [pid for pid in _chromium_pids("crash-marker.test:80") if "--type=" not in _cmdline(pid)]
        assert len(main) == 1
        os.kill(main[0], 9)  # the browser process itself (not a renderer)
        deadline = time.monotonic() + 10
        while tool.runtime.browser_alive and time.monotonic() < deadline:
            time.sleep(0.1)
        result = act(session, "navigate", url=site.origin + "/storage")
        assert result.status == "ok" and "browser had stopped and was restarted" in result.content
        assert "cookie=[] stored=[]" in result.content and tool.runtime.launches == 2
    finally:
        session.close()
        tool.detach()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_detach_ends_the_driver_even_when_a_forked_child_holds_its_pipe(site):
    tool = BrowserTool(allowed_hosts=[f"127.0.0.1:{site.port}"])
    tool.attach()
    session = tool.open_session()
    assert act(session, "navigate", url=site.origin + "/second").status == "ok"
    driver = tool.runtime.driver_pid
    assert isinstance(driver, int) and Path(f"/proc/{driver}").exists()
    child = os.fork()
    if child == 0:  # holds every inherited descriptor, the driver's stdin among them, until killed
        time.sleep(60)
        os._exit(0)
    try:
        session.close()
        tool.detach()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{driver}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        status = (Path(f"/proc/{driver}/stat").read_text().split()[2] if Path(f"/proc/{driver}").exists() else "gone")
        assert status in ("gone", "Z"), status  # exited (a zombie until asyncio reaps it at most)
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


def test_pickled_tool_is_detached_and_keeps_its_settings(tool):
    copy = pickle.loads(pickle.dumps(tool))
    assert copy.config == tool.config and copy.names == tool.names
    with pytest.raises(RuntimeError, match="not attached"):
        _ = copy.runtime


# ------------------------------------------------------------------------------ no browser needed
def test_allow_list_rules():
    policy = HostPolicy.from_config(BrowserConfig(allowed_hosts=("Example.com", "127.0.0.1:8000", "*.wiki.test",
                                                                 "any.test:*", "[::1]:9000"),
                                                  host_map={"site.test": "127.0.0.1:5555"}))
    allowed = ["http://example.com/", "https://example.com/x", "http://EXAMPLE.com./", "http://127.0.0.1:8000/",
               "http://en.wiki.test/", "http://any.test:1234/", "ws://127.0.0.1:8000/ws", "http://[::1]:9000/",
               "http://site.test/"]
    denied = ["http://example.com:8080/", "http://sub.example.com/", "http://127.0.0.1:8001/", "http://wiki.test/",
              "file:///etc/passwd", "data:text/html,x", "ftp://example.com/", "http://127.0.0.1:5555/",
              "https://site.test/", "http://site.test:81/", "http://[::1]:9001/", "http://example.com:99999/",
              "http://evil.com/?example.com", "http://example.com@evil.com/"]
    assert [u for u in allowed if not policy.allows(u)] == []
    assert [u for u in denied if policy.allows(u)] == []
    assert HostPolicy([]).allows("http://example.com/") is False


@pytest.mark.parametrize("entry, needle", [
    ("http://example.com/", "is a URL"), ("example.com:0", "invalid port"), ("exa mple.com", "invalid host"),
    ("", "non-empty"), ("[::1", "unclosed"),
])
def test_bad_allow_list_entries_are_rejected(entry, needle):
    with pytest.raises(ValueError, match=needle):
        HostRule.parse(entry)


def test_bad_settings_are_rejected():
    with pytest.raises(TypeError, match="Unknown BrowserTool setting"):
        BrowserTool(timeout=3)
    with pytest.raises(TypeError, match="list of str"):
        BrowserTool(allowed_hosts="example.com")
    with pytest.raises(ValueError, match="timeout_s"):
        BrowserTool(timeout_s=0)
    with pytest.raises(ValueError, match="host_map keys"):
        BrowserTool(host_map={"*.site.test": "127.0.0.1:1"})
    with pytest.raises(ValueError, match="'ip:port'"):
        BrowserTool(host_map={"site.test": "127.0.0.1"})
    with pytest.raises(ValueError, match="must not set --host-resolver-rules"):
        BrowserTool(extra_args=["--host-resolver-rules=MAP * 1.2.3.4"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BrowserTool(executable_path="/nonexistent/chromium").attach()


def test_resolver_rules_are_port_exact_for_exact_entries():
    rules = resolver_rules(BrowserConfig(allowed_hosts=("127.0.0.1:8000", "*.wiki.test", "any.test:*")))
    assert rules == "MAP 127.0.0.1:8000 127.0.0.1:8000, MAP * ~NOTFOUND, EXCLUDE *.wiki.test, EXCLUDE any.test"


def test_find_chromium_reports_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(tmp_path))
    monkeypatch.delenv("GYM_LLM_CHROMIUM", raising=False)
    with pytest.raises(FileNotFoundError, match="apt-get install chromium"):
        find_chromium(None)
    fake = tmp_path / "chromium"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert find_chromium(None) == str(fake)


def test_importing_the_tool_does_not_import_playwright():
    code = ("import sys, gym_llm.tools.browser, gym_llm.envs.browser; gym_llm.tools.BrowserTool(allowed_hosts=['a.test']); "
            "print(any(m.startswith('playwright') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([".", "adapters"])}).stdout
    assert out.strip() == "False"
