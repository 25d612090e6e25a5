"""PB_AUTH: an optional bearer key on every route, and the admin routes off unless asked for.

The key comes from `API_KEY`, or from the file named by `API_KEY_FILE` (its first line), read
once at start; a file that cannot be read stops the server. With a key set, every request must
carry `Authorization: Bearer <key>` (compared in constant time) or get a 401 in the OpenAI
shape. Without one, the generation routes are open, as upstream's are: patchbay's launcher
refuses to bind anything but loopback without a key (config: API_KEY_FILE,
ALLOW_UNAUTHENTICATED).

Upstream's routes that load or unload models (`/load_model` loads any local folder, `/reset`
unloads the model) answer 404 unless `ADMIN_KEY` / `ADMIN_KEY_FILE` is set, and then need that
key. The OpenAPI document and docs pages follow the same rule as every other route.
"""

import hmac
import os
import sys

ADMIN_PATHS = ("/load_model", "/reset")


def _read(name: str) -> str | None:
    value = os.environ.get(name)
    if value:
        return value.strip()
    path = os.environ.get(f"{name}_FILE")
    if not path:
        return None
    try:
        with open(path) as f:
            key = f.readline().strip()
    except OSError as e:
        sys.stderr.write(f"patchbay: refusing to start: PB_AUTH=1: {name}_FILE={path} cannot be read ({e.strerror})\n")
        raise SystemExit(2) from None
    if not key:
        sys.stderr.write(f"patchbay: refusing to start: PB_AUTH=1: {name}_FILE={path} is empty\n")
        raise SystemExit(2)
    return key


def _matches(header: bytes | None, key: str) -> bool:
    if not header:
        return False
    scheme, _, given = header.decode("latin-1").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode())


class Guard:
    """Pure ASGI: the key check on every HTTP request, the admin routes' own key."""

    def __init__(self, app, api_key: str | None, admin_key: str | None):
        self.app, self.api_key, self.admin_key = app, api_key, admin_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        header = dict(scope.get("headers") or []).get(b"authorization")
        path = scope.get("path", "")
        if path in ADMIN_PATHS:
            if self.admin_key is None:
                return await _send(send, 404, "Not Found", "not_found")
            if not _matches(header, self.admin_key):
                return await _send(send, 401, "this route needs the admin key (Authorization: Bearer <ADMIN_KEY>)",
                                   "invalid_api_key")
        elif self.api_key is not None and not _matches(header, self.api_key):
            message = ("missing API key: send Authorization: Bearer <key>" if not header
                       else "invalid API key")
            return await _send(send, 401, message, "invalid_api_key")
        return await self.app(scope, receive, send)


async def _send(send, status: int, message: str, code: str):
    from . import errors

    await errors.send(send, status, message, code, [(b"www-authenticate", b"Bearer")] if status == 401 else ())


def guard():
    """The middleware factory for server._outermost, keys read now (start)."""
    api_key, admin_key = _read("API_KEY"), _read("ADMIN_KEY")
    return lambda inner: Guard(inner, api_key, admin_key)
