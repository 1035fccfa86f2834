"""Credentials out of the HTTP stack's own log lines.

httpx logs every request's URL at INFO ("HTTP Request: POST https://user:pw@host/v1/...?token=...");
the SDKs and httpcore log requests and retries at DEBUG. A filter on those loggers (and their
children present now) scrubs each record's message before any handler sees it.
"""
from __future__ import annotations

import logging

from ..core.scrub import scrub

THIRD_PARTY = ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "anthropic")


class ScrubFilter(logging.Filter):
    """Replaces a record's message by its scrubbed rendering (credentials -> [redacted])."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is left to the handler's own error path
            return True
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


_FILTER = ScrubFilter()


def install() -> None:
    """Put the filter on the HTTP stack's loggers (idempotent; call after importing the SDKs)."""
    names = set(THIRD_PARTY) | {n for n in logging.root.manager.loggerDict
                                if n.split(".", 1)[0] in THIRD_PARTY}
    for name in names:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
