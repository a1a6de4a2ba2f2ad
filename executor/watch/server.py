"""The HTTP side: a stdlib `ThreadingHTTPServer` that answers GET and HEAD, and refuses the rest.

Read-only by construction: the handler has no code path that writes to storage, and every method
other than GET and HEAD gets 405. The default bind is 127.0.0.1; binding elsewhere logs a warning,
because the dashboard shows configs, logs and outputs to whoever can reach the port. On a loopback
bind, requests whose Host header is not a loopback name are refused (a DNS-rebinding page cannot
read it). Responses carry a strict Content-Security-Policy: scripts only from this server, no CDN.
"""

from __future__ import annotations

import gzip
import ipaddress
import logging
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from executor.watch.app import DashboardApp, Response, json_response
from executor.watch.training.live_stalls import LiveStalls

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
GZIP_MIN_BYTES = 4096


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name part of a Host header (`127.0.0.1:8765` -> `127.0.0.1`, `[::1]:80` -> `[::1]`)."""
    if header.startswith("["):
        return header.split("]", 1)[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class DashboardHandler(BaseHTTPRequestHandler):
    server_version = "executor-dashboard"
    sys_version = ""
    app: DashboardApp
    loopback_only: bool

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    def _respond(self, response: Response, with_body: bool) -> None:
        body = response.body
        headers = {**SECURITY_HEADERS, **response.headers}
        if len(body) >= GZIP_MIN_BYTES and "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=5)
            headers["Content-Encoding"] = "gzip"
            headers["Vary"] = "Accept-Encoding"
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def _answer(self, with_body: bool) -> None:
        if self.loopback_only and not is_loopback(_host_name(self.headers.get("Host", ""))):
            self._respond(
                json_response({"error": "this dashboard answers only to loopback host names"}, 403), with_body
            )
            return
        parsed = urllib.parse.urlsplit(self.path)
        path = urllib.parse.unquote(parsed.path)
        query = {key: values[-1] for key, values in urllib.parse.parse_qs(parsed.query).items()}
        try:
            response = self.app.handle(path, query)
        except Exception as error:  # one bad request must not kill the server; say what broke
            logger.exception("dashboard request %s failed", self.path)
            response = json_response({"error": f"{type(error).__name__}: {error}"}, 500)
        self._respond(response, with_body)

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _refuse(self) -> None:
        response = json_response({"error": f"{self.command} is not allowed: the dashboard is read-only"}, 405)
        response.headers["Allow"] = "GET, HEAD"
        self._respond(response, with_body=True)

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _refuse  # noqa: N815


class _IPv6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def make_server(
    prefix: str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    live_ttl_s: float = 1.0,
    finished_ttl_s: float = 300.0,
) -> ThreadingHTTPServer:
    """A server for `prefix`, bound but not yet serving (port 0 picks a free port)."""
    if not is_loopback(host):
        logger.warning(
            "the dashboard is binding to %s: anyone who can reach this port can read every config, log and "
            "output under %s. Prefer the default 127.0.0.1 with an SSH tunnel.",
            host,
            prefix,
        )
    app = DashboardApp(prefix, live_ttl_s=live_ttl_s, finished_ttl_s=finished_ttl_s, stalls=LiveStalls())
    handler = type("BoundDashboardHandler", (DashboardHandler,), {"app": app, "loopback_only": is_loopback(host)})
    server_class = _IPv6Server if ":" in host else ThreadingHTTPServer
    server = server_class((host.strip("[]"), port), handler)
    server.daemon_threads = True
    return server


def serve(prefix: str, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve the dashboard for `prefix` until interrupted."""
    server = make_server(prefix, host, port)
    bound_host, bound_port = server.server_address[:2]
    logger.info("dashboard for %s at http://%s:%s/", prefix, bound_host, bound_port)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        logger.info("dashboard stopped")
    finally:
        server.server_close()


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    """Start `server` in a daemon thread (tests and benchmarks); stop it with `server.shutdown()`."""
    thread = threading.Thread(target=server.serve_forever, name="dashboard", daemon=True)
    thread.start()
    return thread
