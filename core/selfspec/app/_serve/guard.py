"""The checks every request passes before it reaches a route, and the last-resort 500.

:class:`Guard` wraps the Starlette app. In order: the ``Host`` header must name an allowed
host (400: a DNS-rebinding page's requests carry its own host name); a request with an
``Origin`` (a web page's) is refused with 403 unless ``--cors-origin`` names that origin, whose
CORS preflight it then answers; with an API key every route but ``/health`` wants it, before
routing (401 for an unknown path or a wrong method too). Anything the app raises becomes a 500
in OpenAI's error shape, said in one line on stderr, never a traceback. ``in_flight`` counts
the requests being answered (``/health`` aside), for a drain at shutdown.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Iterable
from typing import Any

from selfspec.app._serve.protocol import ApiError

Scope = dict[str, Any]
ASGIApp = Callable[..., Any]

#: request headers a page on an allowed origin may send
CORS_HEADERS = "Authorization, Content-Type"


class Guard:
    """ASGI middleware: Host, Origin (and CORS), API key, and errors, around ``app``.

    ``allowed_hosts``: host names and addresses (lower case, no port) the ``Host`` header may
    name; None or one ``*``: any. ``cors_origins``: origins (``scheme://host[:port]``) whose
    pages may call the server; ``*``: any page.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        allowed_hosts: Iterable[str] | None,
        cors_origins: Iterable[str] = (),
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.api_key = api_key
        hosts = (
            None
            if allowed_hosts is None
            else {h.strip().lower().strip("[]") for h in allowed_hosts if h.strip()}
        )
        self.allowed_hosts = None if hosts is None or "*" in hosts else frozenset(hosts)
        self.cors_origins = frozenset(
            o.strip().rstrip("/").lower() for o in cors_origins if o.strip()
        )
        self.log = log or (lambda line: None)
        self.in_flight = 0

    async def __call__(
        self, scope: Scope, receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])
        }
        origin = headers.get("origin")
        allowed_origin = origin is not None and self._origin_allowed(origin)
        started = False

        async def send_with_cors(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if allowed_origin:
                    message = {
                        **message,
                        "headers": [*message.get("headers", []), *_cors(origin, preflight=False)],
                    }
            await send(message)

        counted = scope["path"] != "/health"
        self.in_flight += counted
        try:
            refusal = self._refusal(scope, headers, origin, allowed_origin)
            if refusal is not None:
                await _send_error(send_with_cors, refusal)
                return
            if (
                scope["method"] == "OPTIONS"
                and origin is not None
                and "access-control-request-method" in headers
            ):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 204,
                        "headers": _cors(origin, preflight=True),
                    }
                )
                await send({"type": "http.response.body", "body": b""})
                return
            if self.api_key is not None and scope["path"] != "/health":
                refusal = _authorize(headers.get("authorization", ""), self.api_key)
                if refusal is not None:
                    await _send_error(send_with_cors, refusal)
                    return
            await self.app(scope, receive, send_with_cors)
        except Exception as exc:  # noqa: BLE001  (the last resort: one line on stderr, a 500 to the client)
            self.log(f"internal error on {scope['method']} {scope['path']}: {_one_line(exc)}")
            if not started:
                await _send_error(send_with_cors, internal_error())
        finally:
            self.in_flight -= counted

    def _refusal(
        self, scope: Scope, headers: dict[str, str], origin: str | None, allowed_origin: bool
    ) -> ApiError | None:
        if self.allowed_hosts is not None:
            host = _host_name(headers.get("host", ""))
            if host not in self.allowed_hosts:
                return ApiError(
                    400,
                    f"the Host header {headers.get('host', '')!r} does not name this server: "
                    "it answers to " + ", ".join(sorted(self.allowed_hosts)) + " (--allowed-hosts)",
                    code="host_not_allowed",
                )
        if origin is not None and not allowed_origin:
            return ApiError(
                403,
                f"requests from web pages of origin {origin!r} are refused; "
                "the server's --cors-origin names the origins it serves",
                code="origin_not_allowed",
            )
        return None

    def _origin_allowed(self, origin: str) -> bool:
        return "*" in self.cors_origins or origin.strip().rstrip("/").lower() in self.cors_origins


def internal_error() -> ApiError:
    return ApiError(
        500,
        "the server failed to answer this request (its log says why)",
        type="server_error",
        code="internal_error",
    )


def _authorize(given: str, api_key: str) -> ApiError | None:
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        token.strip().encode(), api_key.encode()
    ):
        return ApiError(
            401,
            "a wrong or missing API key: send Authorization: Bearer KEY (the server's --api-key)",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return None


def _host_name(host: str) -> str:
    """The host of a ``Host`` header, lower case, without the port or IPv6 brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _cors(origin: str, *, preflight: bool) -> list[tuple[bytes, bytes]]:
    out = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
    if preflight:
        out += [
            (b"access-control-allow-methods", b"GET, POST"),
            (b"access-control-allow-headers", CORS_HEADERS.encode()),
            (b"access-control-max-age", b"600"),
        ]
    else:
        out.append((b"access-control-expose-headers", b"Retry-After"))
    return out


async def _send_error(send: Callable[..., Any], error: ApiError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in error.headers.items()),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
