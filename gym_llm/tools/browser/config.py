"""Settings of the browser tool, and its host allow-list.

The allow-list is enforced twice, by independent layers:

1. **Routing** (per browser context): every request a page makes — documents, scripts, XHR/fetch,
   forms, images, WebSockets — goes through a Playwright route handler that aborts it unless
   :meth:`HostPolicy.allows` says yes (scheme, host and port).
2. **Name resolution** (per browser process): Chromium starts with ``--host-resolver-rules`` that
   make every host name and IP literal outside the allow-list unresolvable (see :func:`resolver_rules`),
   so what routing does not see — redirect hops, browser-internal fetches, prefetches — still cannot
   connect. Exact ``host:port`` entries are port-exact here too; wildcard entries are host-only.

Traffic that is neither HTTP(S) nor a WebSocket — WebRTC's STUN/TURN (UDP, and TCP to IP literals that need no
resolving) and WebTransport's QUIC — would bypass both, so it is off: Chromium runs without QUIC and with WebRTC
restricted to proxied UDP with no proxy (it gathers no candidate, sends no packet), and the runtime deletes those
constructors from every frame before its scripts run. A hostile page's STUN, TURN and WebTransport attempts are
tested against UDP and TCP listeners.

>>> policy = HostPolicy.from_config(BrowserConfig(allowed_hosts=("example.com", "127.0.0.1:8000", "*.wiki.test")))
>>> [policy.allows(u) for u in ("https://example.com/a", "http://example.com:8080/", "http://127.0.0.1:8000/x",
...                             "http://127.0.0.1:8001/", "http://en.wiki.test/", "file:///etc/passwd")]
[True, False, True, False, True, False]
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence
from urllib.parse import urlsplit

__all__ = ["BrowserConfig", "HostPolicy", "HostRule", "find_chromium", "resolver_rules"]

PageView = Literal["snapshot", "text"]

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_HOST_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
_ENTRY_FORMS = "'example.com', 'example.com:8080', 'example.com:*', '*.example.com', '127.0.0.1:8000', '[::1]:8000'"
_CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")

# Flags for a headless Chromium that never phones home (these hosts are unreachable anyway and each
# refused connection costs time), runs in containers with a small /dev/shm, and sends nothing but HTTP(S) and
# WebSockets, the traffic the routing layer sees: no QUIC (so no WebTransport either), and WebRTC may only use a
# proxy for UDP — there is none, so it gathers no candidate and sends no STUN/TURN packet.
CHROMIUM_FLAGS = (
    "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--disable-breakpad",
    "--disable-domain-reliability", "--metrics-recording-only", "--no-default-browser-check",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
)


@dataclass(frozen=True, slots=True)
class HostRule:
    """One allow-list entry: a host (or ``*.suffix``) and a port (``None``: the scheme's default; ``-1``: any)."""

    host: str
    port: int | None = None

    @classmethod
    def parse(cls, entry: str) -> "HostRule":
        """``'host'``, ``'host:port'``, ``'host:*'``, ``'*.host'``, ``'[v6]:port'`` -> rule.

        Raises:
            ValueError: a scheme, path, bad port or malformed host (the message shows the accepted forms).
        """
        if not isinstance(entry, str) or not entry.strip():
            raise ValueError(f"allowed_hosts entries must be non-empty strings like {_ENTRY_FORMS}; got {entry!r}.")
        text = entry.strip().lower()
        if "/" in text or "@" in text or "?" in text or "#" in text:
            raise ValueError(f"allowed_hosts entry {entry!r} is a URL; give only the host and optional port, "
                             f"e.g. {_ENTRY_FORMS}.")
        host, port = _split_host_port(text, entry)
        wildcard = host.startswith("*.")
        name = host[2:] if wildcard else host
        if not _valid_host(name):
            raise ValueError(f"allowed_hosts entry {entry!r} has an invalid host {name!r}; accepted forms: {_ENTRY_FORMS}.")
        return cls(host, port)

    def matches(self, host: str, port: int, scheme: str) -> bool:
        if self.host.startswith("*."):
            if not host.endswith(self.host[1:]):
                return False
        elif host != self.host:
            return False
        if self.port == -1:
            return True
        return port == (self.port if self.port is not None else _DEFAULT_PORTS.get(scheme))

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{'*' if self.port == -1 else self.port}"


def _split_host_port(text: str, entry: str) -> tuple[str, int | None]:
    if text.startswith("["):  # [v6] or [v6]:port
        close = text.find("]")
        if close < 0:
            raise ValueError(f"allowed_hosts entry {entry!r} has an unclosed '['.")
        host, rest = text[1:close], text[close + 1:]
        if rest and not rest.startswith(":"):
            raise ValueError(f"allowed_hosts entry {entry!r}: expected ':port' after ']'.")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif text.count(":") > 1:
        host, port_text = text, None  # a bare IPv6 literal
    else:
        host, port_text = text, None
    if port_text is None:
        return host.rstrip("."), None
    if port_text == "*":
        return host.rstrip("."), -1
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"allowed_hosts entry {entry!r} has an invalid port {port_text!r} (1-65535 or '*').")
    return host.rstrip("."), int(port_text)


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.split(".")
    return bool(host) and len(host) <= 253 and all(_HOST_LABEL.match(label) for label in labels)


@dataclass(frozen=True, kw_only=True)
class BrowserConfig:
    """Settings of a :class:`~gym_llm.tools.browser.BrowserTool`.

    Attributes:
        allowed_hosts: hosts pages may reach (requests elsewhere are aborted): ``'example.com'`` (its
            default ports 80/443), ``'example.com:8080'``, ``'example.com:*'`` (any port), ``'*.example.com'``
            (subdomains), IP literals. Empty (the default) blocks every request.
        host_map: virtual host -> ``'ip:port'`` the browser connects to instead (Chromium's host resolver
            rules; the page keeps its virtual URL, ``Host`` header and cookies). Mapped hosts are allowed.
        timeout_s: per action: navigation, click, typing and reading the result together.
        max_output_chars: longest tool message; longer pages are cut with a marker that says how to
            read on (``offset``).
        max_links: most links listed by the links action.
        page_view: what navigate/click/type/back answer with: ``"snapshot"`` (Playwright's accessibility
            snapshot for AI agents: roles, names, text, ``[ref=eN]`` handles for click/type) or ``"text"``
            (the page's visible text, compact, no handles).
        javascript: run page scripts.
        blocked_resource_types: request types aborted for speed (a text agent never sees them).
        executable_path: the Chromium binary; default ``$GYM_LLM_CHROMIUM``, else ``chromium`` (and
            friends) on ``PATH``, else Playwright's own download.
        chromium_sandbox: run Chromium's own sandbox (needs a non-root user or a kernel that allows it).
        extra_args: more Chromium command-line flags.
        viewport: ``(width, height)`` in CSS pixels.
        locale: the browser's locale (``Accept-Language``, ``navigator.language``).
    """

    allowed_hosts: tuple[str, ...] = ()
    host_map: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    max_output_chars: int = 6_000
    max_links: int = 100
    page_view: PageView = "snapshot"
    javascript: bool = True
    blocked_resource_types: tuple[str, ...] = ("image", "media", "font")
    executable_path: str | None = None
    chromium_sandbox: bool = False
    extra_args: tuple[str, ...] = ()
    viewport: tuple[int, int] = (1280, 800)
    locale: str = "en-US"

    def __post_init__(self) -> None:
        for name in ("allowed_hosts", "blocked_resource_types", "extra_args"):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"{name} must be a list of str, got {value!r}.")
            object.__setattr__(self, name, tuple(value))
        for entry in self.allowed_hosts:
            HostRule.parse(entry)
        object.__setattr__(self, "host_map", _check_host_map(self.host_map))
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be a number > 0, got {self.timeout_s!r}.")
        for name in ("max_output_chars", "max_links"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        if self.page_view not in ("snapshot", "text"):
            raise ValueError(f"page_view must be 'snapshot' or 'text', got {self.page_view!r}.")
        if (not isinstance(self.viewport, Sequence) or len(self.viewport) != 2
                or not all(isinstance(v, int) and v > 0 for v in self.viewport)):
            raise ValueError(f"viewport must be (width, height) in pixels, got {self.viewport!r}.")
        object.__setattr__(self, "viewport", tuple(self.viewport))
        if any(flag.startswith("--host-resolver-rules") for flag in self.extra_args):
            raise ValueError("extra_args must not set --host-resolver-rules: the tool sets it from allowed_hosts "
                             "and host_map; use host_map={'site.test': '127.0.0.1:8000'} instead.")

    def chromium_args(self) -> list[str]:
        """Command-line flags: :data:`CHROMIUM_FLAGS`, the resolver rules (layer 2), ``extra_args``."""
        return [*CHROMIUM_FLAGS, f"--host-resolver-rules={resolver_rules(self)}", *self.extra_args]


def resolver_rules(config: BrowserConfig) -> str:
    """Chromium ``--host-resolver-rules`` that let only the allow-list resolve (layer 2).

    The first matching ``MAP`` wins and a pattern may name a port, so exact entries become identity maps
    (``MAP h:p h:p``) ahead of ``MAP * ~NOTFOUND``: a redirect to another port of an allowed host fails to
    resolve too (Playwright's routing does not see redirect hops). ``host:*`` and ``*.host`` entries can
    only be excluded by host (``EXCLUDE``), so for them a redirect hop is checked by host, not by port.

    >>> resolver_rules(BrowserConfig(allowed_hosts=("a.test:8000", "b.test"), host_map={"site.test": "127.0.0.1:9"})
    ...                ).split(", ")  # doctest: +NORMALIZE_WHITESPACE
    ['MAP site.test:80 127.0.0.1:9', 'MAP a.test:8000 a.test:8000', 'MAP b.test:80 b.test:80',
     'MAP b.test:443 b.test:443', 'MAP * ~NOTFOUND']
    """
    rules = [f"MAP {host}:80 {target}" for host, target in config.host_map.items()]
    excluded = []
    for entry in config.allowed_hosts:
        rule = HostRule.parse(entry)
        host = f"[{rule.host}]" if ":" in rule.host else rule.host
        if rule.port == -1 or rule.host.startswith("*."):
            excluded.append(f"EXCLUDE {host}")
        else:
            ports = (80, 443) if rule.port is None else (rule.port,)
            rules.extend(f"MAP {host}:{port} {host}:{port}" for port in ports)
    return ", ".join([*rules, "MAP * ~NOTFOUND", *excluded])


def _check_host_map(host_map: Any) -> dict[str, str]:
    if not isinstance(host_map, Mapping):
        raise TypeError(f"host_map must be a dict {{virtual host: 'ip:port'}}, got {type(host_map).__name__}.")
    out = {}
    for host, target in host_map.items():
        rule = HostRule.parse(host) if isinstance(host, str) else None
        if rule is None or rule.port is not None or rule.host.startswith("*."):
            raise ValueError(f"host_map keys must be plain host names like 'site.test', got {host!r}.")
        target_host, _, port = str(target).rpartition(":")
        if not (isinstance(target, str) and _valid_host(target_host.strip("[]")) and port.isdigit()):
            raise ValueError(f"host_map[{host!r}] must be 'ip:port' (e.g. '127.0.0.1:8000'), got {target!r}.")
        out[rule.host] = target
    return out


class HostPolicy:
    """Decides whether a URL may be requested (routing layer). Schemes: http(s) and ws(s) only."""

    def __init__(self, rules: Sequence[HostRule]):
        self.rules = tuple(rules)

    @classmethod
    def from_config(cls, config: BrowserConfig) -> "HostPolicy":
        rules = [HostRule.parse(entry) for entry in config.allowed_hosts]
        rules.extend(HostRule(host, 80) for host in config.host_map)  # mapped hosts: http on port 80 only
        return cls(rules)

    def allows(self, url: str) -> bool:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            return False
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.hostname:
            return False
        host = parts.hostname.lower().rstrip(".")
        port = port if port is not None else _DEFAULT_PORTS[scheme]
        return any(rule.matches(host, port, scheme) for rule in self.rules)

    def describe(self) -> str:
        return ", ".join(str(rule) for rule in self.rules) or "(none)"


def find_chromium(executable_path: str | None) -> str | None:
    """The Chromium binary to launch: ``executable_path``, ``$GYM_LLM_CHROMIUM``, a ``chromium`` on PATH,
    or ``None`` when Playwright's own downloaded Chromium is installed.

    Raises:
        FileNotFoundError: none of these exists; the message says how to install one.
    """
    explicit = executable_path or os.environ.get("GYM_LLM_CHROMIUM")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise FileNotFoundError(f"The Chromium executable {explicit!r} does not exist or is not executable.")
        return explicit
    for name in _CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    cache = Path(os.environ.get("PLAYWRIGHT_BROWSERS_PATH") or Path.home() / ".cache" / "ms-playwright")
    if cache.is_dir() and any(p.name.startswith("chromium") for p in cache.iterdir()):
        return None
    raise FileNotFoundError(
        "The browser tool needs Chromium and found none. Install the system one (Debian/Ubuntu: "
        "apt-get install chromium) or Playwright's (python -m playwright install chromium), or pass "
        "executable_path=... / set GYM_LLM_CHROMIUM."
    )
