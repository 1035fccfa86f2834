"""Keep credentials out of everything metal_accel writes: logs, reports, exceptions, the cache.

Keys are read only by the SDKs (from the environment or their own configuration). Any text that
comes back from an SDK or a server (an error message, a response body) passes through `scrub`
before it is logged, stored or raised: the values of credential-like environment variables, any
key registered at run time, key-shaped tokens and the credentials of URLs are replaced by `[redacted]`.
`metal_accel.core.redact` builds on it for every reason the library shows or sends (environment values,
home paths, environment dumps).
"""
from __future__ import annotations

import os
import re
import threading

REDACTED = "[redacted]"
_NAME = re.compile(r"(API_KEY|AUTH_TOKEN|ACCESS_TOKEN|SECRET|PASSWORD|_TOKEN)$", re.I)
_SHAPES = re.compile(
    r"(?:sk-(?:ant-)?[A-Za-z0-9_\-]{6,})"             # OpenAI / Anthropic style keys
    r"|(?:(?<=[Bb]earer )[A-Za-z0-9_\-.=~+/]{6,})"     # bearer tokens
    r"|(?:(?<=x-api-key: )\S{6,})"
    r"|(?:(?<=api_key=)[^&\s'\"]{6,})"
    r"|(?:(?<=://)[^/\s@'\"<>]+(?=@[^\s@]))"             # user:password@ (or a token@) in a URL
)
# ?token=..., &api_key=..., &sig=... in a URL: the value of any query parameter whose name says credential
_QUERY = re.compile(r"([?&][\w.\-]*(?:token|key|secret|passw|auth|sig|credential)[\w.\-]*=)([^&#\s'\"]+)", re.I)
_MIN_SECRET = 6
_registered: set[str] = set()
_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Remember a credential value (e.g. a client's resolved key) so that `scrub` removes it."""
    if value and isinstance(value, str) and len(value) >= _MIN_SECRET:
        with _lock:
            _registered.add(value)


def _secrets() -> list[str]:
    env = [v for k, v in os.environ.items() if _NAME.search(k) and v and len(v) >= _MIN_SECRET]
    with _lock:
        found = set(env) | _registered
    return sorted(found, key=len, reverse=True)  # longest first, so a key containing another goes whole


def scrub(text: object) -> str:
    """`str(text)` with every known credential and key-shaped token replaced by [redacted]."""
    out = str(text)
    for secret in _secrets():
        if secret in out:
            out = out.replace(secret, REDACTED)
    return _QUERY.sub(lambda m: m.group(1) + REDACTED, _SHAPES.sub(REDACTED, out))


def scrub_exception(exc: BaseException, limit: int = 600) -> str:
    """A one-line, scrubbed, bounded description of an exception: 'Type: message'."""
    msg = " ".join(str(exc).split())
    if len(msg) > limit:
        msg = msg[: limit - 3] + "..."
    return scrub(f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__)
