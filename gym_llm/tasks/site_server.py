"""A local HTTP server for browser tasks: the Larkspur Harbor site, or a folder of static files.

The server binds ``127.0.0.1`` on a free port and runs in a daemon thread (``http.server``'s
``ThreadingHTTPServer``: one thread per connection). Pages use relative links only, so the site works
under any host name — ``LLMBrowser-v0`` serves it as ``http://larkspur.test/`` through the browser's
host map.
"""

from __future__ import annotations

import functools
import html
import json
import logging
import secrets
import threading
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from os import PathLike
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

from gym_llm.tasks.larkspur import ACCOUNTS, ARTICLES, FERRY, PRODUCTS, PRODUCTS_PER_PAGE

__all__ = ["SiteServer"]

logger = logging.getLogger(__name__)

_COOKIE = "hs_session"
_MAX_BODY_BYTES = 16_384
_LINK = "[["


class SiteServer:
    """Serves the Larkspur Harbor site (default) or the static files under ``directory``.

    Attributes:
        port: the port it listens on (``127.0.0.1``).
        address: ``"127.0.0.1:<port>"``.
        request_count: requests answered so far.

    >>> server = SiteServer()
    >>> import urllib.request
    >>> b"Greywater" in urllib.request.urlopen(f"http://{server.address}/wiki/").read()
    True
    >>> server.close()
    """

    def __init__(self, directory: str | PathLike | None = None):
        if directory is not None:
            path = Path(directory)
            if not path.is_dir():
                raise FileNotFoundError(f"site_dir {str(path)!r} is not a directory; pass a folder of .html files.")
            handler = functools.partial(_StaticHandler, directory=str(path))
        else:
            handler = _LarkspurHandler
        self.sessions: dict[str, str] = {}
        self.request_count = 0
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.site = self  # type: ignore[attr-defined]  # handlers reach the shared state through it
        self.port = int(self.httpd.server_address[1])
        self.address = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="gym_llm_site", daemon=True)
        self._thread.start()
        self.closed = False

    def count(self) -> None:
        with self._lock:
            self.request_count += 1

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5.0)

    def __repr__(self) -> str:
        return f"SiteServer({self.address}, closed={self.closed})"


class _StaticHandler(SimpleHTTPRequestHandler):
    def handle_one_request(self) -> None:
        self.server.site.count()  # type: ignore[attr-defined]
        super().handle_one_request()

    def log_message(self, format: str, *args) -> None:
        logger.debug("site: " + format, *args)


def _page(title: str, body: str) -> str:
    nav = " | ".join(f'<a href="{href}">{label}</a>' for href, label in
                     (("/", "Home"), ("/wiki/", "Wiki"), ("/shop/", "Shop"), ("/ferry", "Ferry"), ("/account", "Account")))
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)} - Larkspur '
            f"Harbor</title></head><body><nav>{nav}</nav><main><h1>{html.escape(title)}</h1>{body}</main>"
            "<footer><p>Larkspur Harbor town portal</p></footer></body></html>")


def _wiki_text(paragraph: str, *, links: bool) -> str:
    """``[[slug|text]]`` markup -> HTML links (or plain text for searching)."""
    out, rest = [], paragraph
    while _LINK in rest:
        before, _, tail = rest.partition(_LINK)
        target, _, rest = tail.partition("]]")
        slug, _, text = target.partition("|")
        out.append(html.escape(before) if links else before)
        out.append(f'<a href="/wiki/{quote(slug)}">{html.escape(text)}</a>' if links else text)
    out.append(html.escape(rest) if links else rest)
    return "".join(out)


def _table(header: tuple[str, ...], rows) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class _LarkspurHandler(BaseHTTPRequestHandler):
    server_version = "Larkspur/1.0"

    def log_message(self, format: str, *args) -> None:
        logger.debug("site: " + format, *args)

    # -------------------------------------------------------------------------------- plumbing
    def _send(self, status: int, body: str = "", headers: dict[str, str] | None = None) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _redirect(self, location: str, headers: dict[str, str] | None = None) -> None:
        self._send(303, "", {"Location": location, **(headers or {})})

    def _user(self) -> str | None:
        cookie = SimpleCookie(self.headers.get("Cookie", ""))
        token = cookie[_COOKIE].value if _COOKIE in cookie else None
        return self.server.site.sessions.get(token) if token else None  # type: ignore[attr-defined]

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        self.server.site.count()  # type: ignore[attr-defined]
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = url.path
        if path == "/":
            return self._send(200, _home())
        if path in ("/wiki", "/wiki/"):
            return self._send(200, _wiki_index())
        if path == "/wiki/search":
            return self._send(200, _wiki_search(query.get("q", "")))
        if path.startswith("/wiki/"):
            article = next((a for a in ARTICLES if a.slug == path[len("/wiki/"):]), None)
            if article is not None:
                return self._send(200, _article(article))
        if path in ("/shop", "/shop/"):
            return self._send(200, _shop(query.get("page", "1")))
        if path.startswith("/shop/item/"):
            product = next((p for p in PRODUCTS if str(p.item_id) == path[len("/shop/item/"):]), None)
            if product is not None:
                return self._send(200, _product(product))
        if path == "/account":
            user = self._user()
            return self._send(200, _account(user)) if user else self._redirect("/account/login")
        if path == "/account/login":
            return self._send(200, _login(bool(query.get("error"))))
        if path == "/ferry":
            return self._send(200, _ferry(query.get("to")))
        self._send(404, _page("Page not found", f"<p>There is no page at {html.escape(path)}.</p>"))

    def do_POST(self) -> None:
        self.server.site.count()  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY_BYTES:
            return self._send(413, _page("Too large", "<p>The form is too large.</p>"))
        form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode("utf-8", "replace")).items()}
        path = urlsplit(self.path).path
        sessions = self.server.site.sessions  # type: ignore[attr-defined]
        if path == "/account/login":
            account = ACCOUNTS.get(form.get("username", "").strip().lower())
            if account is None or form.get("password") != account[0]:
                return self._redirect("/account/login?error=1")
            token = secrets.token_hex(16)
            sessions[token] = form["username"].strip().lower()
            return self._redirect("/account", {"Set-Cookie": f"{_COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax"})
        if path == "/account/logout":
            return self._redirect("/", {"Set-Cookie": f"{_COOKIE}=; Path=/; Max-Age=0"})
        self._send(405, _page("Not allowed", "<p>This page does not take forms.</p>"))


# -------------------------------------------------------------------------------------- pages
def _home() -> str:
    return _page("Welcome to Larkspur Harbor", (
        "<p>The town portal of Larkspur Harbor on the Greywater coast.</p><ul>"
        '<li><a href="/wiki/">Town wiki</a>: history, places and people</li>'
        '<li><a href="/shop/">Harbor Supply</a>: the harbour shop</li>'
        '<li><a href="/ferry">Ferry timetable</a></li>'
        '<li><a href="/account">Your Harbor Supply account</a></li></ul>'))


def _search_form(value: str = "") -> str:
    return ('<form action="/wiki/search" method="get" role="search"><label>Search the wiki '
            f'<input type="search" name="q" value="{html.escape(value)}"></label> '
            '<button type="submit">Search</button></form>')


def _wiki_index() -> str:
    items = "".join(f'<li><a href="/wiki/{a.slug}">{html.escape(a.title)}</a></li>' for a in ARTICLES if a.listed)
    return _page("Town wiki", f"{_search_form()}<h2>Articles</h2><ul>{items}</ul>")


def _wiki_search(query: str) -> str:
    words = query.lower().split()
    hits = [a for a in ARTICLES if words and all(
        w in (a.title + " " + " ".join(_wiki_text(p, links=False) for p in a.body)).lower() for w in words)]
    if hits:
        results = "<ul>" + "".join(f'<li><a href="/wiki/{a.slug}">{html.escape(a.title)}</a></li>' for a in hits) + "</ul>"
    else:
        results = f"<p>No articles match {html.escape(query)!s}.</p>" if words else "<p>Type a word to search for.</p>"
    return _page("Search results", _search_form(query) + results)


def _article(article) -> str:
    body = "".join(f"<p>{_wiki_text(p, links=True)}</p>" for p in article.body)
    if article.table is not None:
        body += _table(*article.table)
    return _page(article.title, body)


def _shop(page_text: str) -> str:
    pages = -(-len(PRODUCTS) // PRODUCTS_PER_PAGE)
    page = int(page_text) if page_text.isdigit() and 1 <= int(page_text) <= pages else 1
    shown = PRODUCTS[(page - 1) * PRODUCTS_PER_PAGE: page * PRODUCTS_PER_PAGE]
    items = "".join(f'<li><a href="/shop/item/{p.item_id}">{html.escape(p.name)}</a> - {p.price}</li>' for p in shown)
    nav = []
    if page > 1:
        nav.append(f'<a href="/shop/?page={page - 1}">Previous page</a>')
    if page < pages:
        nav.append(f'<a href="/shop/?page={page + 1}">Next page</a>')
    first = (page - 1) * PRODUCTS_PER_PAGE + 1
    return _page("Harbor Supply", f'<p>Catalogue page {page} of {pages}.</p><ol start="{first}">{items}</ol>'
                                  f"<p>{' | '.join(nav)}</p>")


def _product(product) -> str:
    specs = json.dumps(dict(product.specs)).replace("</", "<\\/")
    script = ("<script>document.getElementById('show').addEventListener('click', () => {"
              f"const specs = {specs}; const box = document.getElementById('specs');"
              "box.innerHTML = '<table><tbody>' + Object.entries(specs).map(([k, v]) => "
              "'<tr><th>' + k + '</th><td>' + v + '</td></tr>').join('') + '</tbody></table>';"
              "document.getElementById('show').remove(); });</script>")
    return _page(product.name, f"<p>Price: {product.price}</p><p>{html.escape(product.blurb)}</p>"
                               '<button id="show" type="button">Show specifications</button><div id="specs"></div>'
                               f'{script}<p><a href="/shop/">Back to the catalogue</a></p>')


def _account(user: str) -> str:
    _, name, orders = ACCOUNTS[user]
    return _page("Your account", f"<p>Signed in as {html.escape(name)}.</p><h2>Orders (newest first)</h2>"
                                 + _table(("Order", "Status"), orders)
                                 + '<form method="post" action="/account/logout"><button>Sign out</button></form>')


def _login(error: bool) -> str:
    message = "<p><strong>Wrong username or password.</strong></p>" if error else ""
    return _page("Sign in", message + '<form method="post" action="/account/login">'
                 '<p><label>Username <input name="username" autocomplete="username"></label></p>'
                 '<p><label>Password <input name="password" type="password"></label></p>'
                 '<p><button type="submit">Sign in</button></p></form>')


def _ferry(destination: str | None) -> str:
    options = "".join(f"<option{' selected' if d == destination else ''}>{html.escape(d)}</option>" for d in FERRY)
    form = ('<form action="/ferry" method="get"><label>Destination <select name="to">'
            f"{options}</select></label> <button type=\"submit\">Show departures</button></form>")
    if destination in FERRY:
        rows = tuple((t, destination) for t in FERRY[destination])
        form += f"<h2>Departures to {html.escape(destination)}</h2>" + _table(("Departs", "To"), rows)
    elif destination:
        form += f"<p>There is no ferry to {html.escape(destination)}.</p>"
    return _page("Ferry timetable", form)
