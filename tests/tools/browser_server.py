"""Local HTTP servers for the browser tool tests: an allowed site with tricky pages, and a forbidden one.

The forbidden server records every request it receives; the tests assert that it receives none.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RecordingServer:
    """A 127.0.0.1 server on a free port; ``hits`` lists the paths it was asked for."""

    def __init__(self, pages: "Pages | None" = None):
        self.hits: list[str] = []
        self.pages = pages
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.hits.append(self.path)
                status, headers, body = server.pages.render(self.path) if server.pages else (200, {}, b"forbidden data")
                self.send_response(status)
                headers.setdefault("Content-Type", "text/html; charset=utf-8")
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_POST = do_GET

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _html(title: str, body: str) -> bytes:
    return f"<!doctype html><html><head><title>{title}</title></head><body>{body}</body></html>".encode()


EGRESS_SCRIPT = """
const log = (text) => { const out = document.getElementById("out"); if (out) out.textContent += " | " + text; };
const servers = [{urls: "stun:127.0.0.1:PORT"}, {urls: "turn:127.0.0.1:PORT?transport=udp", username: "u", credential: "p"},
                 {urls: "turn:127.0.0.1:PORT?transport=tcp", username: "u", credential: "p"}];
for (const Peer of [window.RTCPeerConnection, window.webkitRTCPeerConnection]) {
  try {
    const pc = new Peer({iceServers: servers, iceTransportPolicy: "all"});
    pc.createDataChannel("leak");
    pc.onicecandidate = (e) => { if (e.candidate) log("candidate " + e.candidate.candidate); };
    pc.createOffer().then((offer) => pc.setLocalDescription(offer)).catch((e) => log("offer " + e));
    log("peer created");
  } catch (e) { log("rtc " + e); }
}
try { new WebTransport("https://127.0.0.1:PORT/leak").ready.catch((e) => log("wt " + e)); log("wt created"); }
catch (e) { log("wt " + e); }
"""


class Pages:
    """The allowed site. ``forbidden`` is the origin of the server nothing may reach."""

    def __init__(self, forbidden: str):
        self.forbidden = forbidden
        self.release = threading.Event()  # /slow answers only once this is set (or after 30 s)
        self.egress_port = 9  # /egress aims its non-HTTP traffic here (the test sets a port it listens on)

    def render(self, path: str) -> tuple[int, dict[str, str], bytes]:
        f = self.forbidden
        if path == "/":
            return 200, {}, _html("Home", (
                "<h1>Test home</h1><p>The secret word is <b>pelican</b>.</p>"
                '<a href="/second">Second page</a> <a href="/download">Get the report</a> '
                f'<a href="{f}/page">Forbidden link</a> <a href="/popup">Popups</a> '
                '<form action="/search"><label>Query <input name="q"></label>'
                '<label>Colour <select name="c"><option>red</option><option>green</option></select></label>'
                "<button>Find</button></form>"))
        if path == "/second":
            return 200, {}, _html("Second", "<h1>Second page</h1><p>You made it.</p>")
        if path.startswith("/search"):
            return 200, {}, _html("Results", f"<h1>Results for {path.split('?', 1)[-1]}</h1>")
        if path == "/download":
            headers = {"Content-Type": "text/csv", "Content-Disposition": 'attachment; filename="report.csv"'}
            return 200, headers, b"a,b\n1,2\n"
        if path == "/slow":
            self.release.wait(30.0)
            return 200, {}, _html("Slow", "<p>finally</p>")
        if path in ("/hang", "/hang-later"):  # the renderer loops forever 50 ms / 1.5 s after load
            delay = 50 if path == "/hang" else 1500
            return 200, {}, _html("Hang", f"<p>about to hang</p><script>setTimeout(() => {{ while (true) {{}} }}, {delay})</script>")
        if path == "/long":
            return 200, {}, _html("Long", "".join(f"<p>Line {i:04d} of the long page.</p>" for i in range(400)))
        if path == "/many-links":
            return 200, {}, _html("Links", "".join(f'<a href="/item/{i}">Item {i}</a> ' for i in range(250)))
        if path == "/popup":
            return 200, {}, _html("Popups", '<a href="/second" target="_blank">Open in a new tab</a>')
        if path == "/redirect-out":  # a redirect hop: Playwright's routing does not see it
            return 302, {"Location": f"{f}/via-redirect"}, b""
        if path == "/storage":
            return 200, {}, _html("Storage", "<p id=out></p><script>"
                                  "document.getElementById('out').textContent = 'cookie=[' + document.cookie + '] stored=['"
                                  " + (localStorage.getItem('k') || '') + ']';</script>")
        if path == "/set-storage":
            script = "<script>localStorage.setItem('k', 'v1')</script>"
            return 200, {"Set-Cookie": "episode=alpha; Path=/"}, _html("Set", "<p>set</p>" + script)
        if path == "/leaky":  # every kind of sub-request to the forbidden server
            return 200, {}, _html("Leaky", (
                f'<p>leaky page</p><img src="{f}/img.png"><script src="{f}/script.js"></script>'
                f'<link rel="stylesheet" href="{f}/style.css"><iframe src="{f}/frame"></iframe>'
                f'<script>fetch("{f}/fetch").catch(() => 0); new WebSocket("{f.replace("http", "ws")}/ws");'
                f'navigator.sendBeacon("{f}/beacon", "x"); new Image().src = "{f}/pixel";</script>'
                f'<form id="f" method="post" action="{f}/post"><input name="a" value="1"></form>'
                '<button onclick="document.getElementById(\'f\').submit()">Send</button>'))
        if path == "/egress":  # traffic that HTTP routing never sees: WebRTC (UDP and TCP), WebTransport (QUIC)
            p = self.egress_port
            return 200, {}, _html("Egress", "<p id=out>egress page</p><script>" + EGRESS_SCRIPT.replace("PORT", str(p))
                                  + "</script><iframe srcdoc=\"<script>" + EGRESS_SCRIPT.replace("PORT", str(p))
                                  .replace('"', "&quot;") + "</script>\"></iframe>")
        return 404, {}, _html("Not found", "<p>no such page</p>")
