"""What `specrt serve` refuses before a route sees a request: the browser's ways into a local server.

A server on 127.0.0.1 is reachable by every process on the machine and, through the user's browser, by every web
page they open. A page can POST a "simple" cross-origin request (text/plain, no preflight) and, after DNS
rebinding (its own host name re-pointed at 127.0.0.1), even read the answers. So (ServeGuard, an ASGI middleware):

- Host must name this server: an IP literal (a rebinding attack needs a host name it controls), `localhost`, the
  host the server was told to bind, or one given with --allowed-host. Otherwise 421.
- A request with an Origin header is refused (403) unless the origin is the server's own (same host and port as
  the Host header: a page the server itself would serve) or allowed with --cors-origin; allowed origins get CORS
  headers, and their preflight (OPTIONS) is answered, so a local web app can call the server on purpose.
- A POST must say Content-Type: application/json (415 otherwise): no form or text/plain body reaches a route,
  which takes a browser's simple request off the table even where the Origin header is missing.

The API key, where one is set, is compared in constant time (authorized).
"""

from __future__ import annotations

import hmac
import ipaddress
import json

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
CORS_METHODS = "GET, POST, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type"


def authorized(header: str | None, api_key: str | None) -> bool:
    """Whether an Authorization header carries the key (always, without one), compared in constant time."""
    if api_key is None:
        return True
    return hmac.compare_digest((header or "").encode("utf-8", "replace"), f"Bearer {api_key}".encode("utf-8"))


def host_name(host_header: str) -> str:
    """The host of a Host header, without its port ("[::1]:8000" -> "::1", "a.b:80" -> "a.b"), lower-cased."""
    host = host_header.strip().lower()
    if host.startswith("["):  # an IPv6 literal
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """The address to listen on (`--host`) is reachable from this machine only: a loopback name or IP."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ServeGuard:
    """ASGI middleware around the server's app: Host, Origin and Content-Type checks, CORS for allowed origins."""

    def __init__(self, app, bind_host: str = "127.0.0.1", allowed_hosts=(), cors_origins=()):
        self.app = app
        self.hosts = LOOPBACK_NAMES | {host_name(bind_host)} | {host_name(h) for h in allowed_hosts}
        self.origins = {o.rstrip("/").lower() for o in cors_origins}

    def host_allowed(self, host: str) -> bool:
        return is_ip_literal(host) or host in self.hosts

    def origin_allowed(self, origin: str, host_header: str) -> bool:
        """The server's own origin (a page it serves, same host and port), or one given with --cors-origin."""
        origin = origin.rstrip("/").lower()
        if "*" in self.origins or origin in self.origins:
            return True
        return origin.split("://", 1)[-1] == host_header.strip().lower()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host_header = headers.get("host", "")
        if not self.host_allowed(host_name(host_header)):
            return await _refuse(send, 421, f"Host {host_header[:100]!r} is not this server's (a loopback name or IP; "
                                            "start the server with --allowed-host NAME to allow another)",
                                 "host_not_allowed")
        origin = headers.get("origin")
        cors = {}
        if origin is not None:
            if not self.origin_allowed(origin, host_header):
                return await _refuse(send, 403, f"requests from the web page at {origin[:100]!r} are refused (start "
                                                "the server with --cors-origin ORIGIN to allow a web app)",
                                     "origin_not_allowed")
            cors = {"access-control-allow-origin": origin, "vary": "Origin"}
        method = scope["method"]
        if method == "OPTIONS" and origin is not None:  # a preflight from an allowed origin
            return await _respond(send, 204, b"", {**cors, "access-control-allow-methods": CORS_METHODS,
                                                   "access-control-allow-headers": CORS_HEADERS,
                                                   "access-control-max-age": "600"})
        if method == "POST":
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind != "application/json":
                return await _refuse(send, 415, f"Content-Type must be application/json, not {kind[:60]!r}",
                                     "unsupported_media_type", cors)
        if not cors:
            return await self.app(scope, receive, send)

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", []))
                           + [(k.encode("latin-1"), v.encode("latin-1")) for k, v in cors.items()]}
            await send(message)

        return await self.app(scope, receive, send_with_cors)


async def _refuse(send, status: int, message: str, code: str, headers: dict | None = None) -> None:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    await _respond(send, status, json.dumps(body).encode(), {"content-type": "application/json", **(headers or {})})


async def _respond(send, status: int, body: bytes, headers: dict) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in
                            {**headers, "content-length": str(len(body))}.items()]})
    await send({"type": "http.response.body", "body": body})
